"""DDP through pyspark's TorchDistributor on local Spark, 2 gloo processes on the CPU.

A real distributor, a real Spark session and real process groups: nothing is mocked.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import ROOT
from tests.conftest import run_main as run

pytestmark = pytest.mark.slow
SPEC = str(ROOT / "specs" / "diabetes_distributed.yaml")


def test_two_gloo_ranks_match_single_process_quality(workdir):
    code, _, err = run("run", SPEC, "--set", "training.epochs=60", "--summary-json", "ddp.json",
                       "--set", "tracking.tensorboard=true")
    assert code == 0, err
    ddp = json.loads((workdir / "ddp.json").read_text())
    assert ddp["diagnosis"]  # from rank 0's monitor
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{workdir / '.dbspec' / 'mlflow.db'}")
    events = client.list_artifacts(ddp["run_id"], "tensorboard")
    assert any("tfevents" in a.path for a in events)  # rank 0 wrote them
    run_dir = workdir / ".dbspec" / "runs" / "diabetes-distributed" / "stages" / "train"
    ranks = [json.loads(p.read_text()) for p in sorted((run_dir / "distributed").glob("rank-*.json"))]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert ranks[0]["checksum"] == ranks[1]["checksum"]  # DDP kept every rank's weights equal
    state = json.loads((run_dir.parent.parent / "state.json").read_text())
    assert state["stages"]["train"]["output"]["world_size"] == 2
    assert state["stages"]["train"]["output"]["backend"] == "gloo"
    text = (ROOT / "specs" / "diabetes_distributed.yaml").read_text()
    compute = text[text.index("compute:"):text.index("registry:")]
    (workdir / "single.yaml").write_text(text.replace(compute, "compute: {kind: local}\n"))
    code, _, err = run("run", "single.yaml", "--set", "training.epochs=60",
                       "--summary-json", "single.json")
    assert code == 0, err
    single = json.loads((workdir / "single.json").read_text())
    # two ranks of batch 32 make an effective batch of 64 with the same learning rate, so the
    # optimisation path differs; the model must still be as good within 10% test RMSE
    assert ddp["metrics"]["test_rmse"] <= single["metrics"]["test_rmse"] * 1.10
    assert ddp["metrics"]["test_rmse"] < 65


def test_a_failing_rank_fails_the_stage_cleanly(workdir):
    code, _, err = run("run", SPEC, "--set", "compute.backend=nccl", "--set", "training.epochs=2")
    assert code == 1
    assert "stage 'train' failed: TorchDistributor failed" in err
    assert "rank-0" in err and "resume with:" in err
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{workdir / '.dbspec' / 'mlflow.db'}")
    assert client.search_registered_models() == []


DEEPSPEED = str(ROOT / "specs" / "synthetic_deepspeed.yaml")


def test_deepspeed_zero2_on_cpu_keeps_ranks_equal_and_learns(workdir, tmp_path, monkeypatch):
    # an empty torch extensions dir: on the old code DeepSpeed JIT-compiled its CPU
    # shared-memory op into it (minutes, g++); it falls back to gloo's all-reduce now
    extensions = tmp_path / "torch_extensions"
    extensions.mkdir()
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(extensions))
    code, _, err = run("run", DEEPSPEED, "--set", "data.source.rows=6000", "--set",
                       "training.epochs=3", "--summary-json", "ds.json")
    assert code == 0, err
    assert list(extensions.iterdir()) == [], "a DeepSpeed op was compiled"
    summary = json.loads((workdir / "ds.json").read_text())
    run_dir = workdir / ".dbspec" / "runs" / "synthetic-deepspeed" / "stages" / "train"
    ranks = [json.loads(p.read_text()) for p in sorted((run_dir / "distributed").glob("rank-*.json"))]
    assert len(ranks) == 2 and ranks[0]["checksum"] == ranks[1]["checksum"]
    job = json.loads((run_dir / "distributed" / "job.json").read_text())
    assert job["deepspeed"]["zero_optimization"]["stage"] == 2
    assert job["deepspeed"]["bf16"] == {"enabled": True}
    # 6,000 rows of a 10-informative-feature problem: a linear model gets ~0.9 accuracy
    assert summary["metrics"]["test_accuracy"] > 0.8


def test_deepspeed_refuses_a_bad_zero_setting_before_any_work(workdir):
    code, _, err = run("run", DEEPSPEED, "--set",
                       "compute.config={zero_optimization: {bogus_key: 1}}")
    assert code == 1 and "DeepSpeed refuses the generated config" in err
    assert not (workdir / ".dbspec" / "runs").exists()


def test_generated_deepspeed_config():
    from dbspec.spec import load_spec
    from dbspec.compute.deepspeed import deepspeed_config

    spec = load_spec(DEEPSPEED, target="prod").spec
    config = deepspeed_config(spec)
    assert config["train_micro_batch_size_per_gpu"] == 128
    assert config["gradient_accumulation_steps"] == 2
    assert config["gradient_clipping"] == 1.0
    assert config["zero_optimization"] == {"stage": 2, "offload_optimizer": {"device": "cpu"}}
    assert config["steps_per_print"] == 1000  # compute.config wins over the generated value


FLAKY = """\
name: flaky-ddp
data: {source: {kind: sklearn, name: diabetes}, task: regression, preprocessing: [standard_scale]}
model: {custom: {class: "tests.helpers.flaky:FlakyNet"}}
training: {epochs: 12, batch_size: 32, optimizer: {name: sgd, lr: 0.05}}
compute: {kind: torch_distributor, num_processes: 2, use_gpu: false}
tracking: {system_metrics: false}
registry: {name: flaky_ddp}
"""


def test_a_failed_distributed_run_resumes_from_its_last_checkpoint(workdir, monkeypatch):
    import mlflow

    (workdir / "flaky.yaml").write_text(FLAKY)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the ranks import tests.helpers.flaky
    monkeypatch.setenv("DBSPEC_TEST_FAIL_AFTER", "30")  # 5 steps an epoch: fails in epoch 7
    code, _, err = run("run", "flaky.yaml", "-q")
    assert code == 1 and "injected failure" in err and "resume with:" in err
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{workdir / '.dbspec' / 'mlflow.db'}")
    assert client.search_registered_models() == []  # nothing registered from a failed run
    checkpoints = workdir / ".dbspec/runs/flaky-ddp/stages/train/checkpoints"
    assert sorted(p.name for p in checkpoints.glob("epoch-*.pt"))  # the last good ones stay
    monkeypatch.delenv("DBSPEC_TEST_FAIL_AFTER")
    code, _, err = run("run", "flaky.yaml", "--resume", "--summary-json", "s.json")
    assert code == 0, err
    state = json.loads((workdir / ".dbspec/runs/flaky-ddp/state.json").read_text())
    assert state["stages"]["train"]["output"]["resumed_from_epoch"] >= 5
    assert json.loads((workdir / "s.json").read_text())["model_version"] == "1"


FLAKY_DEEPSPEED = """\
name: flaky-deepspeed
data: {source: {kind: synthetic, rows: 3000, features: 10, seed: 2}, task: binary}
model: {custom: {class: "tests.helpers.flaky:FlakyNet"}}
training: {epochs: 6, batch_size: 64, precision: bf16}
compute: {kind: deepspeed, num_gpus: 2, use_gpu: false, zero_stage: 2}
tracking: {system_metrics: false}
registry: {name: flaky_deepspeed}
"""


def test_a_failed_deepspeed_run_resumes_from_its_zero_checkpoint(workdir, monkeypatch):
    (workdir / "flaky.yaml").write_text(FLAKY_DEEPSPEED)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.setenv("DBSPEC_TEST_FAIL_AFTER", "50")  # 15 steps an epoch: fails in epoch 4
    code, _, err = run("run", "flaky.yaml", "-q")
    assert code == 1 and "injected failure" in err
    checkpoints = workdir / ".dbspec/runs/flaky-deepspeed/stages/train/checkpoints"
    assert (checkpoints / "epoch-2" / ".complete").exists()
    monkeypatch.delenv("DBSPEC_TEST_FAIL_AFTER")
    code, _, err = run("run", "flaky.yaml", "--resume", "--summary-json", "s.json")
    assert code == 0, err
    state = json.loads((workdir / ".dbspec/runs/flaky-deepspeed/state.json").read_text())
    assert state["stages"]["train"]["output"]["resumed_from_epoch"] == 3
    assert json.loads((workdir / "s.json").read_text())["training"]["epochs_run"] == 6
