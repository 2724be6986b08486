"""The shard set format, the hash split, and reading shards.

A shard set is a directory: ``index.json`` (feature names, classes, each split's shards with
their rows and bytes, what the conversion found, a checksum of it all) and
``<split>/shard-<part>-<n>.arrow`` files: uncompressed Arrow IPC files with float32 columns
``f0``, ``f1``... (nulls for missing values), ``y`` (the target as read) and ``row`` (the row's
position in the pinned source version). A row's split is
a hash of its key or position, so no split needs the whole table. The directory name carries the
set's identity (source, data version, target, features, split, key, shard size): an unchanged
rerun reuses it, a new data version gets new shards. Opening a set checks the index against
the files (:func:`check_shards`). Writing is :mod:`dbspec.data.shard_writing`'s.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np

from dbspec.data.sources import DataError
from dbspec.spec.sections.data import DataSpec

FORMAT = "dbspec-arrow-shards"
#: 2: one float32 column per feature (1 held them in one fixed-size list column); 3: each
#: shard's size and the index's checksum recorded, checked with the shards' rows on opening.
FORMAT_VERSION = 3
SPLITS = ("train", "validation", "test")
INDEX_FILE = "index.json"


def shard_rows(features: int, shard_size_mb: int) -> int:
    """Rows per shard for a target file size (features as float32, plus target and position)."""
    return max(1024, shard_size_mb * 2**20 // (4 * features + 16))


def shard_identity(data: DataSpec, version: str, *, where: str = "",
                   made_by: str = "arrow") -> str:
    """What the shards' content depends on, hashed: the set's directory name carries it.

    Args:
        where: The source's resolved location (two projects' ``data/events`` differ), with
            whatever else pins the rows (a Delta table's id: a table recreated at the same
            path is another table).
        made_by: ``arrow`` (one process) or ``spark`` (tasks per file): the shard boundaries
            differ, so the epochs' orders would.
    """
    streaming = data.streaming
    assert streaming is not None, "shards are made for a spec with data.streaming"
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


class BrokenShardSet(DataError):
    """A shard set whose index is unreadable or does not match its shard files."""

    def __init__(self, root: Path, problem: str):
        self.problem = f"the shard set at {root} {problem}"
        super().__init__(f"data.streaming: {self.problem}; convert the source again: "
                         "dbspec run SPEC --from load_data")


def open_shard_set(root: Path) -> ShardSet:
    """The shard set at ``root``, checked against its shard files (:func:`check_shards`).

    Raises:
        BrokenShardSet: no readable index, one of another format, or one the shards
            contradict.
    """
    path = Path(root) / INDEX_FILE
    try:
        index = json.loads(path.read_text())
    except (OSError, ValueError):
        raise BrokenShardSet(root, f"has no readable {INDEX_FILE}") from None
    if not isinstance(index, dict):
        raise BrokenShardSet(root, f"has no readable {INDEX_FILE}")
    if index.get("format") != FORMAT or index.get("format_version") != FORMAT_VERSION:
        raise BrokenShardSet(root, f"holds shards of another format ({index.get('format')} "
                                   f"v{index.get('format_version')})")
    check_shards(Path(root), index)
    return ShardSet(Path(root), index)


def index_checksum(index: dict[str, Any]) -> str:
    """The digest of an index's content (its ``checksum`` left out), recorded when written."""
    content = {key: value for key, value in index.items() if key != "checksum"}
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()


def check_shards(root: Path, index: dict[str, Any]) -> None:
    """Check the index against the shard files: each one's rows (from the Arrow file's record
    batch headers: no column is read) and size, then the index's own checksum.

    Raises:
        BrokenShardSet: the first shard, or index entry, that does not match.
    """
    import pyarrow as pa

    try:
        listed = [(str(shard["file"]), int(shard["rows"]), int(shard["bytes"]))
                  for split in SPLITS for shard in index["splits"][split]]
    except (KeyError, TypeError, ValueError, AttributeError):
        raise BrokenShardSet(root, f"has a damaged {INDEX_FILE} (its splits do not give each "
                                   "shard's file, rows and bytes)") from None
    for name, rows, size in listed:
        path = root / name
        try:
            with pa.memory_map(str(path)) as source:
                reader = pa.ipc.open_file(source)
                held = sum(reader.get_batch(i).num_rows
                           for i in range(reader.num_record_batches))
            found = path.stat().st_size
        except (OSError, pa.ArrowException) as exc:
            raise BrokenShardSet(root, f"cannot read shard {name}: {exc}") from None
        if held != rows:
            raise BrokenShardSet(root, f"does not match its {INDEX_FILE}: shard {name} holds "
                                       f"{held:,} rows, the index says {rows:,}")
        if found != size:
            raise BrokenShardSet(root, f"does not match its {INDEX_FILE}: shard {name} has "
                                       f"{found:,} bytes, the index says {size:,}")
    if index.get("checksum") != index_checksum(index):
        raise BrokenShardSet(root, f"has an {INDEX_FILE} changed since it was written (its "
                                   "checksum does not match its content)")


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


# -- reading ------------------------------------------------------------------------------

def read_shard(path: Path, width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(x, y, row)`` of a shard: features (rows, width) float32 with NaN for missing values,
    the raw target, the rows' positions.

    Raises:
        DataError: the file is missing or damaged, or of another format.
    """
    table = _feature_table(path, width)
    x = np.empty((table.num_rows, width), dtype=np.float32)
    for j in range(width):
        x[:, j] = _floats(table.column(j))
    return x, table.column("y").to_numpy(), table.column("row").to_numpy()


def read_shard_rows(path: Path, width: int, start: int, stop: int,
                    out: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``start:stop`` of a shard: their features written into ``out`` (a block of the
    caller's window: no copy of the shard of its own), their raw targets and positions
    returned (as :func:`read_shard`)."""
    table = _feature_table(path, width).slice(start, stop - start)
    for j in range(width):
        out[:, j] = _floats(table.column(j))
    return table.column("y").to_numpy(), table.column("row").to_numpy()


def _feature_table(path: Path, width: int):
    table = _shard_table(path)
    if table.schema.names[:width] != [f"f{j}" for j in range(width)]:
        raise DataError(f"data.streaming: {path} is not a shard of this format (columns "
                        f"{', '.join(table.schema.names[:4])}...); convert the source again")
    return table


def read_targets(path: Path) -> np.ndarray:
    """The raw target column of a shard (a memory map: the features are not read)."""
    return _shard_table(path).column("y").to_numpy()


def _shard_table(path: Path):
    """A shard as an Arrow table over its memory map (no copy: the files are uncompressed)."""
    import pyarrow as pa

    try:
        with pa.memory_map(str(path)) as source:
            return pa.ipc.open_file(source).read_all()
    except (OSError, pa.ArrowInvalid) as exc:
        raise DataError(f"data.streaming: cannot read shard {path}: {exc}") from None


def _floats(column) -> np.ndarray:
    """A float32 column as numpy, nulls as NaN (one copy per chunk at most)."""
    if column.num_chunks == 1 and column.null_count == 0:
        return column.chunk(0).to_numpy()
    return column.to_numpy()
