"""What a logged model carries so that it loads anywhere: the user's network code and pins that a
package index can serve.

A ``model.custom`` class travels as an MLflow code path: its top-level package directory
(``mynet.layers:Net`` -> ``mynet/``) or single ``.py`` file (``mynet:Net`` -> ``mynet.py``), from
where this process imported it; MLflow puts the model's ``code/`` first on ``sys.path`` on load.
A class from an installed distribution becomes a requirement instead (an editable install
travels as source: its version is rarely on an index). Refused, with the reason: ``__main__``,
a compiled module, a module in ``site-packages`` no distribution provides, and a package
directory holding the working directory, an environment or dbspec's state.

dbspec travels the same way, but only the modules the served model imports (:func:`served_modules`):
a model loaded from a tracking server fetches each file of its ``code/`` one by one.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.metadata
import importlib.util
import os
import re
import shutil
import site
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Optional

from dbspec.errors import DbspecError


class PortabilityError(DbspecError):
    """The custom network's code cannot travel with the logged model."""


@dataclass(frozen=True)
class CustomCode:
    """What a custom class adds to the logged model."""

    code_paths: list[str] = field(default_factory=list)  # absolute files or directories
    requirements: list[str] = field(default_factory=list)  # pins of its distributions
    #: its module when it is part of dbspec: it travels with :func:`copy_served_code`'s modules
    dbspec_modules: list[str] = field(default_factory=list)


def installable_version(version: str) -> str:
    """``2.13.0+cpu`` -> ``2.13.0``: the local version label (PEP 440) names a build no package
    index serves; which build (CPU, CUDA) gets installed is the deployer's index's choice."""
    from packaging.version import InvalidVersion, Version

    try:
        return Version(version).public
    except InvalidVersion:
        return version.split("+", 1)[0]


def pin(distribution: str) -> str:
    """``name==version`` of an installed distribution, without a local version label."""
    return f"{distribution}=={installable_version(importlib.metadata.version(distribution))}"


def custom_code(model) -> CustomCode:
    """What the network of ``model`` (a ``ModelSpec`` or its dumped dict) needs to load elsewhere.

    Layers need nothing beyond dbspec; a custom class needs its module (or its distribution).

    Raises:
        PortabilityError: the class lives where it cannot travel (see the module's docstring).
    """
    class_path = _class_path(model)
    if not class_path:
        return CustomCode()
    module_name = class_path.partition(":")[0]
    top = module_name.split(".")[0]
    where = f"model.custom.class: {class_path}"
    if top == "__main__":
        raise PortabilityError(
            f"{where} is defined in __main__ (a script or notebook), which cannot travel with "
            "the logged model: move the class into a module file next to the spec (mynet.py) "
            "or a package, and name it as 'mynet:Net'")
    if top == "dbspec":
        return CustomCode(dbspec_modules=[module_name])
    if top in sys.stdlib_module_names or top in sys.builtin_module_names:
        return CustomCode()  # the standard library is there wherever the model loads
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise PortabilityError(f"{where}: cannot import '{module_name}': {exc}") from None
    source = _top_level_source(sys.modules[top], module, where)
    if _in_site_packages(source):
        distributions = importlib.metadata.packages_distributions().get(top)
        if not distributions:
            raise PortabilityError(
                f"{where}: '{top}' is in {source.parent}, but no installed distribution provides "
                "it, so the logged model can neither carry it nor require it: install it as a "
                "package (pip install), or keep it in your project and import it from there")
        return CustomCode(requirements=sorted({pin(d) for d in distributions}))
    _check_travels(source, where)
    return CustomCode(code_paths=[str(source)])


def _class_path(model) -> Optional[str]:
    """``model.custom.class`` of a ``ModelSpec`` or its dumped dict; None without one."""
    custom = model.get("custom") if isinstance(model, dict) else getattr(model, "custom", None)
    if not custom:
        return None
    return custom["class"] if isinstance(custom, dict) else custom.class_


def _top_level_source(top_module, module, where: str) -> Path:
    """The directory of the top-level package, or the file of a top-level module."""
    file = getattr(top_module, "__file__", None)
    portions = list(getattr(top_module, "__path__", None) or [])
    if file is None and portions:  # a namespace package: the portion that holds the module
        inner = getattr(module, "__file__", None)
        found = [Path(p) for p in portions
                 if inner is not None and Path(inner).resolve().is_relative_to(Path(p).resolve())]
        if not found:
            raise PortabilityError(f"{where}: the namespace package '{top_module.__name__}' has "
                                   "no directory that holds the class's module")
        return found[0].resolve()
    if file is None:
        raise PortabilityError(f"{where}: '{top_module.__name__}' has no source file to carry "
                               "with the logged model")
    path = Path(file).resolve()
    if not path.is_file():
        raise PortabilityError(f"{where}: '{top_module.__name__}' was imported from {file}, which "
                               "is not a file on disk (a zip or egg): install it as a package, "
                               "or unpack it into your project")
    if portions:
        return path.parent
    if path.suffix != ".py":
        raise PortabilityError(f"{where}: '{top_module.__name__}' is a compiled module "
                               f"({path.name}): only Python source travels with the logged "
                               "model; install it as a package instead")
    return path


def _site_dirs() -> list[Path]:
    paths = sysconfig.get_paths()
    dirs = [paths.get("purelib"), paths.get("platlib"), *site.getsitepackages()]
    with contextlib.suppress(Exception):
        dirs.append(site.getusersitepackages())
    return [Path(d).resolve() for d in dirs if d]


def _in_site_packages(source: Path) -> bool:
    if any(part in ("site-packages", "dist-packages") for part in source.parts):
        return True
    return any(source.is_relative_to(d) for d in _site_dirs())


def _check_travels(source: Path, where: str) -> None:
    """Refuse a package directory that would carry more than code."""
    if source.is_file():
        return
    cwd = Path.cwd().resolve()
    prefix = Path(sys.prefix).resolve()
    if cwd == source or cwd.is_relative_to(source):
        reason = f"it holds the working directory {cwd} (and dbspec's state under it)"
    elif prefix.is_relative_to(source) or any(d.is_relative_to(source) for d in _site_dirs()):
        reason = f"it holds the Python environment {prefix}"
    elif (source / ".dbspec").exists():
        reason = "it holds dbspec's state directory .dbspec"
    else:
        return
    raise PortabilityError(f"{where}: the package directory {source} cannot travel with the "
                           f"logged model: {reason}; keep the network's code in a package of its "
                           "own and run from the project root")


@contextlib.contextmanager
def travelled_code(model, code_dir: Optional[Path]) -> Iterator[None]:
    """Make the custom module that travelled in ``code_dir`` importable while a model is built.

    Only when the module cannot be imported otherwise (``mlflow.pyfunc.load_model`` has already
    put the model's ``code/`` first on ``sys.path``; ``dbspec serve`` has not, and must not put
    the model's copy of dbspec there). The directory is on ``sys.path`` only for the import.
    """
    class_path = _class_path(model)
    if class_path and code_dir is not None:
        top = class_path.partition(":")[0].split(".")[0]
        shipped = (code_dir / top).is_dir() or (code_dir / f"{top}.py").is_file()
        if shipped and top not in sys.modules and importlib.util.find_spec(top) is None:
            entry = os.fspath(code_dir)
            sys.path.insert(0, entry)
            try:
                with contextlib.suppress(ImportError):  # building the network says why
                    importlib.import_module(top)
            finally:
                with contextlib.suppress(ValueError):
                    sys.path.remove(entry)
    yield


_DBSPEC_DIR = Path(__file__).resolve().parent.parent  # the dbspec package this process runs


def served_modules(*roots: str) -> dict[str, Path]:
    """The dbspec modules ``roots`` import, transitively, and every package that holds one:
    ``{module name: source file}``.

    Read from the source, not imported: every ``import`` counts, in function bodies too (the
    served model imports lazily; an error path's import is not missed), as does
    ``importlib.import_module`` of a literal and a package's ``__init__.py``. A kind a seam's
    registry names (``"dbspec.sources.csv:SOURCE"``) travels for its spec model: only its
    module-level imports are followed (its methods train and launch, never done when serving).
    """
    found: dict[str, Path] = {}
    shallow: set[str] = set()  # found through a registry only: module-level imports followed
    pending = [(root, False) for root in roots]
    while pending:
        name, top_only = pending.pop()
        if name.split(".")[0] != "dbspec" or name in found and (top_only or name not in shallow):
            continue
        source = _module_file(name)
        if source is None:
            continue  # a class or function imported from a module, not a module
        found[name] = source
        (shallow.add if top_only else shallow.discard)(name)
        pending += [(name.rsplit(".", depth)[0], top_only)
                    for depth in range(1, name.count(".") + 1)]
        pending += _imported_names(name, source, top_only)
    return found


def copy_served_code(into: Path, roots: Iterable[str]) -> str:
    """Copy the files of :func:`served_modules` (``roots``) into ``into/dbspec``, laid out as in
    dbspec; that directory, to log as the model's code path for dbspec."""
    target = into / "dbspec"
    for source in served_modules(*roots).values():
        copy = target / source.relative_to(_DBSPEC_DIR)
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, copy)
    return str(target)


#: ``"dbspec.sources.csv:SOURCE"``: how a seam's registry names a built-in kind's module; the
#: registry imports it by name, so the copy follows these strings as it follows imports.
_KIND_TARGET = re.compile(r"^dbspec(\.[A-Za-z_][A-Za-z0-9_]*)+:[A-Za-z_][A-Za-z0-9_.]*$")


def _module_file(name: str) -> Optional[Path]:
    path = _DBSPEC_DIR.parent.joinpath(*name.split("."))
    for candidate in (path / "__init__.py", path.parent / f"{path.name}.py"):
        if candidate.is_file():
            return candidate
    return None


def _imported_names(name: str, source: Path, top_only: bool) -> Iterator[tuple[str, bool]]:
    """Every module name that ``source`` may import (and, for ``from m import x``, ``m.x``,
    which is a module or not), with whether only its module-level imports are to be followed
    (a registry's kind, or a module reached from one). ``top_only``: the module-level
    statements of ``source`` alone."""
    package = name if source.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(source.read_text(encoding="utf-8"), str(source))
    nodes = _module_level(tree) if top_only else ast.walk(tree)
    for node in nodes:
        if isinstance(node, ast.Import):
            yield from ((alias.name, top_only) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0]
                base = f"{anchor}.{base}" if base else anchor
            yield base, top_only
            yield from ((f"{base}.{alias.name}", top_only) for alias in node.names)
        elif (isinstance(node, ast.Call) and node.args
              and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            yield node.args[0].value, top_only
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and _KIND_TARGET.match(node.value):
            yield node.value.partition(":")[0], True  # a seam's built-in kind (dbspec.plugins)


def _module_level(tree: ast.Module) -> Iterator[ast.AST]:
    """What runs when the module is imported: its statements and expressions outside function
    bodies (class bodies included), without ``if TYPE_CHECKING`` blocks."""
    pending: list[ast.AST] = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            pending += node.orelse
            continue
        yield node
        pending += ast.iter_child_nodes(node)
