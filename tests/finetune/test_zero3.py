"""``specs/text_finetune.yaml`` under DeepSpeed ZeRO-3 (issue 36): two ranks started by torchrun
as AI Runtime starts them (``compute.kind: serverless_gpu, strategy: deepspeed``), on the CPU
with gloo because this machine has no GPU (on GPUs the same code runs with nccl; only a GPU
machine can run that). ZeRO-3 partitions the checkpoint's parameters between the ranks, so
every forward pass is a collective: a rank that runs one alone waits for ever (the diagnosis's
FLOP count did, until the other ranks took part)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import ROOT, mlflow_pointed_at, run_in_process

pytestmark = pytest.mark.slow  # two DeepSpeed ranks fine-tuning (a minute or two here)

ZERO3 = ("compute: {kind: serverless_gpu, accelerator: GPU_1xH100, count: 2, "
         "strategy: deepspeed, zero_stage: 3}\n")


def test_zero3_fine_tunes_the_checkpoint_on_two_ranks_and_registers_a_scoring_model(tmp_path):
    import mlflow
    import pandas as pd

    spec = tmp_path / "zero3.yaml"
    spec.write_text((ROOT / "specs" / "text_finetune.yaml").read_text().replace(
        "checkpoint: specs/data/tiny_bert", f"checkpoint: {ROOT}/specs/data/tiny_bert")
        .replace("rows: 3000", "rows: 600") + ZERO3)
    store = f"sqlite:///{tmp_path}/mlflow.db"
    result = run_in_process("run", str(spec), "--smoke", "--summary-json", "s.json",
                            "--tracking-uri", store, cwd=tmp_path,
                            env={"HF_HUB_OFFLINE": "1"}, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "s.json").read_text())
    training = summary["training"]
    assert training["world_size"] == 2 and training["backend"] == "gloo"
    assert "by torchrun" in training["placement"]
    # the adapters, the pooler and the head: as on one process (test_run.py)
    assert 0 < training["trained_parameters"] < 0.2 * training["parameters"]
    # each rank built the checkpoint into its own partition (zero.Init), never the whole
    # model: half the checkpoint's weights (each tensor padded by at most one element), and
    # the adapters and head that peft adds after loading, whole until the engine partitions
    metrics = mlflow.MlflowClient(store).get_run(summary["run_id"]).data.metrics
    held = [metrics[f"rank_{rank}_held_parameters"] for rank in (0, 1)]
    trained, total = training["trained_parameters"], training["parameters"]
    assert all(trained < count <= trained + (total - trained) / 2 + 200 for count in held), \
        (held, trained, total)
    # rank 0 gathered the partitioned weights and merged the adapters into the logged model
    with mlflow_pointed_at(store):
        model = mlflow.pyfunc.load_model(
            f"models:/{summary['model_name']}/{summary['model_version']}")
    scored = pd.DataFrame(model.predict(pd.DataFrame({"text": ["zuto mopa", ""]})))
    assert scored["probability"].between(0, 1).all() and len(scored) == 2
