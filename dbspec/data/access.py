"""The prepared data as the stages after ``preprocess`` read it: a split's targets, its
features block by block, its first rows, or a uniform sample. :class:`InMemoryData` answers
from the arrays ``load_data`` wrote; :class:`StreamedData` from a shard set, one shard at a
time, so nothing holds a whole split's features.
"""

from __future__ import annotations

from typing import Any, Iterator, Optional

import numpy as np

from dbspec.data.prepare import Splits, Table
from dbspec.data.shards import ShardSet, read_shard, read_targets
from dbspec.data.stream import _labels, split_arrays

#: Rows per block when a split is scored block by block.
BLOCK_ROWS = 262_144
SPLIT_NAMES = {"train": "train", "validation": "validation", "val": "validation",
               "test": "test"}


class InMemoryData:
    """A table and its split indices (the in-memory path)."""

    streamed = False

    def __init__(self, table: Table, splits: Splits, raw: Optional[Any] = None):
        """``raw``: with typed features, the Parquet file of the feature columns as they were
        read (strings, image bytes), row for row with the table's encoded matrix."""
        self.table, self.splits, self.raw = table, splits, raw
        self._raw_rows: Any = None  # the file, read once (the example, the dataset, the check)
        self.feature_names: list[str] = table.feature_names
        self.classes: Optional[list[Any]] = table.classes
        #: The fitted typed features that encoded the table; None when all are numeric.
        self.inputs: Optional[list[dict[str, Any]]] = table.inputs

    def raw_head(self, split: str, rows: int) -> Optional[Any]:
        """The split's first ``rows`` rows as read from the source (a DataFrame), for a model
        with typed features; None when every feature is numeric (``head`` is raw then)."""
        if self.raw is None:
            return None
        if self._raw_rows is None:
            import pyarrow.parquet as pq

            self._raw_rows = pq.read_table(self.raw)
        return self._raw_rows.take(self._rows(split)[:rows]).to_pandas()

    def _rows(self, split: str) -> np.ndarray:
        return getattr(self.splits, SPLIT_NAMES[split])

    def size(self, split: str) -> int:
        return len(self._rows(split))

    def targets(self, split: str) -> np.ndarray:
        return self.table.target[self._rows(split)]

    def blocks(self, split: str, rows: int = BLOCK_ROWS) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        index = self._rows(split)
        for start in range(0, len(index), rows):
            part = index[start:start + rows]
            yield self.table.features[part], self.table.target[part]

    def head(self, split: str, rows: int) -> np.ndarray:
        return self.table.features[self._rows(split)[:rows]]

    def sample(self, split: str, rows: int, seed: int = 0) -> np.ndarray:
        """Every row of the split (memory holds them anyway) up to ``rows``, else a sample."""
        index = self._rows(split)
        if len(index) > rows:
            index = np.sort(np.random.default_rng(seed).choice(index, rows, replace=False))
        return self.table.features[index]


class StreamedData:
    """A shard set (the streamed path); every read is one shard at a time."""

    streamed = True

    inputs = None  # streamed features are numeric

    def __init__(self, shard_set: ShardSet):
        self.shard_set = shard_set
        self.feature_names: list[str] = shard_set.feature_names
        self.classes: Optional[list[Any]] = shard_set.classes

    def raw_head(self, split: str, rows: int) -> None:
        return None  # streamed features are numeric: head() is what the model takes

    def size(self, split: str) -> int:
        return self.shard_set.rows(SPLIT_NAMES[split])

    def targets(self, split: str) -> np.ndarray:
        """The split's targets, encoded as trained, read from the shards' target column alone."""
        parts = [_labels(self.shard_set, read_targets(path))
                 for path, _ in self.shard_set.shards(SPLIT_NAMES[split])]
        if not parts:
            return np.zeros(0, dtype=np.float32 if self.classes is None else np.int64)
        return np.concatenate(parts)

    def blocks(self, split: str, rows: int = BLOCK_ROWS) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        return split_arrays(self.shard_set, SPLIT_NAMES[split], rows=rows)

    def head(self, split: str, rows: int) -> np.ndarray:
        parts, held = [], 0
        for x, _ in self.blocks(split, rows):
            parts.append(np.array(x[:rows - held]))
            held += len(parts[-1])
            if held >= rows:
                break
        width = len(self.feature_names)
        return np.concatenate(parts) if parts else np.zeros((0, width), dtype=np.float32)

    def sample(self, split: str, rows: int, seed: int = 0) -> np.ndarray:
        """A uniform sample of ``rows`` rows (all of them when the split has fewer), gathered
        in one pass over the split's shards."""
        return sample_rows(self.shard_set, SPLIT_NAMES[split], rows, seed)[0]


def sample_rows(shard_set: ShardSet, split: str, rows: int, seed: int = 0
                ) -> tuple[np.ndarray, np.ndarray]:
    """``(features, targets)`` of a uniform sample of a split, in stored order: the rows are
    drawn up front from the index's row count, then gathered shard by shard."""
    total = shard_set.rows(split)
    width = len(shard_set.feature_names)
    chosen = np.arange(total) if total <= rows else \
        np.sort(np.random.default_rng(seed).choice(total, rows, replace=False))
    xs, ys, offset = [], [], 0
    for path, count in shard_set.shards(split):
        low, high = np.searchsorted(chosen, [offset, offset + count])
        if high > low:
            x, y, _ = read_shard(path, width)
            local = chosen[low:high] - offset
            xs.append(np.array(x[local]))
            ys.append(_labels(shard_set, y[local]))
        offset += count
    if not xs:
        return np.zeros((0, width), dtype=np.float32), np.zeros(0)
    return np.concatenate(xs), np.concatenate(ys)
