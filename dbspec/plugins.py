"""Kinds found by name: the one place that lists what each seam of dbspec can be.

A seam (compute, data sources, promotion gates, serving targets) is a small Protocol; each
*kind* is one module implementing it. A :class:`KindRegistry` maps names to ``"module:attribute"``
and imports a kind when first asked for it. Installed packages add kinds through entry points in
the registry's group (``dbspec.compute``, ``dbspec.sources``, ``dbspec.gates``,
``dbspec.serving_targets``), e.g. ``slurm = "dbspec_slurm:KIND"``. A plugin that fails to
import is remembered, not raised at start-up: the spec naming it gets a located error.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import threading
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from dbspec.errors import DbspecError

T = TypeVar("T")
_RUN_TIME = "registered at run time"


class UnknownKind(DbspecError):
    """A kind name no built-in and no installed plugin provides (or whose plugin failed)."""


@dataclass
class KindRegistry(Generic[T]):
    """Kinds of one seam: built-ins plus the entry points of the group ``group``.

    Attributes:
        group: The entry-point group plugins register in.
        noun: How messages name one kind ("compute kind").
        builtins: Name -> ``"module:attribute"`` of the kinds dbspec ships.
    """

    group: str
    noun: str
    builtins: dict[str, str]
    #: Name -> (entry point, ``"module:attribute"`` or object; where it comes from).
    _known: dict[str, tuple[Any, str]] = field(default_factory=dict, repr=False)
    _loaded: dict[str, T] = field(default_factory=dict, repr=False)
    _failed: dict[str, str] = field(default_factory=dict, repr=False)
    _scanned: bool = field(default=False, repr=False)
    _lock: threading.RLock = field(default_factory=threading.RLock, repr=False)

    def register(self, name: str, kind: T | str, *, replace: bool = False) -> None:
        """Add a kind at run time (a notebook, a test): an object or ``"module:attribute"``."""
        with self._lock:
            self._scan()
            if name in self._known and not replace:
                raise ValueError(f"{self.noun} {name!r} is already registered "
                                 f"({self._known[name][1]}); pass replace=True to override it")
            self._known[name] = (kind, _RUN_TIME)
            self._loaded.pop(name, None)
            self._failed.pop(name, None)

    def unregister(self, name: str) -> None:
        """Remove a kind added by :meth:`register`; a built-in it replaced comes back.

        Raises:
            ValueError: ``name`` was not registered at run time (a built-in or a plugin).
        """
        with self._lock:
            self._scan()
            if self.origin(name) != _RUN_TIME:
                raise ValueError(f"{self.noun} {name!r} was not registered at run time "
                                 f"({self.origin(name)}); only such kinds can be removed")
            for table in (self._known, self._loaded, self._failed):
                table.pop(name, None)
            if name in self.builtins:
                self._known[name] = (self.builtins[name], "built-in")

    def names(self) -> tuple[str, ...]:
        """Every known name, built-ins first, without importing any kind."""
        with self._lock:
            self._scan()
            return tuple(self._known)

    def get(self, name: str) -> T:
        """The kind called ``name``, imported on first use.

        Raises:
            UnknownKind: no such kind (with the closest names), or its plugin failed to load.
        """
        with self._lock:
            self._scan()
            if name in self._loaded:
                return self._loaded[name]
            if name not in self._known:
                raise UnknownKind(self.unknown_message(name))
            try:
                kind = _resolve(self._known[name][0])
            except Exception as exc:  # a plugin's import error is the user's to read, located
                self._failed[name] = f"{type(exc).__name__}: {exc}"
                raise UnknownKind(self.failure_message(name)) from None
            self._loaded[name] = kind
            return kind

    def load_all(self) -> dict[str, T]:
        """Every kind that imports; the ones that fail are in :meth:`failures`."""
        kinds = {}
        for name in self.names():
            try:
                kinds[name] = self.get(name)
            except UnknownKind:
                continue
        return kinds

    def failures(self) -> dict[str, str]:
        """Kinds whose plugin failed to import, with the error (after :meth:`load_all`)."""
        with self._lock:
            return dict(self._failed)

    def origin(self, name: str) -> str:
        """Where a kind comes from: ``built-in`` or the entry point and its distribution."""
        with self._lock:
            self._scan()
            return self._known.get(name, (None, "unknown"))[1]

    def unknown_message(self, name: str) -> str:
        """``unknown compute kind 'x' (did you mean 'y'?); known: ...``."""
        if name in self._failed:
            return self.failure_message(name)
        close = difflib.get_close_matches(name, self.names(), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return (f"unknown {self.noun} {name!r}{hint}; known: {', '.join(self.names())} "
                f"(more come from packages registering entry points in {self.group!r})")

    def failure_message(self, name: str) -> str:
        """Why a plugin's kind cannot be used."""
        origin = self._known.get(name, (None, "unknown origin"))[1]
        return (f"{self.noun} {name!r} ({origin}) failed to load: {self._failed[name]}; fix or "
                "uninstall that package")

    def _scan(self) -> None:
        """Read the built-ins and the group's entry points, once."""
        if self._scanned:
            return
        self._scanned = True
        for name, target in self.builtins.items():
            self._known.setdefault(name, (target, "built-in"))
        for point in _entry_points().select(group=self.group):
            if point.name in self.builtins:
                continue  # a plugin cannot silently replace a built-in kind
            dist = getattr(point.dist, "name", None) or "an installed package"
            self._known.setdefault(point.name, (
                point, f"entry point {point.name} = {point.value} from {dist}"))


@functools.cache
def _entry_points() -> Any:
    """Every installed package's entry points, read once a process: one scan of the installed
    distributions serves every seam's group (a scan per group was a large part of a cold
    ``dbspec validate``)."""
    from importlib.metadata import entry_points

    return entry_points()


def _resolve(target: Any) -> Any:
    """An entry point, a ``"module:attribute"`` string, or the object itself."""
    if isinstance(target, str):
        module, _, attribute = target.partition(":")
        value: Any = importlib.import_module(module)
        for part in attribute.split(".") if attribute else ():
            value = getattr(value, part)
        return value
    if hasattr(target, "load") and hasattr(target, "group"):
        return target.load()
    return target
