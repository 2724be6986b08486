"""The fine-tuned text model of ``specs/text_finetune.yaml`` (issue 36) served and scored in
batch on raw strings: ``dbspec serve`` over HTTP, ``mlflow models serve``, ``dbspec predict
--engine spark`` and ``mlflow.pyfunc.spark_udf``, each answering what ``mlflow.pyfunc``
answers in process."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.conftest import mlflow_pointed_at, run_in_process
from tests.serving.conftest import Registered, start_server
from tests.servers import mlflow_models_serve

pytestmark = pytest.mark.slow  # the fine-tuning run, then servers and Spark

TEXTS = ["The mopa kilded the zuto near a tree.", "", "Who did what to whom?",
         "zuto mopa zuto", "words the checkpoint never saw: café, 42!"]


@pytest.fixture(scope="module")
def store(finetuned) -> tuple[Registered, str]:
    """The fine-tuning project as a store to serve from, and its version's ``models:/`` URI
    (by version: a smoke run's one epoch may not pass the accuracy gate)."""
    project, _ = finetuned
    summary = json.loads((project / "s.json").read_text())
    registered = Registered(project, f"sqlite:///{project}/.dbspec/mlflow.db",
                            summary["model_name"])
    return registered, f"models:/{summary['model_name']}/{summary['model_version']}"


@pytest.fixture(scope="module")
def expected(store):
    """What ``mlflow.pyfunc.load_model(...).predict`` answers for TEXTS: a frame of
    prediction and probability."""
    import mlflow
    import pandas as pd

    registered, uri = store
    with mlflow_pointed_at(registered.tracking_uri):
        scored = pd.DataFrame(mlflow.pyfunc.load_model(uri).predict(
            pd.DataFrame({"text": TEXTS})))
    assert scored["probability"].nunique() > 1  # texts that differ score differently
    return scored


def _check(response: httpx.Response, expected) -> None:
    assert response.status_code == 200, response.text
    rows = response.json()["predictions"]
    assert [r["prediction"] for r in rows] == expected["prediction"].tolist()
    assert [r["probability"] for r in rows] == pytest.approx(
        expected["probability"].tolist(), abs=1e-5)


BODIES = {"dataframe_split": {"dataframe_split": {"columns": ["text"],
                                                  "data": [[t] for t in TEXTS]}},
          "dataframe_records": {"dataframe_records": [{"text": t} for t in TEXTS]},
          "inputs as records": {"inputs": [{"text": t} for t in TEXTS]},
          "inputs as a column": {"inputs": {"text": TEXTS}}}


def test_dbspec_serve_scores_raw_text_over_http(store, expected, tmp_path):
    registered, uri = store
    server = start_server(registered, uri, token=None, log=tmp_path / "serve.log")
    try:
        with httpx.Client(timeout=60) as client:
            for name, body in BODIES.items():
                response = client.post(server.url + "/invocations", json=body)
                _check(response, expected)
            bad = client.post(server.url + "/invocations",
                              json={"dataframe_split": {"columns": ["text"], "data": [[5]]}})
        assert bad.status_code == 400, bad.text
        assert "column 'text', row 0: expected text (a string), got int 5" in bad.text
    finally:
        assert server.stop() == 0, server.output()


@pytest.fixture(scope="module")
def mlflow_scoring_server(store, tmp_path_factory):
    """``mlflow models serve`` of the fine-tuned version (MLflow's own server, this Python)."""
    registered, uri = store
    with mlflow_models_serve(uri, tmp_path_factory.mktemp("mlflow-serve"), {
            "MLFLOW_TRACKING_URI": registered.tracking_uri, "HF_HUB_OFFLINE": "1"}) as url:
        yield url


def test_mlflow_models_serve_scores_raw_text(mlflow_scoring_server, expected):
    for name, body in BODIES.items():
        _check(httpx.post(mlflow_scoring_server, json=body, timeout=60), expected)
    plain = httpx.post(mlflow_scoring_server, json={"inputs": TEXTS}, timeout=60)
    _check(plain, expected)


def test_dbspec_predict_on_spark_scores_a_parquet_file_of_text(store, expected, spark,
                                                               tmp_path):
    import pyarrow as pa
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    registered, uri = store
    pq.write_table(pa.table({"id": list(range(len(TEXTS))), "text": TEXTS}),
                   tmp_path / "in.parquet")
    result = run_in_process("predict", uri, "--input", str(tmp_path / "in.parquet"),
                            "--output", str(tmp_path / "out"), "--format", "parquet",
                            "--engine", "spark", "--tracking-uri", registered.tracking_uri,
                            cwd=registered.workdir, env={"HF_HUB_OFFLINE": "1"}, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    written = ds.dataset(str(tmp_path / "out"), format="parquet").to_table().sort_by("id")
    assert written["text"].to_pylist() == TEXTS
    assert written["prediction"].to_pylist() == expected["prediction"].tolist()
    assert written["probability"].to_pylist() == pytest.approx(
        expected["probability"].tolist(), abs=1e-5)


def test_spark_udf_scores_a_column_of_text(store, expected, spark):
    import mlflow
    from pyspark.sql.functions import struct

    registered, uri = store
    frame = spark.createDataFrame([(i, t) for i, t in enumerate(TEXTS)], "id long, text string")
    with mlflow_pointed_at(registered.tracking_uri):
        udf = mlflow.pyfunc.spark_udf(spark, model_uri=uri, env_manager="local",
                                      result_type="prediction double, probability double")
    scored = frame.withColumn("scored", udf(struct("text"))).orderBy("id").collect()
    assert [r.scored.prediction for r in scored] == expected["prediction"].astype(float).tolist()
    assert [r.scored.probability for r in scored] == pytest.approx(
        expected["probability"].tolist(), abs=1e-5)
