"""Regressions from the review of streamed data (issue 18): what the review found wrong in the
epoch plan, the shard identity and format, the conversion of targets and sources, the shard
location, checkpoint clearing and placement, and the stream's thread when an epoch fails.

Fast, no Spark: real Delta tables, Parquet and CSV files and real shard sets in ``tmp_path``,
the real epoch plan, the real training loop on a streamed split. The runs under DDP and
DeepSpeed are in ``tests/training/test_streaming_ranks.py``.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import threading
import time
from decimal import Decimal
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import yaml
from torch import nn

from dbspec.data.access import StreamedData
from dbspec.data.convert import convert_source
from dbspec.seams.sources import source_kind
from dbspec.data.prepare import build_table
from dbspec.data.shards import (FORMAT, FORMAT_VERSION, index_checksum, open_shard_set,
                                read_shard)
from dbspec.data.sources import DataError
from dbspec.data.stream import StreamedSplit, StreamSettings, epoch_plan
from dbspec.spec.sections.training import TrainingSpec
from dbspec.training.checkpoints import CheckpointStore
from dbspec.training.loop import StreamedTensors, TrainOptions, train
from tests.data.test_streaming import (convert, data_spec, drain, rows_table, stored_positions,
                                       stream_set, write_delta)

CPU = torch.device("cpu")


def stored_rows(shard_set, split: str = "train") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(x, y, row)`` of every shard of ``split``, in stored order."""
    width = len(shard_set.feature_names)
    parts = [read_shard(path, width) for path, _ in shard_set.shards(split)]
    return tuple(np.concatenate([part[i] for part in parts]) for i in range(3))


def every_split(shard_set) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(x, y, row)`` of the whole set (every split), rows in position order."""
    parts = [stored_rows(shard_set, split) for split in ("train", "validation", "test")
             if shard_set.rows(split)]
    x, y, rows = (np.concatenate([part[i] for part in parts]) for i in range(3))
    order = np.argsort(rows)
    return x[order], y[order], rows[order]


def run_load_data(tmp_path: Path, name: str, data: dict) -> tuple[object, Path]:
    """The load_data stage of a spec with ``data`` run in its own project directory (the
    stage function itself: what ``dbspec run`` calls); returns its output and directory."""
    from dbspec.spec import load_spec
    from dbspec.stages.base import Reporter, RunOptions, StageContext
    from dbspec.stages.data import LoadDataStage

    project = tmp_path / name
    (project / "load_data").mkdir(parents=True)
    spec = {"name": name, "data": data,
            "model": {"layers": [{"linear": {"out": 4}}, "relu", {"linear": {"out": 1}}]}}
    (project / "spec.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    ctx = StageContext(loaded=load_spec(str(project / "spec.yaml")),
                       directory=project / "load_data", project_dir=project / ".dbspec",
                       upstream={}, upstream_dirs={}, options=RunOptions(),
                       reporter=Reporter(enabled=False))
    return LoadDataStage().run(ctx), ctx.directory


# -- 1. no rank gets a one-row batch --------------------------------------------------------

def fake_shards(sizes: list[int]) -> list[tuple[Path, int]]:
    """Shards as the plan sees them (a path and a row count; no file is opened)."""
    return [(Path(f"shard-{i}.arrow"), rows) for i, rows in enumerate(sizes)]


@pytest.mark.parametrize("sizes, world", [
    ([500, 400, 383], 2),  # 1,283 rows: ranks of 641 and 642, 641 % 64 == 1
    ([300, 363, 300], 3),  # 963 rows: three ranks of 321, 321 % 64 == 1
], ids=["world2", "world3"])
def test_no_rank_gets_a_one_row_batch(sizes, world):
    """The loop skips a one-row batch under batch norm; a rank that skips a step its peers
    run leaves DDP's all-reduce waiting for ever. With the smallest rank's rows % batch == 1
    no rank may get a one-row batch, and the ranks still run as many steps and read every
    row once."""
    shards, batch = fake_shards(sizes), 64
    for epoch in range(4):  # shuffled shard orders differ by epoch
        plans = [epoch_plan(shards, StreamSettings(batch_size=batch, seed=5), epoch=epoch,
                            rank=rank, world=world) for rank in range(world)]
        rows = [plan.rows for plan in plans]
        assert min(rows) % batch == 1 and sum(rows) == sum(sizes)  # the case under test
        for plan in plans:
            assert min(plan.batch_sizes) > 1, plan.batch_sizes
            assert sum(plan.batch_sizes) == plan.rows
        assert len({len(plan.batch_sizes) for plan in plans}) == 1, \
            [len(plan.batch_sizes) for plan in plans]
        read = [(path.name, row) for plan in plans for path, start, stop in plan.pieces
                for row in range(start, stop)]
        assert len(read) == len(set(read)) == sum(sizes)  # every row once, by one rank


def test_one_rank_keeps_the_in_memory_batching():
    """On one rank nothing is skipped that the in-memory loop would not skip: a trailing
    one-row batch stays, as the in-memory loop's ``order[start:start + batch]`` gives it."""
    rows, batch = 1281, 64
    plan = epoch_plan(fake_shards([700, 581]), StreamSettings(batch_size=batch, seed=5),
                      epoch=0)
    in_memory = [len(range(rows)[start:start + batch]) for start in range(0, rows, batch)]
    assert plan.batch_sizes == in_memory == [64] * 20 + [1]


# -- 2. shard identity ----------------------------------------------------------------------

def test_a_delta_table_recreated_at_the_same_path_converts_again(tmp_path):
    path, location = tmp_path / "table", tmp_path / "shards"
    data = data_spec(path)
    write_delta(path, rows_table(2000, seed=1), pieces=1)
    first = convert(data, location)
    shutil.rmtree(path)
    write_delta(path, rows_table(2000, seed=2), pieces=1)  # version 0 again, other values
    said: list[str] = []
    second = convert(data, location, say=said.append)
    assert first.version == second.version == "delta-v0"  # the version alone cannot tell
    assert second.root != first.root
    assert not any("reusing" in line for line in said), said
    column = second.feature_names.index("a")
    x, _, rows = every_split(second)
    expected = rows_table(2000, seed=2).column("a").to_numpy()
    np.testing.assert_array_equal(x[:, column], expected[rows])


def write_fixed_size_parquet(directory: Path, seed: int) -> Path:
    """A Parquet directory whose file has the same name, size and time whatever ``seed``
    (plain encoding, no compression, no statistics), with values drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    table = pa.table({"a": rng.normal(size=1500), "b": rng.normal(size=1500),
                      "y": rng.normal(size=1500)})
    directory.mkdir(parents=True)
    path = directory / "part-0.parquet"
    pq.write_table(table, path, compression="none", use_dictionary=False,
                   write_statistics=False)
    os.utime(path, ns=(1_700_000_000_000_000_000, 1_700_000_000_000_000_000))
    return path


def test_the_same_relative_path_in_two_directories_gets_two_shard_sets(tmp_path):
    """Two projects each with their own ``data/events``: the spec's path string, the file's
    name, size and time are the same, the rows are not."""
    data = data_spec(source={"kind": "parquet", "path": "data/events"}, features=["a", "b"])
    location = tmp_path / "shards"  # one location for both, as a shared dir would be
    files = [write_fixed_size_parquet(tmp_path / project / "data/events", seed)
             for seed, project in enumerate(("one", "two"))]
    assert files[0].stat().st_size == files[1].stat().st_size  # the case under test
    found = []
    for project, file in zip(("one", "two"), files):
        said: list[str] = []
        opened = source_kind(data).open(data, base=tmp_path / project)
        found.append((opened.version, convert_source(data, opened, location, say=said.append)))
        x, _, rows = every_split(found[-1][1])
        np.testing.assert_array_equal(x[:, 0], pq.read_table(file).column("a").to_numpy()
                                      .astype(np.float32)[rows])
    (version_one, one), (version_two, two) = found
    assert version_one == version_two  # the data version alone cannot tell them apart
    assert one.root != two.root


# -- 3. shards of the old format ------------------------------------------------------------

def write_old_format_shard(path: Path, rows: int = 10, width: int = 3) -> None:
    """A shard as format 1 wrote it: every feature in one fixed-size list column ``x``."""
    x = pa.FixedSizeListArray.from_arrays(pa.array(np.arange(rows * width, dtype=np.float32)),
                                          width)
    table = pa.table({"x": x, "y": pa.array(np.zeros(rows, np.float32)),
                      "row": pa.array(np.arange(rows, dtype=np.int64))})
    path.parent.mkdir(parents=True, exist_ok=True)
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)


def write_old_format_set(root: Path, format_version: int) -> Path:
    """A set of one old-format training shard, its index saying ``format_version`` (with the
    shard's size and the index's checksum, which format 3 checks when the set is opened)."""
    shard = root / "train/shard-00000-00000.arrow"
    write_old_format_shard(shard)
    index = {"format": FORMAT, "format_version": format_version, "identity": "old",
             "data_version": "delta-v0", "uri": str(root), "feature_names": ["a", "b", "c"],
             "target": "y", "task": "regression", "classes": None, "rows": 10, "key": None,
             "splits": {"train": [{"file": "train/shard-00000-00000.arrow", "rows": 10,
                                   "bytes": shard.stat().st_size}],
                        "validation": [], "test": []},
             "nan_columns": {"train": [], "validation": [], "test": []}}
    index["checksum"] = index_checksum(index)
    (root / "index.json").write_text(json.dumps(index))
    return root / "train/shard-00000-00000.arrow"


def test_an_old_format_shard_is_a_data_error_naming_it(tmp_path):
    shard = tmp_path / "train/shard-00000-00000.arrow"
    write_old_format_shard(shard)
    with pytest.raises(DataError, match=re.escape(str(shard))):
        read_shard(shard, 3)


def test_an_index_of_this_format_over_old_shards_fails_when_read_naming_the_file(tmp_path):
    shard = write_old_format_set(tmp_path / "set", format_version=FORMAT_VERSION)
    shard_set = open_shard_set(tmp_path / "set")
    split = StreamedSplit(shard_set, "train", StreamSettings(batch_size=4, seed=0),
                          lambda x, y: (torch.from_numpy(np.array(x)), torch.from_numpy(y)))
    with pytest.raises(DataError, match=re.escape(str(shard))):
        drain(split.batches(0))


def test_an_index_of_format_1_is_refused(tmp_path):
    write_old_format_set(tmp_path / "set", format_version=1)
    with pytest.raises(DataError, match=r"holds shards of another format \(dbspec-arrow-shards"
                                        r" v1\)"):
        open_shard_set(tmp_path / "set")


# -- 4. targets -----------------------------------------------------------------------------

def test_a_dictionary_encoded_class_target_converts_as_the_in_memory_path_reads_it(tmp_path):
    """A pandas categorical target written to two Parquet files, each with its own
    categories: each file's dictionary differs (Arrow's IPC file cannot replace one)."""
    import pandas as pd

    directory = tmp_path / "animals"
    directory.mkdir()
    rng = np.random.default_rng(0)
    for number, categories in enumerate((["cat", "dog"], ["bird", "dog"])):
        frame = pd.DataFrame({"a": rng.normal(size=800), "b": rng.normal(size=800)})
        frame["animal"] = pd.Categorical(rng.choice(categories, 800), categories=categories)
        frame.to_parquet(directory / f"part-{number}.parquet", index=False)
    data = data_spec(source={"kind": "parquet", "path": str(directory)}, task="multiclass",
                     target="animal", features=["a", "b"])
    shard_set = convert(data, tmp_path / "shards")
    in_memory = build_table(pq.read_table(directory).to_pandas(), data)
    assert shard_set.classes == in_memory.classes == ["bird", "cat", "dog"]
    positions = stored_positions(shard_set, "train")
    assert np.array_equal(StreamedData(shard_set).targets("train"), in_memory.target[positions])


def test_a_decimal_class_target_converts_to_plain_numbers(tmp_path):
    path = tmp_path / "grades.parquet"
    rng = np.random.default_rng(1)
    grades = [Decimal(v) for v in rng.choice(["1.0", "2.0", "3.5"], 1200)]
    pq.write_table(pa.table({"a": rng.normal(size=1200), "b": rng.normal(size=1200),
                             "grade": pa.array(grades, pa.decimal128(4, 1))}), path)
    data = data_spec(source={"kind": "parquet", "path": str(path)}, task="multiclass",
                     target="grade", features=["a", "b"])
    shard_set = convert(data, tmp_path / "shards")
    index = json.loads((shard_set.root / "index.json").read_text())
    assert index["classes"] == shard_set.classes == [1.0, 2.0, 3.5]
    assert all(type(c) in (int, float) for c in shard_set.classes)
    expected = np.searchsorted([1.0, 2.0, 3.5], [float(g) for g in grades])
    positions = stored_positions(shard_set, "train")
    assert np.array_equal(StreamedData(shard_set).targets("train"), expected[positions])


def test_a_decimal_class_target_has_the_same_classes_in_memory(tmp_path):
    """A streaming spec keeps its rows in memory or streams them as their size decides
    (``enabled: auto``): the model's classes must not depend on which."""
    path = tmp_path / "grades.parquet"
    rng = np.random.default_rng(1)
    pq.write_table(pa.table({"a": rng.normal(size=1200), "grade": pa.array(
        [Decimal(v) for v in rng.choice(["1.0", "2.0", "3.5"], 1200)], pa.decimal128(4, 1))}),
        path)
    data = {"source": {"kind": "parquet", "path": str(path)}, "task": "multiclass",
            "target": "grade", "features": ["a"]}
    streamed, _ = run_load_data(tmp_path, "streamed", {**data, "streaming": {"enabled": True}})
    memory, memory_dir = run_load_data(tmp_path, "memory",
                                       {**data, "streaming": {"enabled": False}})
    assert streamed.classes == [1.0, 2.0, 3.5]
    recorded = json.loads((memory_dir / "table.json").read_text())["classes"]
    assert recorded == streamed.classes, "the in-memory path records other classes"


def _with_nan(table: pa.Table, column: str, rows, dtype=np.float64) -> pa.Table:
    """``table`` with NaN (a float value, not a null) at ``rows`` of ``column``."""
    values = table.column(column).to_numpy().astype(dtype)
    values[list(rows)] = np.nan
    return table.set_column(table.schema.get_field_index(column), column, pa.array(values))


@pytest.mark.parametrize("column, overrides, rows", [
    ("y", {}, (10, 1500, 2990)),
    ("label", {"task": "binary", "target": "label"}, (7, 2001)),
], ids=["regression", "float-class-labels"])
def test_a_nan_target_is_a_missing_target(tmp_path, column, overrides, rows):
    table = _with_nan(rows_table(3000), column, rows)
    data = data_spec(write_delta(tmp_path / "table", table), **overrides)
    location = tmp_path / "shards"
    with pytest.raises(DataError, match=rf"^data\.target: {len(rows)} rows have no target "
                                        r"value$"):
        convert(data, location)
    assert not location.exists() or list(location.iterdir()) == []


# -- 5. CSV types and corrupt files ---------------------------------------------------------

def test_a_csv_column_of_integers_that_later_holds_a_fraction_converts(tmp_path):
    """Arrow infers a CSV column's type from its first block: a column of integers for
    200,000 rows (several blocks) and then 0.5 must still read as numbers."""
    n = 200_010
    a = np.arange(n) % 7
    lines = ["a,b,y"] + [f"{a[i]},{i},{i % 3}" for i in range(200_000)] \
        + [f"0.5,{i},{i % 3}" for i in range(200_000, n)]
    path = tmp_path / "rows.csv"
    path.write_text("\n".join(lines) + "\n")
    assert path.stat().st_size > 2**20  # the fraction comes after the first 1 MiB block
    expected_a = np.where(np.arange(n) < 200_000, a, 0.5).astype(np.float32)
    data = data_spec(source={"kind": "csv", "path": str(path)}, features=None)
    shard_set = convert(data, tmp_path / "shards")
    assert shard_set.feature_names == ["a", "b"]
    x, y, rows = every_split(shard_set)
    assert np.array_equal(rows, np.arange(n))
    np.testing.assert_array_equal(x[:, 0], expected_a)
    np.testing.assert_array_equal(x[:, 1], np.arange(n, dtype=np.float32))
    np.testing.assert_array_equal(y, (np.arange(n) % 3).astype(np.float32))


def test_a_corrupt_parquet_file_is_a_data_error_and_leaves_nothing(tmp_path):
    directory = tmp_path / "source"
    directory.mkdir()
    table = rows_table(2000).drop(["id"])
    pq.write_table(table, directory / "part-0.parquet")  # the schema is read from this one
    (directory / "part-1.parquet").write_bytes(b"not a parquet file at all " * 40)
    data = data_spec(source={"kind": "parquet", "path": str(directory)})
    location = tmp_path / "shards"
    with pytest.raises(DataError, match=r"^data\.source") as raised:
        convert(data, location)
    assert "part-1.parquet" in str(raised.value)
    left = sorted(p.name for p in location.iterdir()) if location.exists() else []
    assert left == [], f"left behind: {left}"


@pytest.mark.parametrize("enabled", [True, False], ids=["streamed", "in-memory"])
def test_a_corrupt_parquet_file_is_a_data_error_in_the_load_data_stage(tmp_path, enabled):
    """The same file through ``load_data``, which counts the source's rows from the Parquet
    footers before it converts (or reads) anything."""
    directory = tmp_path / "source"
    directory.mkdir()
    pq.write_table(rows_table(2000).drop(["id"]), directory / "part-0.parquet")
    (directory / "part-1.parquet").write_bytes(b"not a parquet file at all " * 40)
    with pytest.raises(DataError, match=r"^data\.source") as raised:
        run_load_data(tmp_path, "corrupt", {
            "source": {"kind": "parquet", "path": str(directory)}, "task": "regression",
            "target": "y", "features": ["a", "b"], "streaming": {"enabled": enabled}})
    assert "part-1.parquet" in str(raised.value)
    shards = tmp_path / "corrupt/.dbspec/shards"
    left = sorted(p.name for p in shards.iterdir()) if shards.exists() else []
    assert left == [], f"left behind: {left}"


# -- 6. hive-partitioned Parquet ------------------------------------------------------------

def test_a_hive_partition_column_is_a_feature_as_in_memory(tmp_path):
    directory = tmp_path / "events"
    table = rows_table(3000).drop(["id"])
    for bucket, (low, high) in enumerate(((0, 1700), (1700, 3000)), start=1):
        (directory / f"bucket={bucket}").mkdir(parents=True)
        pq.write_table(table.slice(low, high - low), directory / f"bucket={bucket}/part.parquet")
    data = {"source": {"kind": "parquet", "path": str(directory)}, "task": "regression",
            "target": "y", "features": ["a", "bucket", "b"]}
    streamed, _ = run_load_data(tmp_path, "streamed", {**data, "streaming": {"enabled": True}})
    memory, memory_dir = run_load_data(tmp_path, "memory",
                                       {**data, "streaming": {"enabled": False}})
    assert streamed.feature_names == memory.feature_names == ["a", "bucket", "b"]
    from dbspec.data import store

    in_memory = store.read_table(memory_dir, {"feature_names": memory.feature_names,
                                              "classes": None})
    x, _, rows = every_split(open_shard_set(Path(streamed.shards)))
    assert np.array_equal(rows, np.arange(3000))
    np.testing.assert_array_equal(x, in_memory.features)
    assert set(x[:, 1]) == {1.0, 2.0}


# -- 7. the key is no default feature -------------------------------------------------------

@pytest.mark.parametrize("enabled", [True, False], ids=["streamed", "in-memory"])
def test_the_key_is_not_a_default_feature(tmp_path, enabled):
    path = write_delta(tmp_path / "table", rows_table(2000))  # id is a string column
    output, _ = run_load_data(tmp_path, "keyed", {
        "source": {"kind": "delta", "path": str(path)}, "task": "regression", "target": "y",
        "streaming": {"enabled": enabled, "key": "id"}})
    assert output.feature_names == ["ident", "a", "b", "c", "label"]
    assert bool(output.shards) is enabled


# -- 8. an unwritable location --------------------------------------------------------------

def test_a_location_that_cannot_be_written_is_a_data_error(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    location = blocker / "shards"
    data = data_spec(write_delta(tmp_path / "table", rows_table(500), pieces=1),
                     streaming={"enabled": True, "location": str(location)})
    opened = source_kind(data).open(data, base=tmp_path)
    with pytest.raises(DataError, match=r"^data\.streaming\.location: cannot write shards "
                                        rf"under {re.escape(str(location))}"):
        convert_source(data, opened, location)


# -- 9. stale partial sets ------------------------------------------------------------------

def test_a_stale_partial_set_is_removed_and_a_fresh_one_kept(tmp_path):
    from dbspec.data.shard_writing import STALE_PARTIAL_SECONDS

    location = tmp_path / "shards"
    ages = {"stale": STALE_PARTIAL_SECONDS + 3600, "fresh": STALE_PARTIAL_SECONDS - 3600}
    for name, age in ages.items():
        partial = location / f".partial-{name}-0123abcd"
        (partial / "train").mkdir(parents=True)
        (partial / "train/shard-00000-00000.arrow.partial").write_bytes(b"half")
        then = time.time() - age
        os.utime(partial, (then, then))
    shard_set = convert(data_spec(write_delta(tmp_path / "table", rows_table(500))), location)
    left = sorted(p.name for p in location.iterdir())
    assert left == [".partial-fresh-0123abcd", shard_set.root.name], left


# -- 10. clearing DeepSpeed's checkpoints ---------------------------------------------------

def test_clear_removes_deepspeed_checkpoint_directories(tmp_path):
    directory = tmp_path / "checkpoints"
    for tag in ("epoch-0", "epoch-3", "epoch-1-step-20"):
        (directory / tag).mkdir(parents=True)
        (directory / tag / "mp_rank_00_model_states.pt").write_bytes(b"weights")
        (directory / tag / ".complete").touch()
    (directory / "latest").write_text("epoch-3")
    (directory / "epoch-4.pt").write_bytes(b"x")
    (directory / "epoch-4-step-5.pt").write_bytes(b"x")
    unrelated = ["notes.txt", "epoch-best", "epoch-2.pt.bak"]
    (directory / "notes.txt").write_text("mine")
    (directory / "epoch-best").mkdir()
    (directory / "epoch-2.pt.bak").write_bytes(b"mine")
    CheckpointStore(directory).clear()
    assert sorted(p.name for p in directory.iterdir()) == sorted(unrelated)


# -- 11, 12. the loop on a streamed split ---------------------------------------------------

def streamed_tensors(shard_set, *, batch_size: int, **settings) -> StreamedTensors:
    """The training split streamed as the loop trains it (features and target scaled down)."""

    def prepare(x, y):
        return (torch.from_numpy(np.array(x)) / 1000,
                torch.from_numpy(np.array(y, dtype=np.float32)).unsqueeze(1) / 1000)

    train_split = StreamedSplit(shard_set, "train",
                                StreamSettings(batch_size=batch_size, seed=3, **settings),
                                prepare)
    return StreamedTensors(train_split, None, train_split.example(2)[0])


def prefetch_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == "dbspec-prefetch" and t.is_alive()}


class FailsAtStep(nn.Module):
    """A linear model whose forward raises at its ``fail_at``-th call, noting the stream's
    threads alive at that moment."""

    def __init__(self, fail_at: int):
        super().__init__()
        self.linear, self.fail_at, self.calls = nn.Linear(3, 1), fail_at, 0
        self.threads_at_failure: set[threading.Thread] = set()

    def forward(self, x):
        self.calls += 1
        if self.calls == self.fail_at:
            self.threads_at_failure = prefetch_threads()
            raise RuntimeError(f"injected failure at step {self.fail_at}")
        return self.linear(x)


def test_a_failing_epoch_stops_the_streams_prefetch_thread(tmp_path):
    # windows of one shard, one read ahead: the thread is blocked on a full queue when the
    # network fails
    shard_set = stream_set(tmp_path, rows=5000, rows_per_shard=300, cuts=())
    tensors = streamed_tensors(shard_set, batch_size=64, window=1, prefetch=1)
    before = prefetch_threads()
    network = FailsAtStep(3)
    training = TrainingSpec.model_validate({"epochs": 2, "batch_size": 64})
    with pytest.raises(RuntimeError, match="injected failure at step 3") as failure:
        train(network, tensors, training, loss="mse", device=CPU)
    started = network.threads_at_failure - before
    assert started, "no prefetch thread ran at the failure (the test would prove nothing)"
    deadline = time.monotonic() + 2
    while started & prefetch_threads() and time.monotonic() < deadline:
        time.sleep(0.05)
    # the failure (and its traceback, holding the loop's frames) is still alive here, as it is
    # while a caller reports it: the thread must stop without waiting for garbage collection
    assert failure.value is not None
    assert not started & prefetch_threads(), "the prefetch thread outlived the failed epoch"


class RecordingStore(CheckpointStore):
    """A checkpoint store that notes each mid-epoch checkpoint and the step files on disk
    right after it is written."""

    def __init__(self, directory: Path):
        super().__init__(directory)
        self.saved: list[tuple[int, int]] = []
        self.on_disk: list[list[str]] = []

    def save_step(self, epoch: int, step: int, state):
        path = super().save_step(epoch, step, state)
        self.saved.append((epoch, step))
        self.on_disk.append(sorted(p.name for p in self.directory.glob("epoch-*-step-*.pt")))
        return path


def test_step_checkpoints_land_on_the_first_optimizer_step_after_each_multiple(tmp_path):
    every, accumulate = 5, 3
    shard_set = stream_set(tmp_path, rows=5000, rows_per_shard=400, cuts=())
    tensors = streamed_tensors(shard_set, batch_size=100)
    training = TrainingSpec.model_validate({
        "epochs": 2, "batch_size": 100, "gradient_accumulation": accumulate,
        "optimizer": {"name": "sgd", "lr": 0.01},
        "checkpointing": {"every_n_steps": every}})
    store = RecordingStore(tmp_path / "checkpoints")
    torch.manual_seed(0)
    train(nn.Linear(3, 1), tensors, training, loss="mse", device=CPU,
          options=TrainOptions(checkpoints=store))
    expected = []
    for epoch in range(2):
        steps = tensors.train.num_batches(epoch)
        assert steps > 6 * every  # several multiples of every_n_steps in an epoch
        # each multiple of 5 is checkpointed at the first multiple of 3 (an optimizer step)
        # at or after it; the epoch's last batch has the epoch's own checkpoint
        landing = [math.ceil(m / accumulate) * accumulate for m in range(every, steps, every)]
        expected += [(epoch, step) for step in landing if step < steps]
    assert expected[:6] == [(0, 6), (0, 12), (0, 15), (0, 21), (0, 27), (0, 30)]
    assert store.saved == expected
    assert store.on_disk == [[f"epoch-{e}-step-{s}.pt"] for e, s in expected]


def _memory_cgroup(name: str):
    """A fresh memory cgroup (v1 here, v2 elsewhere) this test may put a process in, or None
    where it cannot be made (not root, no memory controller)."""
    import os

    for base, limit in ((Path("/sys/fs/cgroup/memory"), "memory.limit_in_bytes"),
                        (Path("/sys/fs/cgroup"), "memory.max")):
        if not (base / limit).exists() and not (base / "cgroup.procs").exists():
            continue
        path = base / f"{name}-{os.getpid()}"
        try:
            path.mkdir()
        except OSError:
            continue
        if (path / limit).exists():
            return path, limit
        path.rmdir()
    return None


def test_a_memory_cgroup_limit_bounds_the_available_memory():
    """In a container or a memory cgroup the machine's MemAvailable overstates the room:
    ``enabled: auto`` then keeps too much in memory. A real cgroup of 512 MiB, as root."""
    import subprocess
    import sys

    made = _memory_cgroup("dbspec-test-room")
    if made is None:
        pytest.skip("no memory cgroup can be made here (needs root and a memory controller)")
    path, limit = made
    try:
        (path / limit).write_text(str(512 * 2**20))
        code = ("import os, sys; open(sys.argv[1], 'w').write(str(os.getpid())); "
                "from dbspec.data.convert import available_memory, cgroup_room; "
                "print(available_memory(), cgroup_room())")
        done = subprocess.run([sys.executable, "-c", code, str(path / "cgroup.procs")],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        available, room = (int(v) for v in done.stdout.split())
        assert 0 < room <= 512 * 2**20 and available == room
    finally:
        path.rmdir()
