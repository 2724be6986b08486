"""The course's own inference code, unchanged, on a model dbspec registered.

The course scores ``pd.DataFrame(X_test_scaled)`` (integer column names) with
``mlflow.pyfunc.load_model(...).predict`` and with ``mlflow.pyfunc.spark_udf`` applied to
``struct(*spark_df.columns)``; a dbspec model logged with a named signature refused all of it
(``Model is missing inputs ['age', 'sex', ...]``). The course also scales the features before
sending them, while a dbspec model scales inside: those rows are far outside the training range
and are flagged, not silently answered.
"""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import time

import httpx
import numpy as np
import pandas as pd
import pytest
from sklearn.datasets import load_diabetes

from tests.conftest import ROOT, checkout_env, mlflow_pointed_at, run_in_process
from tests.serving.conftest import FEATURES, NAME

URI = f"models:/{NAME}/1"


@pytest.fixture(scope="module")
def pyfunc_model(registered):
    """The course's ``load_model(models:/...)`` with the store in the environment, as a user's
    process has it; MLflow's global URIs and the environment are restored afterwards
    (``mlflow.set_registry_uri`` would leave MLFLOW_REGISTRY_URI set for later tests)."""
    import mlflow

    with mlflow_pointed_at(registered.tracking_uri):
        yield mlflow.pyfunc.load_model(URI)


@pytest.fixture(scope="module")
def rejecting_model(tmp_path_factory):
    """The diabetes smoke model trained with ``serving.out_of_range.action: reject``, loaded
    as the course loads it; its store's URI."""
    import mlflow

    workdir = tmp_path_factory.mktemp("rejecting")
    result = run_in_process("run", str(ROOT / "specs" / "diabetes.yaml"), "--smoke", "--quiet",
                            "--set", "serving.out_of_range.action=reject", cwd=workdir,
                            env={"MLFLOW_TRACKING_URI": ""}, timeout=600)
    assert result.returncode == 0, result.stderr
    store = f"sqlite:///{workdir / '.dbspec' / 'mlflow.db'}"
    with mlflow_pointed_at(store):
        yield mlflow.pyfunc.load_model(URI), store


def raw_features(rows: int = 20) -> np.ndarray:
    return load_diabetes().data[:rows]  # the units the diabetes spec trains on


def scaled_twice(rows: int = 20) -> np.ndarray:
    from sklearn.preprocessing import StandardScaler

    return StandardScaler().fit_transform(load_diabetes().data)[:rows]  # the course's X_scaled


def test_pyfunc_takes_positional_input_of_the_right_width(pyfunc_model):
    x = raw_features()
    named = pyfunc_model.predict(pd.DataFrame(x, columns=FEATURES))["prediction"].to_numpy()
    assert np.ptp(named) > 0
    shuffled = pd.DataFrame(x, columns=FEATURES)[FEATURES[::-1]].assign(id=range(len(x)))
    for given in (x, x.tolist(), pd.DataFrame(x), shuffled):
        got = pyfunc_model.predict(given)["prediction"].to_numpy()
        assert np.allclose(got, named, rtol=1e-6), type(given)


def test_pyfunc_says_when_the_width_or_the_names_are_wrong(pyfunc_model):
    from mlflow.exceptions import MlflowException

    with pytest.raises(MlflowException, match="declares 10 inputs"):  # MLflow counts first
        pyfunc_model.predict(raw_features()[:, :9])
    renamed = pd.DataFrame(raw_features(), columns=[f.upper() for f in FEATURES])
    with pytest.raises(Exception, match=r"the input has no column age, sex, .* send the 10 "
                                        r"columns age, sex"):
        pyfunc_model.predict(renamed)


def test_pyfunc_warns_about_rows_scaled_twice(pyfunc_model, caplog):
    with caplog.at_level(logging.WARNING, logger="dbspec.model"):
        pyfunc_model.predict(raw_features())
        assert not caplog.records
        pyfunc_model.predict(pd.DataFrame(scaled_twice()))
    [record] = caplog.records
    assert "of 20 row(s) lie far outside the model's training range" in record.getMessage()
    assert "scaled twice" in record.getMessage()


def test_the_specs_reject_holds_through_pyfunc_and_spark_udf(rejecting_model, spark):
    import mlflow
    from pyspark.sql.functions import struct

    model, store = rejecting_model
    assert np.ptp(model.predict(raw_features())["prediction"].to_numpy()) > 0
    refused = r"20 of 20 row\(s\) lie far outside .*\(serving.out_of_range: reject\)"
    with pytest.raises(ValueError, match=refused):
        model.predict(pd.DataFrame(scaled_twice()))
    frame = spark.createDataFrame(pd.DataFrame(scaled_twice(), columns=FEATURES))
    with mlflow_pointed_at(store):
        udf = mlflow.pyfunc.spark_udf(spark, model_uri=URI, result_type="double")
    with pytest.raises(Exception, match=r"serving.out_of_range: reject"):
        frame.withColumn("prediction", udf(struct(*frame.columns))).collect()


def test_spark_udf_on_a_struct_of_the_courses_integer_named_columns(registered, pyfunc_model,
                                                                    spark):
    import mlflow
    from pyspark.sql.functions import struct

    x = raw_features()
    spark_df = spark.createDataFrame(pd.DataFrame(x))  # columns "0".."9"
    with mlflow_pointed_at(registered.tracking_uri):
        predict_udf = mlflow.pyfunc.spark_udf(spark, model_uri=URI, result_type="double")
    scored = spark_df.withColumn("prediction", predict_udf(struct(*spark_df.columns)))
    got = np.array([row.prediction for row in scored.collect()])
    want = pyfunc_model.predict(x)["prediction"].to_numpy()
    assert np.allclose(got, want, rtol=1e-6)
    named = spark.createDataFrame(pd.DataFrame(x, columns=FEATURES)[FEATURES[::-1]])
    by_name = named.withColumn("prediction", predict_udf(struct(*named.columns)))
    assert np.allclose([row.prediction for row in by_name.collect()], want, rtol=1e-6)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.slow
def test_mlflow_models_serve_takes_positional_and_named_rows(registered, pyfunc_model,
                                                            tmp_path):
    port = _free_port()
    log = (tmp_path / "serve.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "models", "serve", "-m", URI, "--env-manager", "local",
         "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        env=checkout_env({"MLFLOW_TRACKING_URI": registered.tracking_uri}), stdout=log,
        stderr=subprocess.STDOUT, cwd=tmp_path)
    url = f"http://127.0.0.1:{port}/invocations"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/ping", timeout=2).raise_for_status()
                break
            except httpx.HTTPError:
                assert process.poll() is None, (tmp_path / "serve.log").read_text()
                assert time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
                time.sleep(0.5)
        x = raw_features(5)
        want = pyfunc_model.predict(x)["prediction"].to_numpy()
        bodies = [{"inputs": x.tolist()},
                  {"dataframe_split": {"data": x.tolist()}},
                  {"dataframe_split": {"columns": FEATURES[::-1], "data": x[:, ::-1].tolist()}},
                  {"dataframe_records": [dict(zip(FEATURES, row)) for row in x.tolist()]}]
        for body in bodies:
            answer = httpx.post(url, json=body, timeout=30)
            assert answer.status_code == 200, (body, answer.text)
            got = [p["prediction"] for p in answer.json()["predictions"]]
            assert np.allclose(got, want, rtol=1e-6), body
        narrow = httpx.post(url, json={"inputs": x[:, :9].tolist()}, timeout=30)
        assert narrow.status_code == 400 and "declares 10 inputs" in narrow.text
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_the_endpoint_flags_rows_scaled_twice_and_counts_them(serve):
    server = serve(URI, token=None)
    rows = scaled_twice(3).tolist()
    answer = httpx.post(server.url + "/invocations", json={"inputs": rows}, timeout=30)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert len(body["predictions"]) == 3
    assert body["warnings"][0].startswith("row 0: ")
    assert "far outside the training range" in body["warnings"][0]
    clean = httpx.post(server.url + "/invocations", json={"inputs": raw_features(3).tolist()},
                       timeout=30).json()
    assert "warnings" not in clean
    metrics = httpx.get(server.url + "/metrics", timeout=10).text
    [flagged] = [int(line.split()[1]) for line in metrics.splitlines()
                 if line.startswith("dbspec_out_of_range_rows_total ")]
    assert flagged == sum(1 for line in body["warnings"] if line.startswith("row "))
    assert 'dbspec_out_of_range_values_total{feature="' in metrics


def test_the_endpoint_refuses_rows_scaled_twice_with_reject(serve):
    server = serve(URI, "--out-of-range", "reject", token=None)
    answer = httpx.post(server.url + "/invocations",
                        json={"inputs": [raw_features(1)[0].tolist(),
                                         scaled_twice(2)[1].tolist()]}, timeout=30)
    assert answer.status_code == 422, answer.text
    message = answer.json()["message"]
    assert message.startswith("1 of 2 row(s) lie far outside the model's training range")
    assert "row 1: " in message and "scaled twice" in message
    assert httpx.post(server.url + "/invocations", json={"inputs": raw_features(2).tolist()},
                      timeout=30).status_code == 200
