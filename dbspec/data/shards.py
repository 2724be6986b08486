"""Convert a data source once into Arrow shards, one set per split, for streamed training.

A shard set is a directory: ``index.json`` (feature names, classes, the shards of each split and
their row counts, what the conversion found) and ``<split>/shard-<part>-<n>.arrow`` files, each
an uncompressed Arrow IPC file with the features as float32 columns ``f0``, ``f1``... (nulls for
missing values), ``y`` (the target as read) and ``row`` (the row's position within the pinned
source version). Every split of a row is decided here, by a hash of its key or of its position,
so a split never needs the whole table.

The conversion streams Arrow record batches, reading the next batch in a background thread
while the current one is split and written (memory stays a few batches whatever the source's
size); each batch's rows of a split are taken and appended to that split's open shard as they
are, column by column, so nothing is transposed or concatenated on the way. Readers build the
row-major feature matrix one shard at a time. Under the Spark executor the source's files are
converted by Spark tasks in parallel, each writing its own shards. A set is written under a
temporary name and renamed when complete, and its directory name carries its identity (source,
data version, target, features, split, key, shard size), so an unchanged rerun reuses it and a
new data version gets new shards.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional

import numpy as np

from dbspec.data.sources import DataError
from dbspec.errors import did_you_mean
from dbspec.spec.sections.data import DataSpec

FORMAT = "dbspec-arrow-shards"
#: 2: one float32 column per feature (1 held them in one fixed-size list column).
FORMAT_VERSION = 2
SPLITS = ("train", "validation", "test")
#: Rows per record batch read from the source.
READ_ROWS = 65_536
_INDEX = "index.json"


def shard_rows(features: int, shard_size_mb: int) -> int:
    """Rows per shard for a target file size (features as float32, plus target and position)."""
    return max(1024, shard_size_mb * 2**20 // (4 * features + 16))


def shard_identity(data: DataSpec, version: str, *, where: str = "",
                   made_by: str = "arrow") -> str:
    """What the shards' content depends on, hashed: the set's directory name carries it.

    Args:
        data: The data section.
        version: The resolved data version, with whatever else pins the rows (a Delta
            table's id: a table recreated at the same path is another table).
        where: The source's resolved location (two projects' ``data/events`` differ).
        made_by: ``arrow`` (one process) or ``spark`` (tasks per file): the shard boundaries
            differ, so the epochs' orders would.
    """
    streaming = data.streaming
    # how the version was asked for (latest, a version number, a timestamp) does not change
    # the rows: the resolved version does, so a pinned rerun reuses the latest's shards
    source = data.source.model_dump(mode="json", exclude={"version", "timestamp"})
    identity = {"format": [FORMAT, FORMAT_VERSION], "version": version, "where": where,
                "made_by": made_by, "source": source, "target": data.target,
                "features": data.feature_names, "task": data.task,
                "split": data.split.model_dump(mode="json", exclude={"stratify"}),
                "key": streaming.key, "shard_size_mb": streaming.shard_size_mb}
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class ShardSet:
    """A complete shard set, as its index describes it."""

    root: Path
    index: dict[str, Any]

    @property
    def feature_names(self) -> list[str]:
        return list(self.index["feature_names"])

    @property
    def classes(self) -> Optional[list[Any]]:
        return self.index["classes"]

    @property
    def version(self) -> str:
        return self.index["data_version"]

    def rows(self, split: str) -> int:
        """Rows in ``split``."""
        return sum(shard["rows"] for shard in self.index["splits"][split])

    def shards(self, split: str) -> list[tuple[Path, int]]:
        """``(path, rows)`` of each shard of ``split``, in the order they were written."""
        return [(self.root / shard["file"], shard["rows"])
                for shard in self.index["splits"][split]]


def open_shard_set(root: Path) -> ShardSet:
    """The shard set at ``root``.

    Raises:
        DataError: no complete set there (its index is missing or of another format).
    """
    path = Path(root) / _INDEX
    try:
        index = json.loads(path.read_text())
    except (OSError, ValueError):
        raise DataError(f"data.streaming: no complete shard set at {root} (no readable "
                        f"{_INDEX}); rerun load_data to convert the source") from None
    if index.get("format") != FORMAT or index.get("format_version") != FORMAT_VERSION:
        raise DataError(f"data.streaming: {root} holds shards of another format "
                        f"({index.get('format')} v{index.get('format_version')})")
    return ShardSet(Path(root), index)


# -- split by hash ----------------------------------------------------------------------------

def _mix(values: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: uniform 64-bit values from any 64-bit input."""
    with np.errstate(over="ignore"):
        z = values.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def split_of(keys: np.ndarray, data: DataSpec) -> np.ndarray:
    """Each row's split (0 train, 1 validation, 2 test) from its 64-bit key: a hash mixed with
    ``data.split.seed``, so the same key lands in the same split on every read and node."""
    split = data.split
    seed = _mix(np.array([split.seed], dtype=np.uint64))[0]
    unit = (_mix(keys.astype(np.uint64) ^ seed) >> np.uint64(11)).astype(np.float64) / 2.0**53
    out = np.zeros(len(keys), dtype=np.int8)
    train = 1.0 - split.validation - split.test
    out[unit >= train] = 1
    out[unit >= train + split.validation] = 2
    return out


def key_values(column) -> np.ndarray:
    """A key column as 64-bit integers: integers as they are, anything else by its digest.

    Raises:
        DataError: the key column has missing values.
    """
    import pyarrow as pa

    if column.null_count:
        raise DataError(f"data.streaming.key: {column.null_count} rows have no key value")
    if pa.types.is_integer(column.type):
        return column.to_numpy(zero_copy_only=False).astype(np.int64).view(np.uint64)
    digests = [int.from_bytes(hashlib.blake2b(str(v).encode(), digest_size=8).digest(), "little")
               for v in column.to_pylist()]
    return np.array(digests, dtype=np.uint64)


def hash_split_rows(data: DataSpec, positions: np.ndarray,
                    keys: Optional[np.ndarray] = None) -> np.ndarray:
    """The split of in-memory rows, exactly as the conversion assigns it (the in-memory path
    of a spec with ``data.streaming`` uses this, so both paths train on the same rows)."""
    return split_of(keys if keys is not None else positions.astype(np.int64), data)


# -- the conversion -------------------------------------------------------------------------

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

    from dbspec.data.prepare import _listing

    columns = list(schema.names)
    if data.target not in columns:
        raise DataError(f"data.target: no column '{data.target}'{did_you_mean(data.target, columns)}"
                        f"; the data has: {_listing(columns)}")
    key = data.streaming.key if data.streaming is not None else None
    features = data.feature_names or [c for c in columns if c not in (data.target, key)]
    missing = [c for c in features if c not in columns]
    if missing:
        raise DataError(f"data.features: no column {missing[0]!r}"
                        f"{did_you_mean(missing[0], columns)}; the data has: {_listing(columns)}")
    if not features:
        raise DataError("data.features: the data has no column besides the target")
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
    """Write the rows of ``batches`` (Arrow record batches) into ``directory/<split>/``.

    Args:
        batches: Record batches holding ``layout.columns``, in source order.
        layout: Columns and shard size.
        directory: The set being written.
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


def read_ahead(batches: Iterable, depth: int = 2, name: str = "dbspec-read-ahead") -> Iterator:
    """``batches`` produced by a background thread, ``depth`` ahead (the conversion's reader
    decodes the next batch while this one is converted; the stream's prefetch prepares the next
    window while this one trains); an error there is raised here, and closing this iterator
    stops the thread."""
    import queue
    import threading

    box: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    end = object()

    def produce() -> None:
        try:
            for batch in batches:
                while not stop.is_set():
                    try:
                        box.put(batch, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            box.put(end)
        except BaseException as exc:  # raised in the caller
            box.put(exc)

    thread = threading.Thread(target=produce, name=name, daemon=True)
    thread.start()
    try:
        while True:
            item = box.get()
            if item is end:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        while thread.is_alive():
            try:
                box.get_nowait()
            except queue.Empty:
                pass
            thread.join(timeout=0.05)


class _SplitWriter:
    """One split's open shard: record batches are appended until it holds ``rows_per_shard``
    rows, then the file is closed (renamed into place) and the next one opened."""

    def __init__(self, directory: Path, split: str, part: int, layout: Layout):
        self.directory, self.split, self.part = Path(directory), split, part
        self.limit = layout.rows_per_shard
        self.written: list[dict[str, Any]] = []
        self.writer = self.sink = self.name = None
        self.count = 0

    def add(self, rows) -> None:
        offset = 0
        while offset < rows.num_rows:
            if self.writer is None:
                self._open(rows.schema)
            take = min(self.limit - self.count, rows.num_rows - offset)
            self.writer.write_batch(rows.slice(offset, take))
            self.count += take
            offset += take
            if self.count == self.limit:
                self._close()

    def close(self) -> list[dict[str, Any]]:
        if self.writer is not None:
            self._close()
        return self.written

    def _open(self, schema) -> None:
        import pyarrow as pa

        self.name = f"{self.split}/shard-{self.part:05d}-{len(self.written):05d}.arrow"
        path = self.directory / self.name
        path.parent.mkdir(parents=True, exist_ok=True)
        self.sink = pa.OSFile(str(path) + ".partial", "wb")
        self.writer = pa.ipc.new_file(self.sink, schema)
        self.count = 0

    def _close(self) -> None:
        self.writer.close()
        self.sink.close()
        path = self.directory / self.name
        os.replace(str(path) + ".partial", path)
        self.written.append({"file": self.name, "rows": self.count})
        self.writer = self.sink = None


def write_shard(path: Path, x: np.ndarray, y: np.ndarray, rows: np.ndarray) -> None:
    """One shard file from arrays (the conversion streams batches instead; tests and tools
    build small sets with this), written under a temporary name first."""
    import pyarrow as pa

    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = [pa.array(x[:, j], mask=np.isnan(x[:, j])) for j in range(x.shape[1])]
    names = [f"f{j}" for j in range(x.shape[1])] + ["y", "row"]
    table = pa.table(arrays + [pa.array(y), pa.array(rows)], names=names)
    partial = path.with_name(path.name + ".partial")
    with pa.OSFile(str(partial), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    os.replace(partial, path)


def read_shard(path: Path, width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(x, y, row)`` of a shard: features (rows, width) float32 with NaN for missing values,
    the raw target, the rows' positions.

    Raises:
        DataError: the file is missing or damaged.
    """
    import pyarrow as pa

    try:
        with pa.memory_map(str(path)) as source:
            table = pa.ipc.open_file(source).read_all()
    except (OSError, pa.ArrowInvalid) as exc:
        raise DataError(f"data.streaming: cannot read shard {path}: {exc}") from None
    if table.schema.names[:width] != [f"f{j}" for j in range(width)]:
        raise DataError(f"data.streaming: {path} is not a shard of this format (columns "
                        f"{', '.join(table.schema.names[:4])}...); convert the source again")
    columns = [_floats(table.column(j)) for j in range(width)]
    x = np.ascontiguousarray(np.stack(columns).T) if columns else \
        np.zeros((table.num_rows, 0), dtype=np.float32)
    y = table.column("y").to_numpy()
    rows = table.column("row").to_numpy()
    return x, y, rows


def read_targets(path: Path) -> np.ndarray:
    """The raw target column of a shard alone (the features are not read).

    Raises:
        DataError: the file is missing or damaged.
    """
    import pyarrow as pa

    try:
        with pa.memory_map(str(path)) as source:
            reader = pa.ipc.open_file(source)
            index = reader.schema.get_field_index("y")
            parts = [reader.get_batch(i).column(index) for i in range(reader.num_record_batches)]
    except (OSError, pa.ArrowInvalid) as exc:
        raise DataError(f"data.streaming: cannot read shard {path}: {exc}") from None
    return pa.chunked_array(parts, type=reader.schema.field("y").type).to_numpy()


def _floats(column) -> np.ndarray:
    """A float32 column as numpy, nulls as NaN (one copy per chunk at most)."""
    if column.num_chunks == 1 and column.null_count == 0:
        return column.chunk(0).to_numpy()
    return column.to_numpy()


def finish(directory: Path, root: Path, data: DataSpec, features: list[str], tally: Tally, *,
           version: str, uri: str, identity: str) -> ShardSet:
    """Check what the conversion found, write the index and move the set into place.

    Raises:
        DataError: infinite feature values, missing or non-finite targets, a class count that
            does not fit the task (the partial set is removed).
    """
    try:
        classes = _checked(data, tally)
        index = {"format": FORMAT, "format_version": FORMAT_VERSION, "identity": identity,
                 "data_version": version, "uri": uri, "feature_names": features,
                 "target": data.target, "task": data.task, "classes": classes,
                 "rows": tally.rows, "key": data.streaming.key,
                 "splits": {split: sorted(tally.shards[split], key=lambda s: s["file"])
                            for split in SPLITS},
                 "nan_columns": {split: sorted(tally.nan_columns[split]) for split in SPLITS}}
        (directory / _INDEX).write_text(json.dumps(index, indent=1))
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    try:
        os.rename(directory, root)
    except OSError:  # another process finished the same set first: use theirs
        shutil.rmtree(directory, ignore_errors=True)
    return open_shard_set(root)


def _checked(data: DataSpec, tally: Tally) -> Optional[list[Any]]:
    from dbspec.data.prepare import _listing, _plain

    if tally.inf_columns:
        raise DataError(f"data: infinite values in {', '.join(sorted(tally.inf_columns)[:8])}")
    if tally.missing_targets:
        raise DataError(f"data.target: {tally.missing_targets} rows have no target value")
    if tally.rows == 0:
        raise DataError("data.source: the source has no rows")
    if data.task == "regression":
        if tally.nonfinite_targets:
            raise DataError("data.target: infinite target values")
        return None
    classes = sorted(_plain(c) for c in tally.classes)
    if data.task == "binary" and len(classes) != 2:
        raise DataError(f"data.task: binary needs exactly 2 target classes, found {len(classes)}"
                        f" ({_listing([str(c) for c in classes])})")
    if len(classes) < 2:
        raise DataError("data.target: only one class present")
    return classes


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
