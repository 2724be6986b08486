"""Read a spec's data source, through its kind, and what the source kinds share.

The version (a Delta table version, a file digest, the scikit-learn release) is resolved
cheaply by :func:`resolve_version` before any stage runs, so it enters the plan's fingerprints.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dbspec.errors import DbspecError
from dbspec.spec.sections.data import DataSpec


class DataError(DbspecError):
    """The data cannot be read or does not fit the spec."""


@dataclass(frozen=True)
class SourceData:
    """Every column of a source as read (a pandas frame), what identifies exactly these rows
    (Delta version, file digest...), and where they came from (for the run's record)."""

    frame: Any
    version: str
    uri: str


def resolve_version(data: DataSpec, *, base: Path) -> str:
    """The data version without reading the rows (cheap: metadata or a file digest)."""
    from dbspec.seams.sources import source_kind

    return source_kind(data).version(data, base=base)


def read_source(data: DataSpec, *, base: Path) -> SourceData:
    """Every row of the source (:meth:`dbspec.seams.sources.DataSource.read`); relative
    paths are resolved against ``base``."""
    from dbspec.seams.sources import source_kind

    return source_kind(data).read(data, base=base)


def resolve_path(path: str, base: Path) -> Path:
    """``path`` made absolute against ``base``; a located error when it does not exist."""
    resolved = base / Path(path).expanduser()  # an absolute path stays as it is
    if not resolved.exists():
        raise DataError(f"data.source.path: {resolved} does not exist")
    return resolved


def digest(payload: bytes) -> str:
    """A short content digest."""
    return hashlib.sha256(payload).hexdigest()[:16]


def path_digest(path: Path) -> str:
    """Content digest of a file, or of a directory's file names, sizes and times."""
    if path.is_file():
        content = hashlib.sha256()
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                content.update(block)
        return content.hexdigest()[:16]
    entries = sorted((str(p.relative_to(path)), p.stat().st_size, p.stat().st_mtime_ns)
                     for p in path.rglob("*") if p.is_file())
    return digest(json.dumps(entries).encode())
