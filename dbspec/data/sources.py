"""Read a spec's data source into a pandas frame, with the version of the data that was read.

Every source kind of ``data.source`` is read here. The version (a Delta table version, a file
digest, the scikit-learn release) is resolved cheaply by :func:`resolve_version` before any
stage runs, so it can enter the plan's fingerprints, and recorded with the run.
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
    """Rows of a source as read.

    Attributes:
        frame: Every column of the source.
        version: What identifies exactly these rows (Delta version, file digest...).
        uri: Where they came from, for the run's dataset record.
    """

    frame: Any
    version: str
    uri: str


def resolve_version(data: DataSpec, *, base: Path) -> str:
    """The data version without reading the rows (cheap: metadata or a file digest)."""
    source = data.source
    if source.kind == "sklearn":
        from importlib.metadata import version

        return f"sklearn-{version('scikit-learn')}-{source.name}"
    if source.kind == "synthetic":
        params = source.model_dump(mode="json")
        if source.generator == "tabular":  # the version tabular data had before generators
            params = {k: v for k, v in params.items() if k not in ("generator", "cardinality")}
        return "synthetic-" + _digest(json.dumps(params, sort_keys=True).encode())
    if source.kind in ("csv", "parquet"):
        return f"{source.kind}-{_path_digest(_resolve(source.path, base))}"
    if source.kind == "delta":
        return f"delta-v{_open_delta(source, base).version()}"
    raise DataError(_SPARK_ONLY)


_SPARK_ONLY = ("data.source.kind 'spark_table' is read through a Spark session: run with "
               "--executor spark (or executor: spark in the spec)")


def read_source(data: DataSpec, *, base: Path) -> SourceData:
    """Read every row of the source.

    Args:
        data: The spec's data section.
        base: Directory relative paths are resolved against (the current directory).

    Raises:
        DataError: missing file or table, unreadable content.
    """
    source = data.source
    if source.kind == "sklearn":
        from sklearn import datasets

        frame = getattr(datasets, f"load_{source.name}")(as_frame=True).frame
        return SourceData(frame, resolve_version(data, base=base), f"sklearn:{source.name}")
    if source.kind == "synthetic":
        return SourceData(_synthetic(data), resolve_version(data, base=base), "synthetic")
    if source.kind == "csv":
        import pandas as pd

        path = _resolve(source.path, base)
        try:
            frame = pd.read_csv(path, sep=source.delimiter)
        except (ValueError, UnicodeDecodeError) as exc:
            raise DataError(f"data.source.path: cannot read {path} as CSV: {exc}") from None
        check_csv_header(path, source.delimiter)
        return SourceData(frame, f"csv-{_path_digest(path)}", str(path))
    if source.kind == "parquet":
        import pyarrow.parquet as pq

        path = _resolve(source.path, base)
        try:
            frame = pq.read_table(path).to_pandas()
        except Exception as exc:  # pyarrow raises several types for bad files
            raise DataError(f"data.source.path: cannot read {path} as Parquet: {exc}") from None
        return SourceData(frame, f"parquet-{_path_digest(path)}", str(path))
    if source.kind == "delta":
        table = _open_delta(source, base)
        frame = table.to_pyarrow_table().to_pandas()
        return SourceData(frame, f"delta-v{table.version()}", str(_resolve(source.path, base)))
    raise DataError(_SPARK_ONLY)


def check_csv_header(path: Path, delimiter: str) -> None:
    """pandas renames a repeated column name (``a``, ``a.1``) without a word; a feature list
    would then silently pick one of them."""
    import csv

    with open(path, newline="", encoding="utf-8", errors="replace") as handle:
        header = next(csv.reader(handle, delimiter=delimiter), [])
    repeated = sorted({name for name in header if header.count(name) > 1})
    if repeated:
        raise DataError(f"data.source.path: {path}:1: repeated column name(s) "
                        f"{', '.join(repr(name) for name in repeated)}: give every column its "
                        "own name")


def _resolve(path: str, base: Path) -> Path:
    resolved = Path(os.path.expanduser(path))
    if not resolved.is_absolute():
        resolved = base / resolved
    if not resolved.exists():
        raise DataError(f"data.source.path: {resolved} does not exist")
    return resolved


def _open_delta(source, base: Path):
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    path = _resolve(source.path, base)
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


def _digest(payload: bytes) -> str:
    return hashlib.sha256(payload).hexdigest()[:16]


def _path_digest(path: Path) -> str:
    """Content digest of a file, or of a directory's file names, sizes and times."""
    if path.is_file():
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        return digest.hexdigest()[:16]
    entries = sorted((str(p.relative_to(path)), p.stat().st_size, p.stat().st_mtime_ns)
                     for p in path.rglob("*") if p.is_file())
    return _digest(json.dumps(entries).encode())


def _synthetic(data: DataSpec):
    """Generated rows; ``generator: text`` and ``mixed`` live in :mod:`dbspec.data.synthetic`.

    The tabular path below must keep producing the same rows for the same settings: runs and
    their cached stages are keyed on them.
    """
    if data.source.generator == "text":
        from dbspec.data.synthetic import TEXT_MAX_CLASSES, generate_text

        if data.task == "regression":
            raise DataError("data.source.generator: text makes a classification corpus; use "
                            "task binary or multiclass")
        if data.source.classes > TEXT_MAX_CLASSES:
            raise DataError(f"data.source.classes: the text generator makes 2 to "
                            f"{TEXT_MAX_CLASSES} classes (every document names an actor of "
                            f"each class); got {data.source.classes}")
        return generate_text(data.source)
    if data.source.generator == "mixed":
        from dbspec.data.synthetic import generate_mixed

        return generate_mixed(data.source, data.task)
    import numpy as np
    import pandas as pd
    from sklearn.datasets import make_classification, make_regression

    source = data.source
    informative = source.informative or min(source.features, 10)
    if data.task == "regression":
        x, y = make_regression(n_samples=source.rows, n_features=source.features,
                               n_informative=informative, noise=source.noise * 100,
                               random_state=source.seed)
    else:
        x, y = make_classification(
            n_samples=source.rows, n_features=source.features, n_informative=informative,
            n_redundant=0, n_classes=source.classes, flip_y=min(source.noise, 0.5),
            n_clusters_per_class=1, random_state=source.seed)
    frame = pd.DataFrame(x.astype(np.float32), columns=[f"f{i}" for i in range(source.features)])
    frame["target"] = y.astype(np.float32 if data.task == "regression" else np.int64)
    return frame
