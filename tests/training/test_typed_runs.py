"""Typed features (text, categorical, image) trained by distributed ranks, for real: DDP
through TorchDistributor on local Spark, DeepSpeed (ZeRO-2, two CPU ranks), and on the
standalone cluster whose workers cannot
see the driver's files, tracked by the session's ``mlflow server``. The ranks build the typed
network from the model card alone; the logged model then scores raw rows (strings, PNG bytes)
loaded back from the tracking server. Nothing is mocked."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.conftest import run_in_process

pytestmark = pytest.mark.slow

WORDS = ["amber", "birch", "cedar", "dune", "ember", "fjord", "grove", "heath"]


def write_typed_table(path: Path, rows: int, seed: int = 0) -> Path:
    """A Parquet file whose binary target depends on word order in ``text`` (which of two
    words comes first), on a 30-value ``city`` and on a bright square in ``photo`` (8x8 PNG),
    with a numeric ``x`` beside them."""
    import pandas as pd
    from PIL import Image

    rng = np.random.default_rng(seed)
    records = []
    for _ in range(rows):
        first, second = rng.choice(len(WORDS), 2, replace=False)
        order = int(first < second)
        filler = " ".join(rng.choice(WORDS, 3))
        city = int(rng.integers(0, 30))
        square = int(rng.integers(0, 2))
        pixels = rng.integers(0, 60, (8, 8)).astype(np.uint8)
        if square:
            pixels[2:6, 2:6] = 230
        buffer = io.BytesIO()
        Image.fromarray(pixels, "L").save(buffer, "PNG")
        score = 2 * order - 1 + (0.8 if city % 3 == 0 else -0.4) + (square - 0.5)
        records.append({"text": f"{filler} {WORDS[first]} before {WORDS[second]}",
                        "city": f"c{city:02d}", "x": float(rng.normal()),
                        "photo": buffer.getvalue(), "target": int(score > 0)})
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(records).to_parquet(path, index=False)
    return path


def spec_text(name: str, table: Path, compute: dict) -> str:
    return yaml.safe_dump({
        "name": name,
        "data": {"source": {"kind": "parquet", "path": str(table)}, "task": "binary",
                 "features": ["x",
                              {"name": "text", "type": "text", "max_length": 10},
                              {"name": "city", "type": "categorical"},
                              {"name": "photo", "type": "image", "height": 8, "width": 8,
                               "channels": 1}],
                 "preprocessing": ["standard_scale"]},
        "model": {"encoders": {"text": {"kind": "gru", "dim": 16, "hidden": 16},
                               "city": {"kind": "embedding", "dim": 4},
                               "photo": {"kind": "cnn", "channels": [8]}},
                  "layers": [{"linear": {"out": 16}}, "relu", {"linear": {"out": 1}}]},
        "training": {"optimizer": {"name": "adam", "lr": 0.01}, "epochs": 6,
                     "batch_size": 64, "num_threads": 1},
        "compute": compute,
        "tracking": {"system_metrics": False},
        "registry": {"name": name.replace("-", "_")},
    }, sort_keys=False)


def state_of(directory: Path, name: str) -> dict:
    return json.loads((directory / ".dbspec/runs" / name / "state.json").read_text())["stages"]


def raw_rows(table: Path, rows: int = 16):
    import pyarrow.parquet as pq

    return pq.read_table(table).to_pandas().head(rows)


@pytest.mark.parametrize("compute", [
    {"kind": "torch_distributor", "num_processes": 2, "use_gpu": False, "local_mode": True},
    {"kind": "deepspeed", "num_gpus": 2, "use_gpu": False, "zero_stage": 2},
], ids=["torch_distributor", "deepspeed"])
def test_distributed_ranks_train_a_typed_model(workdir, compute):
    from dbspec.models.served import load_served_model

    table = write_typed_table(workdir / "data" / "typed.parquet", 3_000)
    name = "typed-ddp"
    (workdir / "spec.yaml").write_text(spec_text(name, table, compute))
    done = run_in_process("run", "spec.yaml", "-q", "--summary-json", "summary.json",
                          cwd=workdir, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    stages = state_of(workdir, name)
    assert stages["train"]["output"]["world_size"] == 2
    ranks_dir = workdir / ".dbspec/runs" / name / "stages/train/distributed"
    ranks = [json.loads(p.read_text()) for p in sorted(ranks_dir.glob("rank-*.json"))]
    assert [r["rank"] for r in ranks] == [0, 1]
    if compute["kind"] == "torch_distributor":
        # DDP kept the typed network equal, batch norm's running statistics included (it
        # broadcasts rank 0's buffers); DeepSpeed keeps the parameters equal but each rank's
        # running statistics are its own (the CNN encoder's batchnorm2d): rank 0's are saved
        assert ranks[0]["checksum"] == ranks[1]["checksum"]
    summary = json.loads((workdir / "summary.json").read_text())
    assert summary["metrics"]["test_accuracy"] > 0.85, summary["metrics"]
    served = load_served_model(workdir / ".dbspec/runs" / name / "stages/train/served")
    assert [i["type"] for i in served.card.inputs] == ["numeric", "text", "categorical",
                                                      "image"]
    frame = served.predict_frame(raw_rows(table))
    assert len(frame) == 16 and set(frame["prediction"]) <= {0, 1}


@pytest.mark.xdist_group("cluster")  # the session's cluster lives in the cluster tests' worker
def test_a_typed_model_trains_on_the_cluster_and_scores_raw_rows_from_the_server(
        spark_cluster, mlflow_server, tmp_path):
    import mlflow

    from tests.cluster import worker_sees
    from tests.spark.test_cluster import dbspec

    shared = spark_cluster.shared_dir / "typed"
    table = write_typed_table(spark_cluster.shared_dir / "typed-data" / "typed.parquet", 2_000,
                              seed=1)
    name = "cluster-typed"
    (tmp_path / "spec.yaml").write_text(spec_text(name, table, {
        "kind": "torch_distributor", "num_processes": 2, "use_gpu": False,
        "local_mode": False}))
    assert not worker_sees(spark_cluster, tmp_path / "spec.yaml")
    spark_cluster.wait_for_workers(2)
    spark_cluster.wait_until_idle()
    done = dbspec("run", "spec.yaml", "--master", spark_cluster.master, "--shared-dir",
                  str(shared), "--summary-json", "summary.json", cwd=tmp_path,
                  server=mlflow_server, timeout=900)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["training"]["world_size"] == 2
    assert "executors of spark://" in summary["training"]["placement"]
    assert math.isfinite(summary["metrics"]["test_loss"])
    assert summary["metrics"]["test_accuracy"] > 0.8, summary["metrics"]
    # the logged model, fetched from the tracking server, takes the raw columns by name
    mlflow.set_tracking_uri(mlflow_server.uri)
    model = mlflow.pyfunc.load_model(summary["model_uri"])
    inputs = {c.name: str(c.type).rsplit(".", 1)[-1]
              for c in model.metadata.get_input_schema().inputs}
    assert inputs == {"x": "double", "text": "string", "city": "string", "photo": "binary"}
    rows = raw_rows(table)
    predicted = model.predict(rows)
    served = model.unwrap_python_model().model
    assert predicted["prediction"].tolist() == \
        served.predict_frame(rows)["prediction"].tolist()
