"""The stage cache of one run directory: each stage's files kept per fingerprint.

Layout of ``.dbspec/runs/<spec>[@target][-smoke]/``::

    state.json              the current entry of each stage ("layout": 2)
    stages/<stage>          a symlink to the current folder, ../cache/<stage>/<fingerprint>
    cache/<stage>/<fp>/     the files one run of the stage wrote at that fingerprint
    cache/<stage>/<fp>.json its entry (status done, output, last use), written when it finished

A stage whose planned fingerprint has a finished entry here is not run again (undoing a
``--set`` reuses the earlier training), except :data:`RERUN_FROM_CACHE`.

Crash safety rests on three atomic steps: a folder is complete before its ``<fp>.json`` is
written; the symlink is replaced by ``rename`` and re-pointed each time a stage is used (a kill
before ``state.json`` is repaired by the next run); eviction deletes the JSON before the folder
(a folder without JSON is never reused). All of it runs under the run directory's lock.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional

from dbspec.atomic import is_alive, remove_partial_files
from dbspec.errors import UsageError
from dbspec.paths import inside

LAYOUT = 2
KEEP_ENV = "DBSPEC_CACHE_KEEP"
DEFAULT_KEEP = 5

#: Stages whose outcome is the registry's current state (a version adopted, an alias, what is
#: served), not files: restored from the cache they would report an alias that may have moved
#: since, so they run again. Cheap, and safe: ``register`` adopts its earlier version.
RERUN_FROM_CACHE = frozenset({"register", "promote", "serve"})


def keep_from_env(environ: Mapping[str, str] = os.environ) -> int:
    """How many fingerprints of each stage a run keeps (``DBSPEC_CACHE_KEEP``, default 5).

    Raises:
        UsageError: the variable is not a whole number of at least 1.
    """
    raw = environ.get(KEEP_ENV, "").strip()
    return check_keep(raw, KEEP_ENV) if raw else DEFAULT_KEEP


def check_keep(value: Any, what: str) -> int:
    """``value`` as a keep count (>= 1: the current entry of a stage is always kept).

    Raises:
        UsageError: not a whole number, or below 1.
    """
    try:
        keep = int(str(value).strip())
    except ValueError:
        raise UsageError(f"{what}: expected a whole number of entries to keep per stage "
                         f"(at least 1), not {value!r}") from None
    if keep < 1:
        raise UsageError(f"{what}: {keep} would drop the current entries; keep at least 1 per "
                         "stage (the current one is always kept)")
    return keep


def run_dir_for(state_dir: Path, spec_name: str, target: Optional[str], smoke: bool) -> Path:
    """``<state_dir>/runs/<spec>[@target][-smoke]``."""
    name = spec_name + (f"@{target}" if target else "") + ("-smoke" if smoke else "")
    return inside(Path(state_dir) / "runs", name)


def read_state(run_dir: Path) -> dict[str, Any]:
    """``state.json`` as recorded (``{"stages": {}}`` when absent or cut short by a crash)."""
    state = _read_json(Path(run_dir) / "state.json")
    # another layout was written before the cache, by a dbspec that was never released: start
    # over, as for a file a crash cut short
    if state is not None and isinstance(state.get("stages"), dict) \
            and state.get("layout") == LAYOUT:
        return state
    return {"stages": {}}


@dataclass
class Removal:
    """One cache entry (or leftover) that eviction removed, or would remove."""

    run_dir: Path
    stage: str
    fingerprint: str
    bytes: int
    reason: str  # "evicted" (beyond the bound) | "incomplete" (no finished entry)


class StageCache:
    """The per-fingerprint stage folders of one run directory (see the module docstring)."""

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.root = self.run_dir / "cache"
        self.links = self.run_dir / "stages"

    def folder(self, name: str, fingerprint: str) -> Path:
        return inside(self.run_dir, "cache", name, fingerprint)

    def _entry_path(self, name: str, fingerprint: str) -> Path:
        return inside(self.run_dir, "cache", name, f"{fingerprint}.json")

    def holds(self, name: str, fingerprint: str) -> bool:
        """Whether the folder of ``name`` at ``fingerprint`` exists (finished or not)."""
        return self.folder(name, fingerprint).is_dir()

    def lookup(self, name: str, fingerprint: str,
               inputs: Optional[Mapping[str, str]] = None) -> Optional[dict[str, Any]]:
        """The finished entry of ``name`` at ``fingerprint``, or None; with ``inputs``, only
        one made from those upstream entries (:func:`inputs_of`: an upstream that ran again
        at its fingerprint since made a new output)."""
        entry = _read_json(self._entry_path(name, fingerprint))
        if entry is None or entry.get("status") != "done" or \
                entry.get("fingerprint") != fingerprint or not self.holds(name, fingerprint):
            return None
        made_from = entry.get("inputs") or {}
        fresh = inputs is None or all(made_from.get(d) == v for d, v in inputs.items())
        return entry if fresh else None

    def record(self, name: str, entry: dict[str, Any]) -> None:
        """Keep a finished entry (its folder must be complete: this makes it reusable)."""
        from dbspec.stages.base import write_json

        write_json(self._entry_path(name, entry["fingerprint"]), {**entry, "used": time.time()})

    def touch(self, name: str, fingerprint: str) -> None:
        """Mark an entry used now (eviction drops the least recently used first)."""
        entry = self.lookup(name, fingerprint)
        if entry is not None:
            self.record(name, entry)

    def prepare(self, name: str, fingerprint: str, *, keep_files: bool) -> Path:
        """An empty folder for a run of ``name`` (or, ``keep_files``, the one a resume
        continues), pointed at by ``stages/<name>``; any finished entry of it is dropped first."""
        folder = self.folder(name, fingerprint)
        if not keep_files:
            self._entry_path(name, fingerprint).unlink(missing_ok=True)  # before its files
            if folder.exists():
                shutil.rmtree(folder)
        folder.mkdir(parents=True, exist_ok=True)
        return self.point(name, fingerprint)

    def point(self, name: str, fingerprint: str) -> Path:
        """Make ``stages/<name>`` lead to the folder of ``fingerprint``; returns the link."""
        link = inside(self.run_dir, "stages", name)
        target = os.path.join("..", "cache", name, fingerprint)
        if link.is_symlink() and os.readlink(link) == target:
            return link
        self.links.mkdir(parents=True, exist_ok=True)
        if link.is_dir() and not link.is_symlink():
            shutil.rmtree(link)  # an old-layout folder no entry records: never reused
        temporary = self.links / f".{name}.link-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        os.symlink(target, temporary)
        os.replace(temporary, link)  # one rename: the old target or the new one, never none
        return link

    def tidy(self) -> None:
        """Remove the temporary links of writers that died while re-pointing a stage."""
        if not self.links.is_dir():
            return
        for path in self.links.glob(".*.link-*"):
            pid = path.name.rsplit(".link-", 1)[1].split("-", 1)[0]
            if not (pid.isdigit() and is_alive(int(pid))):
                path.unlink(missing_ok=True)

    def evict(self, state: Mapping[str, Any], keep: int, *,
              dry_run: bool = False) -> list[Removal]:
        """Drop, per stage, the least recently used finished entries beyond ``keep`` and the
        folders no finished entry describes. Never the current entries (those ``state.json``
        and ``stages/`` name): they count toward ``keep`` and always stay."""
        if not self.root.is_dir():
            return []
        removed = []
        current = {name: entry.get("fingerprint") for name, entry in state["stages"].items()}
        for stage_root in sorted(p for p in self.root.iterdir() if p.is_dir()):
            name = stage_root.name
            protected = {current.get(name), self._linked(name)} - {None}
            finished, incomplete = [], []
            for folder in sorted(p for p in stage_root.iterdir() if p.is_dir()):
                entry = self.lookup(name, folder.name)
                if entry is None:
                    if folder.name not in protected:
                        incomplete.append(folder.name)
                else:
                    finished.append((folder.name in protected, entry.get("used", 0.0),
                                     folder.name))
            finished.sort(reverse=True)  # the protected first, then the most recently used
            beyond = [fp for is_current, _, fp in finished[keep:] if not is_current]
            for fingerprint, reason in [(fp, "evicted") for fp in beyond] + \
                    [(fp, "incomplete") for fp in incomplete]:
                size = _size(self.folder(name, fingerprint)) + \
                    _size(self._entry_path(name, fingerprint))
                removed.append(Removal(self.run_dir, name, fingerprint, size, reason))
                if not dry_run:
                    self._entry_path(name, fingerprint).unlink(missing_ok=True)  # first
                    shutil.rmtree(self.folder(name, fingerprint), ignore_errors=True)
            if not dry_run:
                for partial in stage_root.glob(".*.json.*.partial"):  # entries a kill cut short
                    remove_partial_files(stage_root / partial.name[1:].rsplit(".", 2)[0])
                for orphan in stage_root.glob("*.json"):  # an entry whose folder is gone
                    if not (stage_root / orphan.stem).is_dir():
                        orphan.unlink(missing_ok=True)
        return removed

    def _linked(self, name: str) -> Optional[str]:
        link = self.links / name
        return Path(os.readlink(link)).name if link.is_symlink() else None


def entry_identity(entry: Optional[Mapping[str, Any]]) -> str:
    """A digest of one run of a stage: its fingerprint, output and end (a rerun at the same
    fingerprint is another run: its MLflow run, its fitted files)."""
    entry = entry or {}
    payload = {k: entry.get(k) for k in ("fingerprint", "output", "finished_at")}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()) \
        .hexdigest()[:16]


def inputs_of(depends_on: Iterable[str], stages: Mapping[str, Any]) -> dict[str, str]:
    """What a stage is made from: the identity of each upstream entry it reads."""
    return {dep: entry_identity(stages.get(dep)) for dep in depends_on}


def _read_json(path: Path) -> Optional[dict[str, Any]]:
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def _size(path: Path) -> int:
    if path.is_symlink() or path.is_file():
        return path.lstat().st_size
    if not path.is_dir():
        return 0
    return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() or p.is_symlink())
