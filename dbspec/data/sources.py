"""Read a spec's data source, through its kind, and what the source kinds share.

The version (a Delta table version, a file digest, the scikit-learn release) is resolved
cheaply by the kind's ``version`` before any stage runs, so it enters the plan's fingerprints.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dbspec.errors import DbspecError


class DataError(DbspecError):
    """The data cannot be read or does not fit the spec."""


@dataclass(frozen=True)
class SourceData:
    """Every column of a source as read (a pandas frame), what identifies exactly these rows
    (Delta version, file digest...), and where they came from (for the run's record)."""

    frame: Any
    version: str
    uri: str


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
