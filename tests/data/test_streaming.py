"""Streamed data (``data.streaming``): conversion into shards, the hash split, the epoch reader
(ranks, seeds, resume, prefetch, cache), the one-pass statistics and the spec checks.

Everything runs on real Delta tables and real shard sets in ``tmp_path``. The stream tests use
a feature ``ident`` equal to the row's position (and a target ``y = -ident``), so a batch's
rows can be checked against the positions the reader records.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch

from dbspec.data.access import sample_rows
from dbspec.data.convert import convert_source, count_rows, decide
from dbspec.seams.sources import source_kind
from dbspec.data.prepare import build_table, fit_preprocessing
from dbspec.data.shard_writing import (Layout, Origin, Tally, check_schema, convert_batches,
                                       finish, partial_dir)
from dbspec.data.shards import hash_split_rows, key_values, read_shard, split_of
from dbspec.data.sources import DataError
from dbspec.data.statistics import fit_streamed
from dbspec.data.stream import StreamedSplit, StreamSettings
from dbspec.spec.sections.data import DataSpec
from tests.conftest import MINIMAL, run_main


# -- helpers ----------------------------------------------------------------------------------

def data_spec(path: Path | str = "table", **overrides) -> DataSpec:
    """A regression spec over a Delta table, streamed; ``overrides`` replace top-level keys."""
    base = {"source": {"kind": "delta", "path": str(path)}, "task": "regression",
            "target": "y", "features": ["ident", "a", "b"], "streaming": {"enabled": True}}
    return DataSpec.model_validate({**base, **overrides})


def rows_table(n: int, seed: int = 0) -> pa.Table:
    """``n`` rows: ``ident`` (the row's position), features a, b, c (float32), a 0/1 label,
    a string ID and the target ``y = -ident``."""
    rng = np.random.default_rng(seed)
    ident = np.arange(n, dtype=np.float32)
    return pa.table({
        "ident": ident,
        "a": rng.normal(5, 2, n).astype(np.float32),
        "b": rng.normal(-1, 0.5, n).astype(np.float32),
        "c": rng.exponential(3, n).astype(np.float32),
        "label": (rng.random(n) < 0.4).astype(np.int64),
        "id": pa.array([f"user-{i}" for i in range(n)]),
        "y": -ident.astype(np.float64),
    })


def write_delta(path: Path, table: pa.Table, pieces: int = 3) -> Path:
    """``table`` as a Delta table written in ``pieces`` appends (one file and version each)."""
    from deltalake import write_deltalake

    bounds = np.linspace(0, table.num_rows, pieces + 1).astype(int)
    for index, (low, high) in enumerate(zip(bounds, bounds[1:])):
        write_deltalake(str(path), table.slice(low, high - low),
                        mode="append" if index else "error")
    return path


def convert(data: DataSpec, location: Path, say=None):
    """The shard set of ``data``'s source under ``location`` (converted or found)."""
    opened = source_kind(data).open(data, base=location.parent)
    return convert_source(data, opened, location, say=say or (lambda line: None))


def handmade_set(location: Path, table: pa.Table, data: DataSpec, rows_per_shard: int,
                 cuts: tuple[int, ...] = ()):
    """A shard set written by ``convert_batches`` with a small shard size, one conversion task
    per range of ``cuts`` (as Spark tasks write them: each task's last shard is short, so the
    shards have unequal sizes)."""
    features = check_schema(table.schema, data)
    layout = Layout(features, data.target, data.streaming.key, data.task == "regression",
                    rows_per_shard, data)
    directory = partial_dir(location, "handmade")
    tally, bounds = Tally(), [0, *cuts, table.num_rows]
    for part, (low, high) in enumerate(zip(bounds, bounds[1:])):
        batches = table.slice(low, high - low).to_batches(max_chunksize=700)
        tally.merge(convert_batches(batches, layout, directory, part, first_row=low))
    return finish(directory, location / "shards-handmade", data, features, tally,
                  Origin(version="handmade", uri=str(location), identity="handmade"))


def stream_set(tmp_path: Path, rows: int = 5000, rows_per_shard: int = 400,
               cuts: tuple[int, ...] = (1700,)):
    """A regression shard set of ``rows`` rows for the reader tests."""
    return handmade_set(tmp_path / "shards", rows_table(rows), data_spec(), rows_per_shard, cuts)


def as_tensors(x: np.ndarray, y: np.ndarray):
    """The reader's ``prepare``: the raw arrays as tensors, unchanged."""
    return torch.from_numpy(np.array(x)), torch.from_numpy(np.array(y))


def reader(shard_set, *, batch_size: int = 128, seed: int = 7, rank: int = 0, world: int = 1,
           **settings) -> StreamedSplit:
    return StreamedSplit(shard_set, "train", StreamSettings(batch_size=batch_size, seed=seed,
                                                            **settings),
                         as_tensors, rank=rank, world=world)


def read_epoch(split: StreamedSplit, epoch: int = 0, start: int = 0):
    """``(batches, recorded row positions)`` of one epoch from batch ``start`` on."""
    split.rows_seen = []
    batches = list(split.batches(epoch, start))
    seen = np.concatenate(split.rows_seen) if split.rows_seen else np.zeros(0, np.int64)
    return batches, seen


def idents(batches) -> np.ndarray:
    """The ``ident`` feature (= row position) of every row of ``batches``, in order."""
    if not batches:
        return np.zeros(0, np.int64)
    return torch.cat([x[:, 0] for x, _ in batches]).numpy().astype(np.int64)


def stored_positions(shard_set, split: str = "train") -> np.ndarray:
    """The row positions of ``split``, in stored order."""
    width = len(shard_set.feature_names)
    return np.concatenate([read_shard(path, width)[2] for path, _ in shard_set.shards(split)])


def drain(iterator, timeout: float = 60):
    """Every item of ``iterator``, consumed in a thread: a reader that hangs fails the test
    instead of hanging it; an exception the reader raises is raised here."""
    result: dict = {}

    def consume():
        try:
            result["items"] = list(iterator)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            result["error"] = exc

    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), f"the reader still ran after {timeout} s"
    if "error" in result:
        raise result["error"]
    return result["items"]


def assert_same_batches(first, second) -> None:
    assert len(first) == len(second)
    for (x1, y1), (x2, y2) in zip(first, second):
        assert torch.equal(x1, x2) and torch.equal(y1, y2)


# -- 1. ranks -------------------------------------------------------------------------------

@pytest.mark.parametrize("world, rows_per_shard, cuts", [
    (2, 400, (1700,)),  # many shards of unequal sizes (each task's last one is short)
    (3, 400, (1700, 2900)),
    (3, 2500, (1700,)),  # two training shards (~1,000 and ~2,000 rows) for three ranks
    (2, 100_000, ()),  # one training shard for two ranks
], ids=["world2", "world3", "fewer-shards-than-ranks", "one-shard"])
def test_ranks_read_disjoint_rows_that_cover_the_split_once(tmp_path, world, rows_per_shard,
                                                            cuts):
    shard_set = stream_set(tmp_path, rows_per_shard=rows_per_shard, cuts=cuts)
    sizes = [rows for _, rows in shard_set.shards("train")]
    if rows_per_shard == 400:
        assert len(set(sizes)) > 1  # unequal shards, as the case says
    else:
        assert len(sizes) < world
    seen, steps = [], []
    for rank in range(world):
        split = reader(shard_set, batch_size=128, rank=rank, world=world, window=2)
        batches, positions = read_epoch(split, epoch=1)
        steps.append(split.num_batches(1))
        assert len(batches) == split.num_batches(1)
        assert sum(len(x) for x, _ in batches) == split.rows(1) == len(positions)
        assert all(len(x) > 0 for x, _ in batches)
        # the recorded positions are the rows the batches hold, in the same order
        assert np.array_equal(idents(batches), positions)
        targets = torch.cat([y for _, y in batches])
        assert targets.dtype == torch.float32  # regression targets as trained
        assert torch.equal(targets, -torch.cat([x[:, 0] for x, _ in batches]))
        seen.append(positions)
    assert len(set(steps)) == 1, f"ranks run different step counts: {steps}"
    everything = np.concatenate(seen)
    assert len(np.unique(everything)) == len(everything)  # disjoint, no row twice
    assert np.array_equal(np.sort(everything), np.sort(stored_positions(shard_set)))
    assert len(everything) == shard_set.rows("train")


def test_batch_size_one_with_ranks_of_unequal_rows(tmp_path):
    """Ranks whose row counts differ by one still run the same number of steps and read every
    row once (with batch size 1 the smaller rank has one step without a row)."""
    shard_set = stream_set(tmp_path, rows=200, rows_per_shard=40, cuts=())
    total = shard_set.rows("train")
    world = 2 if total % 2 else 3
    assert total % world  # the ranks' row counts differ
    seen, steps = [], []
    for rank in range(world):
        split = reader(shard_set, batch_size=1, rank=rank, world=world)
        batches, positions = read_epoch(split)
        assert len(batches) == split.num_batches(0)
        steps.append(len(batches))
        seen.append(idents(batches))
    assert len(set(steps)) == 1
    everything = np.concatenate(seen)
    assert np.array_equal(np.sort(everything), np.sort(stored_positions(shard_set)))


# -- 2. determinism -----------------------------------------------------------------------

def test_same_seed_and_epoch_give_the_same_batches_and_others_do_not(tmp_path):
    shard_set = stream_set(tmp_path)
    first, _ = read_epoch(reader(shard_set, seed=7, window=2), epoch=3)
    again, _ = read_epoch(reader(shard_set, seed=7, window=2), epoch=3)
    assert_same_batches(first, again)
    order = idents(first)
    other_epoch = idents(read_epoch(reader(shard_set, seed=7, window=2), epoch=4)[0])
    other_seed = idents(read_epoch(reader(shard_set, seed=8, window=2), epoch=3)[0])
    for other in (other_epoch, other_seed):
        assert not np.array_equal(order, other)  # another order ...
        assert np.array_equal(np.sort(order), np.sort(other))  # ... of the same rows
    assert not np.array_equal(order, stored_positions(shard_set))  # shuffled at all


def test_without_shuffle_rows_come_in_stored_order(tmp_path):
    shard_set = stream_set(tmp_path)
    for epoch in (0, 5):
        batches, positions = read_epoch(reader(shard_set, shuffle=False, window=2), epoch)
        assert np.array_equal(idents(batches), stored_positions(shard_set))
        assert np.array_equal(positions, stored_positions(shard_set))


# -- 3. mid-epoch resume ------------------------------------------------------------------

def _resume_points(split: StreamedSplit, epoch: int) -> dict[str, list[int]]:
    """The batch numbers where a resume starts inside a window or on a window's boundary, and
    the batches that span two windows."""
    plan = split.plan(epoch)
    window = split.settings.window
    window_rows = [sum(stop - start for _, start, stop in plan.pieces[i:i + window])
                   for i in range(0, len(plan.pieces), window)]
    window_ends = set(np.cumsum(window_rows)[:-1].tolist())
    batch_starts = np.concatenate([[0], np.cumsum(plan.batch_sizes)])
    points: dict[str, list[int]] = {"boundary": [], "inside": [], "spanning": []}
    for k in range(1, len(plan.batch_sizes)):
        skip = int(batch_starts[k])
        points["boundary" if skip in window_ends else "inside"].append(k)
    for k, (low, high) in enumerate(zip(batch_starts, batch_starts[1:])):
        if any(low < end < high for end in window_ends):
            points["spanning"].append(k)
    return points


@pytest.mark.parametrize("rank, world", [(0, 1), (1, 2)])
def test_resume_mid_epoch_gives_the_tail_of_the_epoch(tmp_path, rank, world):
    shard_set = stream_set(tmp_path, rows=5000, rows_per_shard=400, cuts=())
    split = reader(shard_set, batch_size=200, window=2, rank=rank, world=world)
    full, _ = read_epoch(split, epoch=2)
    points = _resume_points(split, 2)
    assert points["inside"] and points["spanning"], points
    if world == 1:  # rank 1 of 2 starts inside a shard: its windows end between batches
        assert points["boundary"], points
    for k in range(len(full) + 1):
        tail, _ = read_epoch(reader(shard_set, batch_size=200, window=2, rank=rank,
                                    world=world), epoch=2, start=k)
        assert_same_batches(tail, full[k:])


def test_resume_mid_epoch_records_the_rows_of_the_tail(tmp_path):
    """``rows_seen`` of a resumed epoch are the positions of the rows it yields: the tail of
    the uninterrupted epoch's positions (not the skipped rows of its first window)."""
    shard_set = stream_set(tmp_path, rows=5000, rows_per_shard=400, cuts=())
    split = reader(shard_set, batch_size=200, window=2)
    full, positions = read_epoch(split, epoch=2)
    starts = np.concatenate([[0], np.cumsum([len(x) for x, _ in full])])
    points = _resume_points(split, 2)
    for k in sorted(points["boundary"] + points["inside"]):
        tail, seen = read_epoch(reader(shard_set, batch_size=200, window=2), epoch=2, start=k)
        assert np.array_equal(idents(tail), positions[starts[k]:])  # the batches are right
        assert np.array_equal(seen, positions[starts[k]:]), \
            f"resumed at batch {k}: recorded {len(seen)} rows, yielded {len(positions) - starts[k]}"


# -- 4. prefetch --------------------------------------------------------------------------

def test_prefetch_does_not_change_the_batches(tmp_path):
    shard_set = stream_set(tmp_path)
    on_demand, seen_0 = read_epoch(reader(shard_set, prefetch=0, window=2), epoch=1)
    ahead, seen_2 = read_epoch(reader(shard_set, prefetch=2, window=2), epoch=1)
    assert_same_batches(on_demand, ahead)
    assert np.array_equal(seen_0, seen_2)


def test_a_reader_left_early_stops_reading_ahead(tmp_path):
    """A loop that stops mid-epoch (a pause, an error) leaves no prefetch thread behind."""
    shard_set = stream_set(tmp_path)
    batches = reader(shard_set, prefetch=2, window=1).batches(0)
    next(batches)
    batches.close()
    alive = [thread for thread in threading.enumerate()
             if thread.name == "dbspec-prefetch" and thread.is_alive()]
    assert alive == []


@pytest.mark.parametrize("prefetch", [0, 1, 2])
def test_a_missing_shard_is_a_data_error_naming_it(tmp_path, prefetch):
    shard_set = stream_set(tmp_path)
    split = reader(shard_set, prefetch=prefetch, window=2)
    plan = split.plan(0)
    lost = plan.pieces[4][0]  # in the third window: the reader has yielded batches by then
    lost.unlink()
    batches = split.batches(0)
    assert next(batches) is not None
    with pytest.raises(DataError, match=rf"cannot read shard .*{re.escape(lost.name)}"):
        drain(batches)


# -- 5. node-local cache ------------------------------------------------------------------

def test_a_cache_dir_gives_the_same_batches_and_holds_copies(tmp_path):
    shard_set = stream_set(tmp_path)
    cache = tmp_path / "cache"
    plain, _ = read_epoch(reader(shard_set, window=2), epoch=1)
    cached, _ = read_epoch(reader(shard_set, window=2, cache_dir=str(cache)), epoch=1)
    assert_same_batches(plain, cached)
    for path, _ in shard_set.shards("train"):
        copy = cache / shard_set.root.name / path.relative_to(shard_set.root)
        assert copy.read_bytes() == path.read_bytes()
    assert not list(cache.rglob("*.partial"))
    # a second read uses the copies: the originals can go
    for path, _ in shard_set.shards("train"):
        path.unlink()
    again, _ = read_epoch(reader(shard_set, window=2, cache_dir=str(cache)), epoch=1)
    assert_same_batches(plain, again)


def test_a_missing_shard_with_a_cache_dir_is_a_data_error_naming_it(tmp_path):
    shard_set = stream_set(tmp_path)
    split = reader(shard_set, window=2, cache_dir=str(tmp_path / "cache"))
    lost = split.plan(0).pieces[4][0]
    lost.unlink()
    with pytest.raises(DataError, match=re.escape(lost.name)):
        drain(split.batches(0))


# -- 6. data versions ---------------------------------------------------------------------

def test_a_new_delta_version_gets_new_shards_and_an_unchanged_one_reuses_them(tmp_path):
    path = write_delta(tmp_path / "table", rows_table(3000))
    data = data_spec(path)
    location = tmp_path / "shards"
    first = convert(data, location)
    assert first.version == "delta-v2" and first.index["rows"] == 3000
    said: list[str] = []
    again = convert(data, location, say=said.append)
    assert again.root == first.root
    assert any(f"reusing the shards of delta-v2 at {first.root}" in line for line in said), said
    from deltalake import write_deltalake

    write_deltalake(str(path), rows_table(500, seed=1), mode="append")
    said.clear()
    newer = convert(data, location, say=said.append)
    assert newer.root != first.root
    assert newer.version == "delta-v3" and newer.index["rows"] == 3500
    assert not any("reusing" in line for line in said)
    assert first.index["rows"] == 3000 and (first.root / "index.json").exists()  # kept


def test_pinning_the_old_version_reuses_its_shards(tmp_path):
    """A spec pinned to version 2 reads the rows the latest (then version 2) read: same data
    version, same shards."""
    from deltalake import write_deltalake

    path = write_delta(tmp_path / "table", rows_table(3000))
    location = tmp_path / "shards"
    first = convert(data_spec(path), location)
    write_deltalake(str(path), rows_table(500, seed=1), mode="append")
    said: list[str] = []
    pinned = convert(data_spec(path, source={"kind": "delta", "path": str(path), "version": 2}),
                     location, say=said.append)
    assert pinned.version == "delta-v2" and pinned.index["rows"] == 3000
    assert pinned.root == first.root, "the same data version was converted a second time"
    assert any("reusing the shards of delta-v2" in line for line in said)


# -- 7. the hash split --------------------------------------------------------------------

def test_the_shards_split_rows_as_hash_split_rows_does(tmp_path):
    n = 4000
    data = data_spec(write_delta(tmp_path / "table", rows_table(n)),
                     split={"validation": 0.15, "test": 0.25, "seed": 3})
    shard_set = convert(data, tmp_path / "shards")
    codes = hash_split_rows(data, np.arange(n))
    for code, split in enumerate(("train", "validation", "test")):
        assert shard_set.rows(split) == int((codes == code).sum())
        assert np.array_equal(np.sort(stored_positions(shard_set, split)),
                              np.flatnonzero(codes == code))
    assert abs(shard_set.rows("test") / n - 0.25) < 0.03  # the fractions hold


def _split_by_ident(shard_set) -> dict[int, int]:
    width = len(shard_set.feature_names)
    column = shard_set.feature_names.index("ident")
    found = {}
    for code, split in enumerate(("train", "validation", "test")):
        for path, _ in shard_set.shards(split):
            for ident in read_shard(path, width)[0][:, column].astype(np.int64):
                found[int(ident)] = code
    return found


def test_a_key_keeps_each_row_in_its_split_when_the_row_order_changes(tmp_path):
    n = 3000
    table = rows_table(n)
    shuffled = table.take(np.random.default_rng(1).permutation(n))
    in_order = write_delta(tmp_path / "in_order", table)
    reordered = write_delta(tmp_path / "reordered", shuffled, pieces=2)
    location = tmp_path / "shards"
    keyed = {"enabled": True, "key": "id"}
    before = _split_by_ident(convert(data_spec(in_order, streaming=keyed), location))
    after = _split_by_ident(convert(data_spec(reordered, streaming=keyed), location))
    assert len(before) == len(after) == n
    assert before == after
    expected = split_of(key_values(table.column("id").combine_chunks()),
                        data_spec(in_order, streaming=keyed))
    assert [before[i] for i in range(n)] == expected.tolist()
    # without a key the split follows positions, which the new order moved
    by_position = _split_by_ident(convert(data_spec(reordered), location))
    moved = sum(by_position[i] != before[i] for i in range(n))
    assert moved > n // 10


# -- 8. conversion errors -----------------------------------------------------------------

def _with(table: pa.Table, name: str, values) -> pa.Table:
    return table.set_column(table.schema.get_field_index(name), name, values)


def _infinite(table):
    b = table.column("b").to_numpy().copy()
    b[2500] = np.inf
    return _with(table, "b", pa.array(b))


def _targets_missing(table):
    y = table.column("y").to_pylist()
    for row in (10, 1500, 2990):
        y[row] = None
    return _with(table, "y", pa.array(y, pa.float64()))


def _three_classes(table):
    label = table.column("label").to_numpy().copy()
    label[2900] = 2
    return _with(table, "label", pa.array(label))


def _keys_missing(table):
    ids = table.column("id").to_pylist()
    ids[2800] = ids[2950] = None
    return _with(table, "id", pa.array(ids, pa.string()))


@pytest.mark.parametrize("change, overrides, message", [
    (None, {"target": "lable"},
     r"data\.target: no column 'lable' \(did you mean 'label'\?\); the data has: ident, a, b"),
    (None, {"features": ["a", "bb"]},
     r"data\.features: no column 'bb' \(did you mean 'b'\?\); the data has: ident, a, b"),
    (None, {"features": ["a", "id"]},
     r"data\.features: non-numeric columns id \((large_)?string(_view)?\); encode them"),
    (_infinite, {}, r"data: infinite values in b$"),
    (_targets_missing, {}, r"data\.target: 3 rows have no target value"),
    (_three_classes, {"task": "binary", "target": "label"},
     r"data\.task: binary needs exactly 2 target classes, found 3 \(0, 1, 2\)"),
    (_keys_missing, {"streaming": {"enabled": True, "key": "id"}},
     r"data\.streaming\.key: 2 rows have no key value"),
    (lambda table: table.slice(0, 0), {}, r"data\.source: the source has no rows"),
], ids=["target", "feature", "non-numeric", "infinite", "missing-target", "binary-3-classes",
        "key-nulls", "empty"])
def test_conversion_errors_leave_no_shards(tmp_path, change, overrides, message):
    table = rows_table(3000)
    if change is not None:
        table = change(table)
    path = tmp_path / "table"
    if table.num_rows:
        write_delta(path, table)
    else:
        from deltalake import write_deltalake

        write_deltalake(str(path), table)
    data = data_spec(path, **overrides)
    location = tmp_path / "shards"
    with pytest.raises(DataError, match=message):
        convert(data, location)
    left = sorted(p.name for p in location.iterdir()) if location.exists() else []
    assert left == [], f"left behind: {left}"


# -- 9. statistics ------------------------------------------------------------------------

def _with_missing(table: pa.Table, column: str, rows) -> pa.Table:
    values = table.column(column).to_numpy().copy()
    values[list(rows)] = np.nan
    return _with(table, column, pa.array(values))


def test_streamed_statistics_equal_the_in_memory_fit_when_the_sample_is_the_split(tmp_path):
    n = 3000
    table = _with_missing(rows_table(n), "a", range(0, n, 37))
    data = data_spec(features=["a", "b", "c", "ident"], preprocessing=[
        {"impute": {"strategy": "median", "columns": ["a"]}},
        {"clip": {"columns": ["b"], "lower_quantile": 0.05, "upper_quantile": 0.95}},
        {"robust_scale": ["c"]},
        "standard_scale"])
    shard_set = handmade_set(tmp_path / "shards", table, data, 300, cuts=(1100,))
    assert len(shard_set.shards("train")) > 3
    stats = fit_streamed(data, shard_set)
    assert stats.exact and stats.sampled_rows == shard_set.rows("train")
    memory = build_table(table.to_pandas(), data)
    train = np.flatnonzero(hash_split_rows(data, np.arange(n)) == 0)
    expected = fit_preprocessing(data, memory, train)
    assert [(s.kind, s.columns) for s in stats.fitted] == \
        [(s.kind, s.columns) for s in expected] == \
        [("impute", [0]), ("clip", [1]), ("scale", [2]), ("scale", [0, 1, 2, 3])]
    for streamed, in_memory in zip(stats.fitted, expected):
        assert streamed.params.keys() == in_memory.params.keys()
        for name in in_memory.params:
            np.testing.assert_allclose(streamed.params[name], in_memory.params[name],
                                       rtol=1e-9, err_msg=f"{streamed.kind} {name}")
    y = memory.target[train].astype(np.float64)
    assert stats.target_mean == pytest.approx(y.mean(), rel=1e-6)


def test_a_sample_smaller_than_the_split_keeps_means_and_deviations_exact(tmp_path):
    n = 25_000
    table = _with_missing(rows_table(n, seed=4), "a", range(3, n, 19))
    data = data_spec(features=["a", "b", "c"], split={"validation": 0.1, "test": 0.1},
                     streaming={"enabled": True, "sample_rows": 1000},
                     preprocessing=[{"impute": {"strategy": "mean", "columns": ["a"]}},
                                    {"standard_scale": ["a", "b"]},
                                    {"clip": {"columns": ["c"], "lower_quantile": 0.05,
                                              "upper_quantile": 0.95}}])
    shard_set = handmade_set(tmp_path / "shards", table, data, 3000, cuts=(9000,))
    stats = fit_streamed(data, shard_set)
    train = np.flatnonzero(hash_split_rows(data, np.arange(n)) == 0)
    assert 19_000 < len(train) == shard_set.rows("train") < 21_000
    assert not stats.exact and stats.sampled_rows == 1000
    impute, scale, clip = stats.fitted
    a = table.column("a").to_numpy()[train].astype(np.float64)
    b = table.column("b").to_numpy()[train].astype(np.float64)
    c = table.column("c").to_numpy()[train].astype(np.float64)
    fill = np.nanmean(a)
    np.testing.assert_allclose(impute.params["fill"], [fill], rtol=1e-9)
    filled = np.where(np.isnan(a), fill, a)
    np.testing.assert_allclose(scale.params["center"], [filled.mean(), b.mean()], rtol=1e-9)
    np.testing.assert_allclose(scale.params["scale"], [filled.std(), b.std()], rtol=1e-9)
    # The clip's bounds are quantiles of the 1,000-row sample: the share of all training
    # values below a bound is a sample quantile's coverage, binomial with standard deviation
    # sqrt(0.05 * 0.95 / 1000) = 0.0069; 0.03 is over four of them.
    (low,), (high,) = clip.params["low"], clip.params["high"]
    assert abs((c < low).mean() - 0.05) < 0.03
    assert abs((c <= high).mean() - 0.95) < 0.03


def test_a_missing_value_outside_the_sample_still_needs_an_impute_step(tmp_path):
    n = 25_000
    data = data_spec(features=["a", "b"], split={"validation": 0.1, "test": 0.1},
                     streaming={"enabled": True, "sample_rows": 1000},
                     preprocessing=["standard_scale"])
    train = np.flatnonzero(hash_split_rows(data, np.arange(n)) == 0)
    table = _with_missing(rows_table(n), "a", [train[777]])
    shard_set = handmade_set(tmp_path / "shards", table, data, 3000)
    sample, _ = sample_rows(shard_set, "train", 1000, seed=data.split.seed)
    assert len(sample) == 1000 and not np.isnan(sample).any()  # the sample has no gap
    with pytest.raises(DataError, match=r"^data\.preprocessing\.0\.standard_scale: missing "
                                        r"values in a; put an impute step before it"):
        fit_streamed(data, shard_set)


# -- 10. stream or not --------------------------------------------------------------------

def test_enabled_true_and_false_decide_alone():
    for enabled, streams in ((True, True), (False, False)):
        data = data_spec(streaming={"enabled": enabled, "in_memory_limit_mb": 1})
        decision = decide(data, 10, 3)
        assert decision.stream is streams
        assert f"enabled: {str(enabled).lower()}" in decision.reason


def test_auto_compares_the_matrix_with_the_limit():
    data = data_spec(streaming={"enabled": "auto", "in_memory_limit_mb": 1})
    big = decide(data, 100_000, 10)  # 4,000,000 bytes > 1 MiB
    small = decide(data, 20_000, 10)  # 800,000 bytes <= 1 MiB
    assert big.stream and not small.stream
    for decision, rows in ((big, "100,000"), (small, "20,000")):
        assert f"{rows} rows x 10 features" in decision.reason
        assert "1.0 MiB (data.streaming.in_memory_limit_mb)" in decision.reason
    assert ">" in big.reason and "<=" in small.reason


def test_a_source_of_unknown_size_streams(tmp_path):
    path = tmp_path / "rows.csv"
    rows_table(500).drop(["id"]).to_pandas().to_csv(path, index=False)
    data = data_spec(source={"kind": "csv", "path": str(path)},
                     streaming={"enabled": "auto", "in_memory_limit_mb": 4096})
    opened = source_kind(data).open(data, base=tmp_path)
    assert count_rows(opened) is None
    decision = decide(data, count_rows(opened), 3)
    assert decision.stream and "unknown" in decision.reason
    delta = data_spec(write_delta(tmp_path / "table", rows_table(500)))
    assert count_rows(source_kind(delta).open(delta, base=tmp_path)) == 500  # Delta's size is known


# -- 11. spec checks ----------------------------------------------------------------------

STREAMED = """\
name: streamed
data:
  source: {kind: delta, path: table}
  task: binary
  target: label
  streaming: {enabled: true}
model:
  layers:
    - linear: {out: 8}
    - relu
    - linear: {out: 1}
training:
  checkpointing: {every_n_steps: 10}
"""


def test_a_streamed_spec_with_step_checkpoints_is_valid(write_spec):
    code, out, _ = run_main("validate", write_spec(STREAMED))
    assert code == 0, out


@pytest.mark.parametrize("text, where", [
    (STREAMED.replace("  streaming:", "  split: {stratify: true}\n  streaming:"),
     r":6:21: data\.split\.stratify: data\.streaming splits rows by a hash .* cannot stratify"),
    (STREAMED.replace("{enabled: true}", "{enabled: true, key: label}"),
     r":6:35: data\.streaming\.key: the key 'label' is the target; use a row ID column"),
    (MINIMAL + "training:\n  checkpointing: {every_n_steps: 10}\n",
     r":\d+:\d+: training\.checkpointing\.every_n_steps: mid-epoch checkpoints need "
     r"data\.streaming"),
], ids=["stratify", "key-is-target", "step-checkpoints-in-memory"])
def test_streaming_spec_mistakes_are_located(write_spec, text, where):
    path = write_spec(text)
    code, out, err = run_main("validate", path)
    assert code != 0
    assert re.search(re.escape(path) + where, out + err), out + err


def test_a_window_is_read_into_one_array_without_copies_per_shard(tmp_path):
    """The prefetch thread holds one copy of a window's features while it reads it, not a
    copy per shard plus the joined window (issue 35: the 6M-row run's peak)."""
    import tracemalloc

    shard_set = stream_set(tmp_path, rows=40_000, rows_per_shard=10_000, cuts=())
    split = StreamedSplit(shard_set, "train", StreamSettings(batch_size=128, seed=7, window=4),
                          lambda x, y: (torch.from_numpy(x), torch.from_numpy(y)))
    window = split.plan(0).pieces[:4]
    window_bytes = sum(stop - start for _, start, stop in window) * split.width * 4
    tracemalloc.start()
    try:
        x, _, _, _ = split._load(window, None)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert x.shape == (window_bytes // (split.width * 4), split.width)
    assert peak < 1.5 * window_bytes, (peak, window_bytes)
