"""Batches streamed from a shard set: rank-aware, shuffled by seed and epoch, prefetched, and
resumable in the middle of an epoch.

An epoch's plan is a pure function of (index, seed, epoch, rank, world size): the shards, in a
seeded per-epoch order, form one sequence of rows; rank ``r`` of ``w`` takes the ``r``-th of
``w`` equal ranges of it, reads it ``shuffle_window`` shard pieces at a time and permutes each
window (a torch generator seeded from seed, epoch and rank). So ranks see disjoint rows that
cover the split once, and a run resumed at batch ``k`` (the loader's whole state is
``(epoch, k)``) sees the rows the uninterrupted run would have. Every rank runs as many steps
(DDP needs it): the smallest rank's count, a rank with a row more spreading it over its
batches. On one rank with the split in one window, epoch 0 is the in-memory loop's order
(``torch.randperm`` seeded with the seed).
"""

from __future__ import annotations

import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import numpy as np

from dbspec.atomic import atomic_file
from dbspec.data.read_ahead import read_ahead
from dbspec.data.shards import ShardSet, read_shard, read_shard_rows
from dbspec.data.sources import DataError

#: The epoch/rank strides of the generator seeds (primes: (seed, epoch, rank) never collide in
#: practice, and epoch 0 of rank 0 is the seed itself).
_EPOCH_STRIDE, _RANK_STRIDE = 1_000_003, 7_919


@dataclass(frozen=True)
class StreamSettings:
    """How a split streams (the spec's ``data.streaming`` and the batch size)."""

    batch_size: int
    seed: int
    shuffle: bool = True
    window: int = 4
    prefetch: int = 1
    cache_dir: Optional[str] = None


@dataclass(frozen=True)
class EpochPlan:
    """One rank's epoch, in reading order."""

    pieces: list[tuple[Path, int, int]]  # (path, first row, end row) of each shard part read
    batch_sizes: list[int]  # rows of each batch (every rank has as many)

    @property
    def rows(self) -> int:
        return sum(stop - start for _, start, stop in self.pieces)


def epoch_plan(shards: list[tuple[Path, int]], settings: StreamSettings, *, epoch: int,
               rank: int = 0, world: int = 1) -> EpochPlan:
    """The pieces and batch sizes of ``rank`` in ``epoch`` (see the module docstring); a rank
    opens only the shards its range touches.

    Raises:
        DataError: the split has fewer rows than there are ranks.
    """
    order = list(range(len(shards)))
    if settings.shuffle:
        order = [int(i) for i in np.random.default_rng([settings.seed, epoch])
                 .permutation(len(shards))]
    total = sum(rows for _, rows in shards)
    if total < world:
        raise DataError(f"data.streaming: {total} rows to share between {world} ranks; every "
                        "rank needs at least one")
    bounds = [total * r // world for r in range(world + 1)]
    low, high = bounds[rank], bounds[rank + 1]
    pieces, offset = [], 0
    for index in order:
        path, rows = shards[index]
        start, stop = max(low, offset), min(high, offset + rows)
        if start < stop:
            pieces.append((path, start - offset, stop - offset))
        offset += rows
    narrowest = min(bounds[r + 1] - bounds[r] for r in range(world))
    steps = math.ceil(narrowest / settings.batch_size)
    if world > 1 and steps > 1 and narrowest % settings.batch_size == 1:
        # no rank gets a one-row last batch: the loop skips those under batch norm, and a step
        # one rank skips while another runs leaves DDP's all-reduce waiting forever
        steps -= 1
    return EpochPlan(pieces, _batch_sizes(high - low, steps, settings.batch_size))


def _batch_sizes(rows: int, steps: int, batch: int) -> list[int]:
    """``rows`` cut into ``steps`` batches: full batches and a remainder when that makes
    ``steps``, else as even as can be (a rank with a row more than the smallest)."""
    if steps == 0:
        return []
    if math.ceil(rows / batch) == steps:
        return [batch] * (rows // batch) + ([rows % batch] if rows % batch else [])
    base, extra = divmod(rows, steps)
    return [base + (1 if i < extra else 0) for i in range(steps)]


class StreamedSplit:
    """A split of a shard set as training batches (or, unshuffled, as scoring batches).

    Args:
        prepare: Turns a window's ``(x, y)`` numpy arrays into what batches are cut from
            (the served model's transform and the training form of the target, as tensors);
            runs in the prefetch thread.
    """

    def __init__(self, shard_set: ShardSet, split: str, settings: StreamSettings,
                 prepare: Callable[[np.ndarray, np.ndarray], tuple[Any, Any]],
                 *, rank: int = 0, world: int = 1):
        self.shard_set, self.split, self.settings = shard_set, split, settings
        self.prepare, self.rank, self.world = prepare, rank, world
        self.width = len(shard_set.feature_names)
        self.stall_seconds = 0.0  # time the consumer waited for data, summed over epochs
        self.rows_seen: Optional[list[np.ndarray]] = None  # row positions, when recording

    def plan(self, epoch: int) -> EpochPlan:
        return epoch_plan(self.shard_set.shards(self.split), self.settings, epoch=epoch,
                          rank=self.rank, world=self.world)

    def num_batches(self, epoch: int = 0) -> int:
        return len(self.plan(epoch).batch_sizes)

    def rows(self, epoch: int = 0) -> int:
        """This rank's rows in ``epoch``."""
        return self.plan(epoch).rows

    def example(self, rows: int = 2):
        """The first rows of the split, prepared (for shape checks and model graphs)."""
        path, _ = self.shard_set.shards(self.split)[0]
        x, y, _ = read_shard(self._local(path), self.width)
        return self.prepare(np.array(x[:rows]), _labels(self.shard_set, y[:rows]))

    def batches(self, epoch: int, start: int = 0) -> Iterator[tuple[Any, Any]]:
        """``(x, y)`` batches of ``epoch`` from batch ``start`` on (a mid-epoch resume)."""
        import torch

        plan = self.plan(epoch)
        sizes = plan.batch_sizes
        skip = sum(sizes[:start])
        generator = torch.Generator().manual_seed(
            self.settings.seed + _EPOCH_STRIDE * epoch + _RANK_STRIDE * self.rank)
        windows = [plan.pieces[i:i + self.settings.window]
                   for i in range(0, len(plan.pieces), self.settings.window)]
        sizes_of = [sum(stop - begin for _, begin, stop in window) for window in windows]
        first = 0
        while first < len(windows) and skip >= sizes_of[first]:
            skip -= sizes_of[first]
            first += 1
        # each window's permutation is drawn in order, one window at a time; those of the
        # windows a resume skips are drawn and dropped, so the rest come out the same
        for rows in sizes_of[:first]:
            self._permutation(rows, generator)
        orders = (self._permutation(rows, generator) for rows in sizes_of[first:])
        loaded = self._windows(windows[first:], orders)
        yield from self._cut(loaded, sizes[start:], skip)

    def _permutation(self, rows: int, generator):
        import torch

        if not self.settings.shuffle:
            return None
        return torch.randperm(rows, generator=generator)

    def _cut(self, loaded: Iterator, sizes: list[int], skip: int) -> Iterator[tuple[Any, Any]]:
        """Batches of ``sizes`` rows from the stream of windows (a batch may span two); the
        first ``skip`` rows of the first window were consumed before a resume."""
        import torch

        window_x = window_y = None
        position, first = 0, True
        for want in sizes:
            parts_x, parts_y, held = [], [], 0
            while held < want:
                if window_x is None or position >= len(window_x):
                    waited = time.perf_counter()
                    item = next(loaded, None)
                    self.stall_seconds += time.perf_counter() - waited
                    if item is None:  # the index promised more rows than the shards hold
                        raise DataError(f"data.streaming: the {self.split} shards of "
                                        f"{self.shard_set.root} hold fewer rows than their "
                                        "index says; convert the source again")
                    window_x, window_y, window_rows, order = item
                    position, first = (skip if first else 0), False
                take = min(want - held, len(window_x) - position)
                # the batch's rows gathered through the window's permutation on this thread
                # (as the in-memory loop gathers its batches), not a permuted copy of the
                # window made beforehand: one copy of each row less for the reading thread
                rows = slice(position, position + take) if order is None \
                    else order[position:position + take]
                parts_x.append(window_x[rows])
                parts_y.append(window_y[rows])
                if self.rows_seen is not None:
                    self.rows_seen.append(window_rows[rows if order is None else rows.numpy()])
                position += take
                held += take
            if len(parts_x) == 1:
                yield parts_x[0], parts_y[0]
            else:
                yield torch.cat(parts_x), torch.cat(parts_y)

    def _windows(self, windows: list, orders: Iterator) -> Iterator[tuple[Any, Any]]:
        """Prepared windows in order, read ahead by a background thread."""
        loaded = (self._load(window, order) for window, order in zip(windows, orders))
        if self.settings.prefetch == 0:
            return loaded
        return read_ahead(loaded, self.settings.prefetch, name="dbspec-prefetch")

    def _load(self, window: list[tuple[Path, int, int]], order) -> tuple[Any, Any, Any, Any]:
        """One window's rows prepared, in stored order, with their positions when they are
        being recorded (else None) and the window's permutation (None: no shuffling)."""
        import torch

        # the shards' features go straight into one window array: no copy per shard and
        # none for joining them (the prefetch thread's peak was three copies of a window)
        x = np.empty((sum(stop - start for _, start, stop in window), self.width), np.float32)
        ys, rows, offset = [], [], 0
        for path, start, stop in window:
            y, positions = read_shard_rows(self._local(path), self.width, start, stop,
                                           x[offset:offset + stop - start])
            ys.append(y)
            rows.append(positions)
            offset += stop - start
        y = ys[0] if len(ys) == 1 else np.concatenate(ys)
        # the rows' positions, recorded as batches are cut
        positions = np.concatenate(rows) if self.rows_seen is not None else None
        xt, yt = self.prepare(x, _labels(self.shard_set, y))
        yt = yt if isinstance(yt, torch.Tensor) else torch.as_tensor(yt)
        return xt, yt, positions, order

    def _local(self, path: Path) -> Path:
        """The shard itself, or its copy in the node-local cache (copied on first use)."""
        cache = self.settings.cache_dir
        if cache is None:
            return path
        local = Path(cache) / self.shard_set.root.name / path.relative_to(self.shard_set.root)
        if not local.exists():
            try:
                local.parent.mkdir(parents=True, exist_ok=True)
                with open(path, "rb") as original, atomic_file(local, durable=False) as copy:
                    shutil.copyfileobj(original, copy)
            except OSError as exc:
                raise DataError(f"data.streaming.cache_dir: cannot copy shard {path} into "
                                f"{local.parent}: {exc.strerror or exc}") from None
        return local


def _labels(shard_set: ShardSet, y: np.ndarray) -> np.ndarray:
    """Targets as trained: regression values as float32, class labels as their index."""
    classes = shard_set.classes
    if classes is None:
        return np.asarray(y, dtype=np.float32)
    return np.searchsorted(np.asarray(classes), y).astype(np.int64)


def split_arrays(shard_set: ShardSet, split: str, *, rows: int = 262_144
                 ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """``(x, y)`` numpy blocks of a split in stored order (scoring and statistics passes):
    raw features float32, targets encoded as trained (class index, regression value)."""
    width = len(shard_set.feature_names)
    for path, _ in shard_set.shards(split):
        x, y, _ = read_shard(path, width)
        for start in range(0, len(x), rows):
            yield x[start:start + rows], _labels(shard_set, y[start:start + rows])


def tensor_of(array: np.ndarray):
    """A CPU tensor over ``array`` without a copy. Shards are read-only memory maps, which
    torch warns about because a tensor could write into them; nothing here does (inputs are
    only read), so the warning is silenced rather than every block copied."""
    import warnings

    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(np.ascontiguousarray(array))
