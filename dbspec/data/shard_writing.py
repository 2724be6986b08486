"""Write a shard set (the format is :mod:`dbspec.data.shards`').

:func:`convert_batches` runs once per conversion task (this process, or one Spark task per
source file): each batch's rows of a split go to that split's open shard, column by column,
and a :class:`Tally` notes what was seen; :func:`finish` checks the merged tallies, writes the
index and renames the set, written in a staging directory, into place.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional

import numpy as np

from dbspec.data.read_ahead import read_ahead
from dbspec.data.shards import (FORMAT, FORMAT_VERSION, INDEX_FILE, SPLITS, ShardSet,
                                index_checksum, key_values, open_shard_set, split_of)
from dbspec.data.sources import DataError
from dbspec.errors import did_you_mean
from dbspec.spec.sections.data import DataSpec

#: Rows per record batch read from the source.
READ_ROWS = 65_536


@dataclass
class Tally:
    """What one conversion task found and wrote (merged across Spark tasks)."""

    rows: int = 0
    shards: dict[str, list[dict[str, Any]]] = field(
        default_factory=lambda: {split: [] for split in SPLITS})
    classes: set = field(default_factory=set)
    missing_targets: int = 0
    nonfinite_targets: int = 0
    inf_columns: set = field(default_factory=set)
    nan_columns: dict[str, set] = field(default_factory=lambda: {s: set() for s in SPLITS})

    def merge(self, other: "Tally") -> "Tally":
        self.rows += other.rows
        for split in SPLITS:
            self.shards[split].extend(other.shards[split])
            self.nan_columns[split] |= other.nan_columns[split]
        self.classes |= other.classes
        self.missing_targets += other.missing_targets
        self.nonfinite_targets += other.nonfinite_targets
        self.inf_columns |= other.inf_columns
        return self


@dataclass(frozen=True)
class Layout:
    """The columns a conversion reads and how it writes them (sent to Spark tasks as is)."""

    features: list[str]
    target: str
    key: Optional[str]
    regression: bool
    rows_per_shard: int
    split_spec: Any  # the spec's DataSpec (for split_of)

    @property
    def columns(self) -> list[str]:
        extra = [self.key] if self.key and self.key not in self.features + [self.target] else []
        return self.features + [self.target] + extra


def check_schema(schema, data: DataSpec) -> list[str]:
    """The feature columns, checked against the source's schema as ``build_table`` checks a
    frame (same messages).

    Raises:
        DataError: a missing target, feature or key column, or a non-numeric feature.
    """
    import pyarrow as pa

    from dbspec.data.prepare import _listing, require_features, require_target

    columns = list(schema.names)
    require_target(columns, data)
    key = data.streaming.key if data.streaming is not None else None
    features = data.feature_names or [c for c in columns if c not in (data.target, key)]
    require_features(features, columns)
    if key is not None and key not in columns:
        raise DataError(f"data.streaming.key: no column '{key}'{did_you_mean(key, columns)}; "
                        f"the data has: {_listing(columns)}")
    numeric = (pa.types.is_integer, pa.types.is_floating, pa.types.is_boolean,
               pa.types.is_decimal)
    bad = [f"{c} ({schema.field(c).type})" for c in features
           if not any(test(schema.field(c).type) for test in numeric)]
    if bad:
        raise DataError(f"data.features: non-numeric columns {', '.join(bad[:8])}; "
                        "encode them before training or leave them out with data.features")
    target_type = schema.field(data.target).type
    if data.task == "regression" and not any(test(target_type) for test in numeric):
        raise DataError(f"data.target: a regression target must be numeric, "
                        f"'{data.target}' is {target_type}")
    return features


def convert_batches(batches: Iterable, layout: Layout, directory: Path, part: int,
                    first_row: int = 0, progress: Optional[Callable[[int], None]] = None
                    ) -> Tally:
    """Write the rows of ``batches`` (Arrow record batches of ``layout.columns``, in source
    order) into ``directory/<split>/``.

    Args:
        part: This task's number (in the shard file names).
        first_row: The position of the first row within the pinned version.
        progress: Called with the rows converted so far.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    writers = {split: _SplitWriter(directory, split, part, layout) for split in SPLITS}
    tally, position = Tally(), first_row
    for batch in read_ahead(batches):
        n = batch.num_rows
        if n == 0:
            continue
        columns = _feature_columns(batch, layout.features, tally)
        y = _target_column(batch.column(layout.target), layout.regression)
        tally.missing_targets += y.null_count
        if layout.regression:
            values = y.to_numpy(zero_copy_only=False)
            tally.nonfinite_targets += int(np.isinf(values).sum())
        elif y.null_count < n:
            tally.classes.update(pc.unique(y.drop_null() if y.null_count else y).to_pylist())
        positions = np.arange(position, position + n, dtype=np.int64)
        keys = key_values(batch.column(layout.key)) if layout.key else positions
        splits = split_of(keys, layout.split_spec)
        names = [f"f{j}" for j in range(len(columns))] + ["y", "row"]
        whole = pa.RecordBatch.from_arrays(columns + [y, pa.array(positions)], names=names)
        for code, split in enumerate(SPLITS):
            chosen = np.flatnonzero(splits == code)
            if len(chosen) == 0:
                continue
            rows = whole.take(pa.array(chosen))
            for j in range(len(columns)):
                if rows.column(j).null_count:
                    tally.nan_columns[split].add(layout.features[j])
            writers[split].add(rows)
        position += n
        tally.rows += n
        if progress is not None:
            progress(tally.rows)
    for split, writer in writers.items():
        tally.shards[split] = writer.close()
    return tally


def _target_column(column, regression: bool):
    """The target as shards store it: regression values as float32 and class labels as
    plain values (a dictionary-encoded column decoded, decimals as float64); NaN, like a
    null, is a missing target."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    if regression:
        column = pc.cast(column, pa.float32())
    elif pa.types.is_decimal(column.type):
        column = pc.cast(column, pa.float64())
    if pa.types.is_floating(column.type):
        values = column.to_numpy(zero_copy_only=False)
        nan = np.isnan(values)
        if nan.sum() > column.null_count:
            column = pa.array(values, mask=nan)
    return column


def _feature_columns(batch, features: list[str], tally: Tally) -> list:
    """The feature columns as float32 Arrow arrays (NaN read as missing, like a null);
    columns holding an infinite value are noted in ``tally``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    out = []
    for name in features:
        column = batch.column(name)
        if not pa.types.is_float32(column.type):
            column = pc.cast(column, pa.float32())
        values = column.to_numpy(zero_copy_only=False)  # no copy without nulls
        if not np.isfinite(values).all():  # rare: look closer only then
            if np.isinf(values).any():
                tally.inf_columns.add(name)
            if column.null_count < np.isnan(values).sum():  # NaN besides nulls: make them nulls
                column = pa.array(values, mask=np.isnan(values))
        out.append(column)
    return out


class _SplitWriter:
    """One split's open shard: record batches are appended until it holds ``rows_per_shard``
    rows, then the file is closed and the next one opened. No temporary names: the whole set
    is written in a staging directory."""

    def __init__(self, directory: Path, split: str, part: int, layout: Layout):
        self.directory, self.split, self.part = Path(directory), split, part
        self.limit = layout.rows_per_shard
        self.written: list[dict[str, Any]] = []
        self.writer: Any = None  # the open shard's IPC writer; None between shards
        self.count = 0

    def add(self, rows) -> None:
        import pyarrow as pa

        offset = 0
        while offset < rows.num_rows:
            if self.writer is None:
                name = f"{self.split}/shard-{self.part:05d}-{len(self.written):05d}.arrow"
                (self.directory / name).parent.mkdir(parents=True, exist_ok=True)
                self.writer = pa.ipc.new_file(str(self.directory / name), rows.schema)
                self.written.append({"file": name, "rows": 0})
                self.count = 0
            take = min(self.limit - self.count, rows.num_rows - offset)
            self.writer.write_batch(rows.slice(offset, take))
            self.count += take
            offset += take
            if self.count == self.limit:
                self.close()

    def close(self) -> list[dict[str, Any]]:
        if self.writer is not None:
            self.writer.close()
            self.written[-1]["rows"] = self.count
            self.written[-1]["bytes"] = (self.directory / self.written[-1]["file"]).stat().st_size
            self.writer = None
        return self.written


@dataclass(frozen=True)
class Origin:
    """Where a shard set's rows came from (the resolved data version, the source's location,
    :func:`~dbspec.data.shards.shard_identity`), as its index records it."""

    version: str
    uri: str
    identity: str


def finish(directory: Path, root: Path, data: DataSpec, features: list[str], tally: Tally,
           origin: Origin) -> ShardSet:
    """Check what the conversion found, write the index and move the set from ``directory``
    (its temporary name) to ``root``.

    Raises:
        DataError: infinite feature values, missing or non-finite targets, a class count that
            does not fit the task (the partial set is removed).
    """
    try:
        classes = _checked(data, tally)
        index = {"format": FORMAT, "format_version": FORMAT_VERSION,
                 "identity": origin.identity, "data_version": origin.version, "uri": origin.uri,
                 "feature_names": features,
                 "target": data.target, "task": data.task, "classes": classes,
                 "rows": tally.rows,
                 "key": data.streaming.key if data.streaming is not None else None,
                 "splits": {split: sorted(tally.shards[split], key=lambda s: s["file"])
                            for split in SPLITS},
                 "nan_columns": {split: sorted(tally.nan_columns[split]) for split in SPLITS}}
        index["checksum"] = index_checksum(index)
        (directory / INDEX_FILE).write_text(json.dumps(index, indent=1))
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    try:
        os.rename(directory, root)
    except OSError:  # another process finished the same set first: use theirs
        shutil.rmtree(directory, ignore_errors=True)
    return open_shard_set(root)


def _checked(data: DataSpec, tally: Tally) -> Optional[list[Any]]:
    from dbspec.data.prepare import _plain, check_classes

    if tally.inf_columns:
        raise DataError(f"data: infinite values in {', '.join(sorted(tally.inf_columns)[:8])}")
    if tally.missing_targets:
        raise DataError(f"data.target: {tally.missing_targets} rows have no target value")
    if tally.rows == 0:
        raise DataError("data.source: the source has no rows")
    if data.task != "regression":
        return check_classes(sorted(_plain(c) for c in tally.classes), data)
    if tally.nonfinite_targets:
        raise DataError("data.target: infinite target values")
    return None


#: A conversion's temporary directory untouched this long was left by a killed conversion.
STALE_PARTIAL_SECONDS = 24 * 3600


def partial_dir(location: Path, identity: str) -> Path:
    """A fresh temporary directory beside the set's final place; those a killed conversion
    left (untouched for :data:`STALE_PARTIAL_SECONDS`) are removed first.

    Raises:
        DataError: the location cannot be written.
    """
    import time

    try:
        for stale in location.glob(".partial-*"):
            if time.time() - stale.stat().st_mtime > STALE_PARTIAL_SECONDS:
                shutil.rmtree(stale, ignore_errors=True)
        path = location / f".partial-{identity}-{uuid.uuid4().hex[:8]}"
        path.mkdir(parents=True)
    except OSError as exc:
        raise DataError(f"data.streaming.location: cannot write shards under {location}: "
                        f"{exc.strerror or exc}") from None
    return path


def record_batches(dataset, columns: list[str]) -> Iterator:
    """A dataset's record batches in order, with little read-ahead (memory stays bounded)."""
    return dataset.to_batches(columns=columns, batch_size=READ_ROWS, batch_readahead=1,
                              fragment_readahead=1, use_threads=False)
