"""Streamed training (``data.streaming``) end to end, on real data and real runs.

Every source is a Delta table written with ``deltalake`` into the test's own directory (or the
cluster's shared dir), every run is ``dbspec run`` (in this process, or in a process of its own
where it is killed or must start its own Spark application), and MLflow is the SQLite store in
the project's state dir, or the session's tracking server on the cluster. Nothing is mocked.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.conftest import run_in_process
from tests.helpers.pause import kill_paused, run_until_paused

pytestmark = pytest.mark.slow

FEATURES = [f"f{i}" for i in range(8)]


def write_table(path: Path, rows: int, *, task: str = "regression", seed: int = 0,
                files: int = 1, fmt: str = "delta") -> Path:
    """A Delta table of ``rows`` x 8 float32 features and a target, in ``files`` appends
    (one Parquet file each), or with ``fmt="parquet"`` a directory of ``files`` Parquet files;
    regression targets are linear plus noise, binary ones its sign."""
    import pandas as pd
    from deltalake import write_deltalake

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, len(FEATURES))).astype(np.float32)
    signal = x @ rng.normal(size=len(FEATURES)) + rng.normal(0, 0.1, rows)
    frame = pd.DataFrame(x, columns=FEATURES)
    frame["target"] = signal.astype(np.float32) if task == "regression" \
        else (signal > 0).astype(np.int64)
    for number, part in enumerate(np.array_split(np.arange(rows), files)):
        if fmt == "delta":
            write_deltalake(str(path), frame.iloc[part], mode="append")
        else:
            path.mkdir(exist_ok=True)
            frame.iloc[part].to_parquet(path / f"part-{number}.parquet", index=False)
    return path


def spec_text(name: str, table: Path, *, streaming: dict, task: str = "regression",
              epochs: int = 1, training: dict | None = None, compute: dict | None = None,
              fmt: str = "delta") -> str:
    """A small MLP on the table, one torch thread (deterministic on the CPU)."""
    spec = {
        "name": name,
        "data": {"source": {"kind": fmt, "path": str(table)}, "task": task,
                 "preprocessing": ["standard_scale"], "streaming": streaming},
        "model": {"layers": [{"linear": {"out": 16}}, "relu", {"linear": {"out": 1}}]},
        "training": {"optimizer": {"name": "adam", "lr": 0.01}, "epochs": epochs,
                     "batch_size": 64, "num_threads": 1, **(training or {})},
        "compute": compute or {"kind": "local"},
        "tracking": {"system_metrics": False},
    }
    return yaml.safe_dump(spec, sort_keys=False)


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    """The module's tables (read only: shards go to each project's state dir)."""
    root = tmp_path_factory.mktemp("streaming-tables")
    return {"small": write_table(root / "small", 8_000),
            # 40,000 x 8 float32 = 1.22 MiB: two training shards at shard_size_mb: 1
            "big": write_table(root / "big", 40_000, seed=1),
            "binary": write_table(root / "binary", 12_000, task="binary", seed=2)}


@pytest.fixture
def project(workdir, monkeypatch):
    """A project directory maker: each run gets its own state dir and SQLite store."""
    monkeypatch.delenv("DBSPEC_SHARED_DIR", raising=False)

    def make(name: str, text: str) -> Path:
        directory = workdir / name
        directory.mkdir()
        (directory / "spec.yaml").write_text(text)
        return directory

    return make


def state_of(directory: Path, name: str) -> dict:
    return json.loads((directory / ".dbspec/runs" / name / "state.json").read_text())["stages"]


def history_of(directory: Path, name: str) -> list[dict]:
    path = directory / ".dbspec/runs" / name / "stages/train/history.json"
    return json.loads(path.read_text())


def run_ok(directory: Path, *args: str, timeout: int = 300):
    done = run_in_process("run", "spec.yaml", *args, cwd=directory, timeout=timeout)
    assert done.returncode == 0, done.stderr[-4000:]
    return done


# -- 1. the in-memory and the streamed path train the same first epoch ----------------------

def test_in_memory_and_streamed_training_agree_on_the_first_epoch(project, tables):
    # the whole training split is one shard and one window, so the streamed epoch-0 order is
    # the in-memory loop's randperm and both paths see the same batches
    found = {}
    for mode, streaming in (("memory", {"enabled": False}),
                            ("streamed", {"enabled": True, "shard_size_mb": 64})):
        directory = project(mode, spec_text("agree", tables["small"], streaming=streaming))
        run_ok(directory)
        found[mode] = (state_of(directory, "agree"), history_of(directory, "agree"))
    (memory, memory_history), (streamed, streamed_history) = found["memory"], found["streamed"]
    assert "shards" not in memory["load_data"]["output"]
    shard_root = Path(streamed["load_data"]["output"]["shards"])
    # no location, no shared dir: the state dir's shards/
    assert shard_root.parent == (directory / ".dbspec" / "shards").resolve()
    index = json.loads((shard_root / "index.json").read_text())
    assert len(index["splits"]["train"]) == 1
    # the same hash split on both paths
    assert memory["split"]["output"] == streamed["split"]["output"]
    sizes = streamed["split"]["output"]
    assert sum(sizes.values()) == 8_000 and min(sizes.values()) > 1_000
    assert {split: sum(s["rows"] for s in shards) for split, shards in
            index["splits"].items()} == sizes
    for key in ("train_loss", "val_loss"):
        assert streamed_history[0][key] == pytest.approx(memory_history[0][key], rel=1e-6), key


# -- 2. killed between step checkpoints, resumed mid-epoch --------------------------------

RESUME_STREAMING = {"enabled": True, "shard_size_mb": 1, "shuffle_window": 1}
RESUME_TRAINING = {"epochs": 3, "checkpointing": {"every_n_steps": 20},
                   "scheduler": {"name": "onecycle", "max_lr": 0.02}}


def test_a_run_killed_mid_epoch_resumes_to_the_uninterrupted_result(project, tables):
    text = spec_text("resume", tables["big"], streaming=RESUME_STREAMING,
                     training=RESUME_TRAINING)
    reference = project("reference", text)
    run_ok(reference)
    expected = history_of(reference, "resume")
    train_rows = state_of(reference, "resume")["split"]["output"]["train"]
    steps = math.ceil(train_rows / 64)
    # a kill past the first window of epoch 1: the step checkpoint before it (360) lies beyond
    # the larger of the two training shards, so the resume skips a whole window
    index = json.loads((Path(state_of(reference, "resume")["load_data"]["output"]["shards"])
                        / "index.json").read_text())
    assert len(index["splits"]["train"]) == 2
    assert 360 * 64 > max(s["rows"] for s in index["splits"]["train"]) and steps > 370
    killed = project("killed", text)
    marker = killed / "paused"
    process = run_until_paused(["run", "spec.yaml", "-q"], "train.step.1.370", marker,
                               cwd=killed, timeout=240)
    checkpoints = killed / ".dbspec/runs/resume/stages/train/checkpoints"
    try:
        files = sorted(p.name for p in checkpoints.iterdir())
    finally:
        kill_paused(process)
    # the epoch's last step checkpoint, alone (the older ones and epoch 0's went), and epoch 0's
    assert files == ["epoch-0.pt", "epoch-1-step-360.pt"], files
    # the resume goes on from step 360: its first optimizer step is the 361st of epoch 1 (had
    # it restarted the epoch from epoch-0.pt, it would stop at step 20 instead; the results
    # alone cannot tell, since the stream replays the same batches)
    process = run_until_paused(["run", "spec.yaml", "-q", "--resume"],
                               "train.step.1.20,train.step.1.361", marker, cwd=killed,
                               timeout=240)
    kill_paused(process)
    assert marker.read_text().split()[1] == "train.step.1.361"
    resumed = run_ok(killed, "--resume")
    assert "train (resuming)" in resumed.stderr
    train = state_of(killed, "resume")["train"]["output"]
    assert train["resumed_from_epoch"] == 1 and train["epochs_run"] == 3
    history = history_of(killed, "resume")
    for key in ("train_loss", "val_loss", "lr"):
        assert [e[key] for e in history] == [e[key] for e in expected], key
    # MLflow has every epoch once, with the uninterrupted run's values (epoch 0 from the
    # checkpoint's history: the killed process never flushed it)
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{killed / '.dbspec/mlflow.db'}")
    logged = client.get_metric_history(train["run_id"], "train_loss")
    assert sorted((m.step, m.value) for m in logged) == \
        [(epoch, e["train_loss"]) for epoch, e in enumerate(expected)]
    assert not list(checkpoints.glob("epoch-*-step-*.pt"))  # the epoch's end removed it


# -- 3. streamed DDP: each rank reads about half the rows ---------------------------------

def test_torch_distributor_ranks_stream_half_the_rows_each(project, tables):
    name = "streamed-ddp"
    directory = project("ddp", spec_text(
        name, tables["binary"], task="binary", epochs=3, streaming={"enabled": True},
        compute={"kind": "torch_distributor", "num_processes": 2, "use_gpu": False,
                 "local_mode": True}))
    run_ok(directory, "-q", "--summary-json", "summary.json", timeout=600)
    stages = state_of(directory, name)
    train_rows = stages["split"]["output"]["train"]
    assert stages["train"]["output"]["world_size"] == 2
    run_dir = directory / ".dbspec/runs" / name / "stages/train/distributed"
    ranks = [json.loads(p.read_text()) for p in sorted(run_dir.glob("rank-*.json"))]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert sum(r["rows"] for r in ranks) == train_rows  # disjoint halves covering the split
    assert all(abs(r["rows"] - train_rows / 2) <= 1 for r in ranks), ranks
    assert ranks[0]["checksum"] == ranks[1]["checksum"]  # DDP kept the weights equal
    job = json.loads((run_dir / "job.json").read_text())
    assert job["shards"] == stages["load_data"]["output"]["shards"]
    summary = json.loads((directory / "summary.json").read_text())
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{directory / '.dbspec/mlflow.db'}")
    run = client.get_run(summary["run_id"])
    assert run.data.params["dbspec.world_size"] == "2"
    assert {"rank_0_samples_per_second", "rank_1_samples_per_second"} <= set(run.data.metrics)
    assert math.isfinite(summary["metrics"]["test_loss"])
    # a linear signal: a working training is far better than chance
    assert summary["metrics"]["test_accuracy"] > 0.85


# -- 4 on local Spark: the conversion in Spark tasks gives the shard set this process does ---

def shard_rows_of(shard_root: Path) -> dict[str, dict[int, tuple]]:
    """Every split's rows in a shard set: position -> (features, target)."""
    import pyarrow as pa

    index = json.loads((shard_root / "index.json").read_text())
    found: dict[str, dict[int, tuple]] = {}
    for split, shards in index["splits"].items():
        found[split] = {}
        for shard in shards:
            with pa.memory_map(str(shard_root / shard["file"])) as source:
                table = pa.ipc.open_file(source).read_all()
            features = [table.column(f"f{j}").to_pylist()
                        for j in range(len(index["feature_names"]))]
            for x, y, row in zip(zip(*features), table.column("y").to_pylist(),
                                 table.column("row").to_pylist()):
                found[split][row] = (tuple(x), y)
    return found


@pytest.mark.parametrize("fmt", ["delta", "parquet"])
def test_spark_tasks_convert_a_source_into_the_shards_one_process_writes(
        project, tmp_path, fmt):
    # three source files, one Spark task each: every task numbers its rows from the files
    # before it, so each row keeps the position (and so the split) the single-process
    # conversion gives it
    table = write_table(tmp_path / f"{fmt}-table", 6_000, files=3, fmt=fmt)
    text = spec_text("converted", table, streaming={"enabled": True}, fmt=fmt)
    shard_sets = {}
    for executor in ("local", "spark"):
        directory = project(executor, text)
        done = run_in_process("run", "spec.yaml", "--executor", executor, "--only",
                              "load_data", cwd=directory, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        if executor == "spark":
            assert "converting 3 file(s), 6,000 rows, in Spark tasks" in done.stderr
        shard_sets[executor] = Path(state_of(directory, "converted")["load_data"]["output"][
            "shards"])
    parts = json.loads((shard_sets["spark"] / "index.json").read_text())["splits"]["train"]
    assert len(parts) == 3  # one shard per task and split (the rows fit in one)
    local, spark = shard_rows_of(shard_sets["local"]), shard_rows_of(shard_sets["spark"])
    assert sum(len(rows) for rows in spark.values()) == 6_000
    assert spark == local


# -- 5. where streaming is decided and refused --------------------------------------------

def test_enabled_auto_streams_a_table_over_the_limit_and_keeps_a_small_one_in_memory(
        project, tables):
    big = project("big", spec_text("auto", tables["big"], streaming={
        "enabled": "auto", "in_memory_limit_mb": 1}))
    done = run_in_process("run", "spec.yaml", "--only", "load_data", cwd=big, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "data: streamed from shards (40,000 rows x 8 features = 1.2 MiB in memory > " \
           "1.0 MiB (data.streaming.in_memory_limit_mb))" in done.stderr
    assert state_of(big, "auto")["load_data"]["output"]["shards"]
    small = project("small", spec_text("auto", tables["small"], streaming={"enabled": "auto"}))
    done = run_in_process("run", "spec.yaml", "--only", "load_data", cwd=small, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "data: in memory (8,000 rows x 8 features = 250.0 KiB in memory <= " in done.stderr
    assert "(1/20 of the memory available: the in-memory path peaks near 10x the feature " \
        "matrix))" in done.stderr
    assert "shards" not in state_of(small, "auto")["load_data"]["output"]
    assert not (small / ".dbspec/shards").exists()


# -- on the standalone cluster: workers see the shared dir, not the driver's ----------------

def _cluster_run(spark_cluster, mlflow_server, directory: Path, *args: str, timeout: int = 900):
    from tests.spark.test_cluster import dbspec

    spark_cluster.wait_for_workers(2)  # a test before may have killed and restarted one
    spark_cluster.wait_until_idle()
    return dbspec("run", "spec.yaml", "--master", spark_cluster.master, *args, cwd=directory,
                  server=mlflow_server, timeout=timeout)


@pytest.mark.xdist_group("cluster")  # the session's cluster lives in the cluster tests' worker
def test_streaming_on_a_cluster_without_a_shared_dir_names_the_location(
        spark_cluster, mlflow_server, tmp_path):
    # the source is where the executors read it; the shards would go to this machine's state
    # dir, which the executors converting them cannot see
    table = write_table(spark_cluster.shared_dir / "unplaced-table", 4_000)
    (tmp_path / "spec.yaml").write_text(spec_text("unplaced", table,
                                                  streaming={"enabled": True}))
    done = _cluster_run(spark_cluster, mlflow_server, tmp_path, timeout=300)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "data.streaming.location: the shards are written or read on the executors of " \
           f"{spark_cluster.master}" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / ".dbspec/shards").exists()


@pytest.mark.xdist_group("cluster")
def test_streamed_ddp_on_the_cluster_converts_in_spark_tasks_and_trains_on_executors(
        spark_cluster, mlflow_server, tmp_path):
    from tests.cluster import worker_sees

    shared = spark_cluster.shared_dir / "streaming"
    table = write_table(spark_cluster.shared_dir / "streaming-table", 20_000, files=4)
    name = "cluster-streamed"
    (tmp_path / "spec.yaml").write_text(spec_text(
        name, table, epochs=2, streaming={"enabled": True},
        compute={"kind": "torch_distributor", "num_processes": 2, "use_gpu": False,
                 "local_mode": False}))
    assert not worker_sees(spark_cluster, tmp_path / "spec.yaml")
    done = _cluster_run(spark_cluster, mlflow_server, tmp_path, "--shared-dir", str(shared),
                        "--summary-json", "summary.json")
    output = done.stdout + done.stderr
    print(output[-6000:])
    assert done.returncode == 0, output[-4000:]
    assert "converting 4 file(s), 20,000 rows, in Spark tasks" in output
    stages = state_of(tmp_path, name)
    shard_root = Path(stages["load_data"]["output"]["shards"])
    assert shard_root.parent == shared / "shards"
    index = json.loads((shard_root / "index.json").read_text())
    assert index["rows"] == 20_000
    # one part per source file, each written by its own task
    parts = {s["file"].split("/")[1].split("-")[1] for s in index["splits"]["train"]}
    assert parts == {"00000", "00001", "00002", "00003"}
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["training"]["world_size"] == 2
    assert "executors of spark://" in summary["training"]["placement"]
    assert math.isfinite(summary["metrics"]["test_rmse"])
    ranks_dir = shared / "runs" / name / "train" / "distributed"
    ranks = [json.loads(p.read_text()) for p in sorted(ranks_dir.glob("rank-*.json"))]
    train_rows = stages["split"]["output"]["train"]
    assert sum(r["rows"] for r in ranks) == train_rows
    assert all(abs(r["rows"] - train_rows / 2) <= 1 for r in ranks), ranks
