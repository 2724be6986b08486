"""Read a spec's data source, through its kind, and what the source kinds share.

The version (a Delta table version, a file digest, the scikit-learn release) is resolved
cheaply by :func:`resolve_version` before any stage runs, so it enters the plan's fingerprints.
"""

from __future__ import annotations

import hashlib
import json
import os
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


#: Why a source that only a Spark session can read has no version or rows here.
SPARK_ONLY = ("is read through a Spark session: run with --executor spark (or executor: spark "
              "in the spec)")


def read_source(data: DataSpec, *, base: Path) -> SourceData:
    """Every row of the source (:meth:`dbspec.seams.sources.DataSource.read`); relative
    paths are resolved against ``base``."""
    from dbspec.seams.sources import source_kind

    return source_kind(data).read(data, base=base)


def resolve_path(path: str, base: Path) -> Path:
    """``path`` made absolute against ``base``; a located error when it does not exist."""
    resolved = Path(os.path.expanduser(path))
    if not resolved.is_absolute():
        resolved = base / resolved
    if not resolved.exists():
        raise DataError(f"data.source.path: {resolved} does not exist")
    return resolved


def open_delta(source, base: Path):
    """The Delta table of a ``delta`` source at its version or timestamp."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    path = resolve_path(source.path, base)
    try:
        table = DeltaTable(str(path), version=source.version)
        if source.timestamp is not None:
            when = _as_of(source.timestamp)
            _check_after_first_commit(table, when, path)
            table.load_as_version(when)
    except DataError:
        raise
    except TableNotFoundError:
        raise DataError(f"data.source.path: {path} is not a Delta table (no _delta_log)") from None
    except Exception as exc:  # delta-rs reports a missing version or bad timestamp this way
        raise DataError(f"data.source: cannot open Delta table {path} at "
                        f"{_delta_point(source)}: {exc}") from None
    return table


def _as_of(timestamp: str):
    """An ISO-8601 timestamp as an aware datetime; one without a zone is taken as UTC."""
    from datetime import datetime, timezone

    when = datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    return when if when.tzinfo is not None else when.replace(tzinfo=timezone.utc)


def _check_after_first_commit(table, when, path: Path) -> None:
    """delta-rs reads version 0 for a timestamp before the table existed; Spark refuses it.
    dbspec refuses it too, since those rows were not there at that time."""
    from datetime import datetime, timezone

    commits = [entry["timestamp"] for entry in table.history() if "timestamp" in entry]
    if not commits:
        return
    first = datetime.fromtimestamp(min(commits) / 1000, tz=timezone.utc)
    if when < first:
        raise DataError(f"data.source.timestamp: {when.isoformat()} is before the first commit "
                        f"of the Delta table {path} (its earliest version is from "
                        f"{first.isoformat(timespec='seconds')})")


def _delta_point(source) -> str:
    if source.version is not None:
        return f"version {source.version}"
    return f"timestamp {source.timestamp}" if source.timestamp else "its latest version"


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
