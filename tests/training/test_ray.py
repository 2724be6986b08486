"""``compute.kind: ray``: Ray Train workers in a Ray cluster started on local Spark.

Real Ray on Spark (``setup_ray_cluster`` on a ``local[2]`` session: a head node on the driver,
two worker nodes as Spark tasks), a real ``TorchTrainer`` and real gloo process groups; nothing
is mocked but the missing-Ray case. Ray on Spark takes ~40 s to start here (Ray waits a fixed
20 s for its head node), so the module starts one cluster, through dbspec's own
``ray_on_spark``, and the runs use it as they would a notebook's cluster.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.conftest import run_main as run

EPOCHS = 10


def spec_text(name: str, compute: str) -> str:
    """specs/diabetes_distributed.yaml with another name, registry and compute, no targets."""
    text = (ROOT / "specs" / "diabetes_distributed.yaml").read_text()
    text = text[:text.index("targets:")].replace("name: diabetes-distributed", f"name: {name}")
    text = text.replace("name: diabetes_ddp", f"name: {name.replace('-', '_')}")
    return text.replace(text[text.index("compute:"):text.index("registry:")],
                        f"compute: {compute}\n")


RAY = "{kind: ray, num_workers: 2, use_gpu: false}"


@pytest.fixture(scope="module")
def ray_cluster(spark):
    """One Ray-on-Spark cluster for the module, on the module's local[2] session."""
    pytest.importorskip("ray.util.spark")
    import ray

    from dbspec.compute.ray import RayCompute
    from dbspec.training.ray_launch import ray_on_spark

    # the token any local ray.init() leaves in ~/.ray: with it, Ray on Spark never came up
    # (the head node turned token auth on, its worker nodes failed InvalidAuthToken)
    token = Path.home() / ".ray" / "auth_token"
    planted = not token.exists()
    if planted:
        token.parent.mkdir(exist_ok=True)
        token.write_text("0" * 64)
    lines: list[str] = []
    try:
        with ray_on_spark(spark, RayCompute(kind="ray", num_workers=2), use_gpu=False,
                          say=lines.append) as where:
            assert where.startswith("2 Ray worker nodes in Spark tasks of local[2]"), where
            assert ray.cluster_resources()["CPU"] == 2
            yield lines
    finally:
        if planted:
            token.unlink(missing_ok=True)
    assert not ray.is_initialized() and "RAY_ADDRESS" not in os.environ  # shut down
    assert "RAY_AUTH_MODE" not in os.environ


def _client(workdir):
    import mlflow

    return mlflow.MlflowClient(tracking_uri=f"sqlite:///{workdir / '.dbspec' / 'mlflow.db'}")


@pytest.mark.slow
def test_two_ray_workers_train_and_register_as_torch_distributor_does(ray_cluster, workdir):
    (workdir / "ray.yaml").write_text(spec_text("diabetes-ray", RAY))
    code, _, err = run("run", "ray.yaml", "--set", f"training.epochs={EPOCHS}",
                       "--summary-json", "ray.json")
    assert code == 0, err
    assert "Ray: using the running Ray cluster (2 CPUs" in err
    assert "Ray Train: 2 workers (gloo) trained in" in err
    summary = json.loads((workdir / "ray.json").read_text())
    assert summary["training"]["world_size"] == 2 and summary["training"]["backend"] == "gloo"
    assert summary["training"]["placement"].startswith("on Ray Train workers:")
    assert summary["model_version"] == "1"
    client = _client(workdir)
    assert [m.name for m in client.search_registered_models()] == ["diabetes_ray"]
    epochs_run = summary["training"]["epochs_run"]
    history = client.get_metric_history(summary["run_id"], "train_loss")
    assert sorted(m.step for m in history) == list(range(epochs_run))  # rank 0 alone, once each
    run_dir = workdir / ".dbspec" / "runs" / "diabetes-ray" / "stages" / "train"
    ranks = [json.loads(p.read_text())
             for p in sorted((run_dir / "distributed").glob("rank-*.json"))]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert ranks[0]["checksum"] == ranks[1]["checksum"]  # DDP kept the workers' weights equal
    assert not list((run_dir / "distributed").glob("shard-*.pt"))

    # the same spec through TorchDistributor: same shards, seed and gloo all-reduce, so the
    # same weights (measured: bit-identical checksums and test metrics)
    (workdir / "td.yaml").write_text(spec_text(
        "diabetes-td", "{kind: torch_distributor, num_processes: 2, use_gpu: false}"))
    code, _, err = run("run", "td.yaml", "--set", f"training.epochs={EPOCHS}",
                       "--summary-json", "td.json")
    assert code == 0, err
    torch_distributor = json.loads((workdir / "td.json").read_text())
    td_rank = json.loads((workdir / ".dbspec/runs/diabetes-td/stages/train/distributed"
                                    "/rank-0.json").read_text())
    assert td_rank["checksum"] == pytest.approx(ranks[0]["checksum"], rel=1e-6)
    assert torch_distributor["metrics"]["test_rmse"] == \
        pytest.approx(summary["metrics"]["test_rmse"], rel=1e-4)
    assert torch_distributor["training"]["epochs_run"] == epochs_run


FLAKY = """\
name: flaky-ray
data: {source: {kind: sklearn, name: diabetes}, task: regression, preprocessing: [standard_scale]}
model: {custom: {class: "tests.helpers.flaky:FlakyNet"}}
training: {epochs: 12, batch_size: 32, optimizer: {name: sgd, lr: 0.05}}
compute: {kind: ray, num_workers: 2, use_gpu: false}
tracking: {system_metrics: false}
registry: {name: flaky_ray}
"""


@pytest.mark.slow
def test_a_failing_ray_worker_fails_the_stage_with_its_python_error(ray_cluster, workdir,
                                                                     monkeypatch):
    (workdir / "flaky.yaml").write_text(FLAKY)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the workers import tests.helpers.flaky
    monkeypatch.setenv("DBSPEC_TEST_FAIL_AFTER", "30")  # 5 steps an epoch: fails in epoch 7
    code, _, err = run("run", "flaky.yaml", "-q")
    assert code == 1
    assert "stage 'train' failed: Ray Train failed: rank-" in err
    assert "RuntimeError: injected failure" in err and "resume with:" in err
    assert "Traceback" not in err  # the worker's error, not Ray's snippet of its stack
    assert _client(workdir).search_registered_models() == []
    checkpoints = workdir / ".dbspec/runs/flaky-ray/stages/train/checkpoints"
    assert sorted(p.name for p in checkpoints.glob("epoch-*.pt"))  # rank 0's last good ones


def test_without_ray_the_run_stops_before_any_stage_naming_the_extra(workdir, monkeypatch):
    (workdir / "ray.yaml").write_text(spec_text("diabetes-ray", RAY))
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    code, _, err = run("run", "ray.yaml")
    assert code == 1
    assert "compute.kind ray needs Ray Train and Ray on Spark: pip install 'dbspec[ray]'" in err
    assert not (workdir / ".dbspec" / "runs").exists()


def test_the_ray_cluster_is_sized_from_the_spec():
    from dbspec.compute.ray import RayCompute
    from dbspec.training.ray_sizing import ray_layout

    four = RayCompute(kind="ray", num_workers=4, cpus_per_worker=2)
    cluster = ray_layout(four, use_gpu=True, master="spark://driver:7077").setup_arguments()
    assert {k: cluster[k] for k in ("max_worker_nodes", "min_worker_nodes",
                                    "num_cpus_worker_node", "num_gpus_worker_node",
                                    "num_cpus_head_node", "num_gpus_head_node")} == \
        {"max_worker_nodes": 4, "min_worker_nodes": 4, "num_cpus_worker_node": 2,
         "num_gpus_worker_node": 1, "num_cpus_head_node": 0, "num_gpus_head_node": 0}
    two = RayCompute(kind="ray", num_workers=2)
    local = ray_layout(two, use_gpu=False, master="local[2]", parallelism=2)
    assert (local.worker_nodes, local.cpus_per_node, local.head_cpus) == (2, None, 0)
    assert "num_cpus_worker_node" not in local.setup_arguments()  # local: spark.task.cpus
    packed = ray_layout(two, use_gpu=False, master="local[8]", task_cpus=4, parallelism=8)
    assert packed.worker_nodes == 1  # two 1-CPU workers in one 4-CPU task
    for head in (ray_layout(two, use_gpu=True, master="local[2]", parallelism=2),
                 ray_layout(four, use_gpu=False, master="local[2]", parallelism=2),
                 ray_layout(two, use_gpu=False, master="local[1]", parallelism=1)):
        assert head.min_worker_nodes == 0 and head.head_cpus > 0  # no task slot needed
        assert head.where.startswith("the Ray head node on this machine")
    gpus = ray_layout(two, use_gpu=True, master="local[2]", parallelism=2)
    assert (gpus.head_cpus, gpus.head_gpus) == (2, 2)


def test_worker_failures_are_worded_one_line_each():
    from dbspec.training.ray_launch import propagated_env, worker_cause

    class WorkerGroupError(Exception):
        worker_failures = {1: ValueError("bad shape"), 0: RuntimeError("[gloo] closed")}

    failed = WorkerGroupError("Training failed:\nTraceback ...")
    assert worker_cause(failed) == \
        "rank-0: RuntimeError: [gloo] closed; rank-1: ValueError: bad shape"
    assert worker_cause(failed, skip={0}) == "rank-1: ValueError: bad shape"
    assert propagated_env({"PYTHONPATH": "/x", "DBSPEC_A": "1", "MLFLOW_TRACKING_TOKEN": "t",
                           "HOME": "/root"}) == \
        {"PYTHONPATH": "/x", "DBSPEC_A": "1", "MLFLOW_TRACKING_TOKEN": "t"}
