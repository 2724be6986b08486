"""The serving targets, each used through the seam's registry as ``serve``, ``predict``, the
``batch_predict`` stage and ``endpoint`` use them: the local REST target is a real uvicorn server
driven over HTTP with httpx, the batch targets score real Parquet files (in this process and on
local Spark), and the Databricks endpoint target meets the real databricks-sdk (no workspace is
reachable from the tests, so only its refusal without credentials is run here; what it does
with a workspace is tests/serving/test_databricks_endpoint.py's, through the same target)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dbspec.seams.targets as seam
from dbspec.errors import DbspecError, UsageError
from dbspec.plugins import KindRegistry
from dbspec.seams.targets import (TARGETS, BatchRequest, EndpointRequest, ServingTarget,
                                  engines, find_target)
from tests.conftest import checkout_env
from tests.serving.conftest import FEATURES, NAME, registered  # noqa: F401  (a fixture)

BUILTINS = ("rest", "batch_local", "batch_spark", "databricks_endpoint")


@pytest.fixture(scope="module")
def model(registered):  # noqa: F811  (the fixture imported above)
    import mlflow

    from dbspec.serving.source import ModelTarget, load_version

    client = mlflow.MlflowClient(tracking_uri=registered.tracking_uri)
    return load_version(client, ModelTarget(NAME, version="1"), "1")


@pytest.fixture
def own_registry(monkeypatch):
    """A fresh TARGETS with the built-ins, so what a test registers is gone afterwards."""
    fresh = KindRegistry(TARGETS.group, TARGETS.noun, dict(TARGETS.builtins))
    monkeypatch.setattr(seam, "TARGETS", fresh)
    return fresh


def rows(n: int) -> pa.Table:
    rng = np.random.default_rng(3)
    return pa.table({"id": np.arange(n), **{f: rng.normal(0, 0.05, n) for f in FEATURES}})


def expected(model, table: pa.Table) -> np.ndarray:
    x = np.column_stack([np.asarray(table[f], dtype=np.float32) for f in FEATURES])
    return np.asarray(model.model.predict_frame(x)["prediction"], dtype=float)


def test_the_four_builtins_load_and_satisfy_the_protocol():
    assert tuple(TARGETS.builtins) == BUILTINS
    loaded = TARGETS.load_all()
    assert set(loaded) >= set(BUILTINS) and not TARGETS.failures()
    for name in BUILTINS:
        target = loaded[name]
        assert isinstance(target, ServingTarget) and target.name == name
        assert TARGETS.origin(name) == "built-in"
        assert isinstance(target.reads_table_names, bool) and target.summary


def test_each_mode_is_picked_by_its_engine():
    assert {e: t.name for e, t in engines("batch").items()} == {"local": "batch_local",
                                                                "spark": "batch_spark"}
    assert {e: t.name for e, t in engines("realtime").items()} == {
        "local": "rest", "databricks": "databricks_endpoint"}
    assert find_target("batch", "spark").reads_table_names  # a catalog table by name
    assert not find_target("batch", "local").reads_table_names


def test_an_unknown_engine_is_a_usage_error_with_the_closest_one():
    with pytest.raises(UsageError, match=r"no batch serving target runs on 'sprk' \(did you "
                                         r"mean 'spark'\?\); known engines: local, spark"):
        find_target("batch", "sprk")


def test_a_target_plugin_that_fails_to_load_is_named_when_no_target_fits(own_registry):
    own_registry.register("broken", "dbspec_no_such_target_package:TARGET")
    with pytest.raises(UsageError, match="serving targets that failed to load: broken: "
                                         "ModuleNotFoundError"):
        find_target("batch", "gpu_cluster")
    assert find_target("batch", "local").name == "batch_local"  # the others still serve


def test_batch_local_scores_a_parquet_file(model, tmp_path):
    table = rows(300)
    pq.write_table(table, tmp_path / "in.parquet")
    result = find_target("batch", "local").run(BatchRequest(
        model, str(tmp_path / "in.parquet"), str(tmp_path / "out"), fmt="parquet"))
    assert (result.rows, result.format, result.model_version) == (300, "parquet", "1")
    written = pq.read_table(tmp_path / "out").sort_by("id")
    assert np.allclose(written["prediction"].to_numpy(), expected(model, table), rtol=1e-5)


@pytest.mark.slow
def test_batch_spark_scores_in_the_given_session_or_the_active_one(model, spark, tmp_path):
    table = rows(200)
    pq.write_table(table, tmp_path / "in.parquet")
    target = find_target("batch", "spark")
    given = target.run(BatchRequest(model, str(tmp_path / "in.parquet"), str(tmp_path / "a"),
                                    fmt="parquet", session=spark))
    started = target.run(BatchRequest(model, str(tmp_path / "in.parquet"),
                                      str(tmp_path / "b"), fmt="parquet"))
    assert given.rows == started.rows == 200
    for out in ("a", "b"):
        written = pq.read_table(tmp_path / out).sort_by("id")
        assert np.allclose(written["prediction"].to_numpy(), expected(model, table), rtol=1e-5)
    assert spark.range(3).count() == 3  # the caller's session is left running


SERVE_THROUGH_REGISTRY = """\
import sys
import mlflow
from dbspec.seams.targets import TARGETS, ServeRequest
from dbspec.serving.source import ModelTarget, load_version
from dbspec.serving.use_cases import ServeFlags, serve_options

client = mlflow.MlflowClient(tracking_uri=sys.argv[1])
loaded = load_version(client, ModelTarget(sys.argv[2], version="1"), "1", without_torch=True)
options = serve_options(ServeFlags(port=0, no_auth=True), None)
TARGETS.get("rest").run(ServeRequest(loaded, options, say=lambda t: print(t, flush=True)))
"""


def test_rest_serves_over_http_until_interrupted(model, registered, tmp_path):  # noqa: F811
    log = tmp_path / "serve.log"
    with log.open("w") as handle:
        process = subprocess.Popen(
            [sys.executable, "-c", SERVE_THROUGH_REGISTRY, registered.tracking_uri, NAME],
            env=checkout_env({}), stdout=handle, stderr=subprocess.STDOUT)
    try:
        url = _wait_for_url(process, log)
        table = rows(5)
        x = np.column_stack([np.asarray(table[f]) for f in FEATURES])
        answer = httpx.post(url + "/invocations", json={"inputs": x.tolist()}, timeout=30)
        assert answer.status_code == 200, answer.text
        got = [p["prediction"] for p in answer.json()["predictions"]]
        assert np.allclose(got, expected(model, table), rtol=1e-5)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
    assert process.wait(timeout=60) == 0, log.read_text()
    assert "stopped" in log.read_text()


def _wait_for_url(process: subprocess.Popen, log) -> str:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and process.poll() is None:
        found = re.search(r"on (http://\S+)", log.read_text())
        if found:
            return found.group(1)
        time.sleep(0.1)
    process.kill()
    raise AssertionError(f"the rest target did not start:\n{log.read_text()}")


def test_databricks_endpoint_without_credentials_is_a_clear_error(monkeypatch, tmp_path):
    for name in [n for n in os.environ if n.startswith(("DATABRICKS_", "ARM_", "AZURE_"))]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.databrickscfg
    monkeypatch.setenv("DATABRICKS_CONFIG_FILE", str(tmp_path / "none.cfg"))
    target = find_target("realtime", "databricks")
    with pytest.raises(DbspecError, match="not authenticated to a Databricks workspace"):
        target.run(EndpointRequest(client=None, model=None, endpoint="ep",
                                   config=lambda version: None))


class EchoTarget:
    """A batch target registered at run time (as a notebook or a plugin would): it keeps the
    request and says it scored seven rows."""

    name = "echo"
    mode = "batch"
    engine = "echo"
    reads_table_names = True
    summary = "by the test's echo target"
    stage = "batch_predict"
    job_task = None

    def __init__(self):
        self.requests: list[BatchRequest] = []

    def check(self, spec):
        return ()

    def job_warnings(self, spec):
        return ()

    def run(self, request: BatchRequest):
        from dbspec.serving.batch import BatchResult

        self.requests.append(request)
        return BatchResult(rows=7, output=request.output, format=request.fmt,
                           input_version=None, output_version=None, seconds=0.5,
                           model_name=request.loaded.name, model_version=request.loaded.version)


def test_a_target_registered_at_run_time_is_used_by_predict(own_registry, registered,  # noqa: F811
                                                            tmp_path):
    from tests.conftest import run_in_process

    echo = EchoTarget()
    own_registry.register("echo", echo)
    assert isinstance(echo, ServingTarget)
    result = run_in_process("predict", f"models:/{NAME}/2", "--input", "main.ml.scoring",
                            "--output", str(tmp_path / "out"), "--engine", "echo",
                            "--format", "parquet", cwd=registered.workdir,
                            env={"MLFLOW_TRACKING_URI": registered.tracking_uri})
    assert result.returncode == 0, result.stderr
    assert f"scoring main.ml.scoring with models:/{NAME}/2 (v2) by the test's echo target" \
        in result.stderr
    assert f"wrote 7 rows to {tmp_path / 'out'} (parquet)" in result.stdout
    (request,) = echo.requests
    assert (request.source, request.fmt, request.loaded.version) == ("main.ml.scoring",
                                                                    "parquet", "2")
    assert find_target("batch", "echo") is echo and own_registry.origin("echo") == \
        "registered at run time"


@pytest.mark.parametrize("engine, refused", [("spark", False), ("local", True)])
def test_the_batch_stage_asks_the_target_whether_its_input_may_be_a_table(engine, refused):
    from dbspec.data.sources import DataError
    from dbspec.spec.sections import Spec
    from dbspec.stages.serving import BatchPredictStage

    spec = Spec.model_validate({
        "name": "x", "data": {"source": {"kind": "sklearn", "name": "diabetes"},
                              "task": "regression"},
        "model": {"layers": [{"linear": {"out": 1}}]}, "registry": {"name": "m"},
        "serving": {"mode": "batch", "batch": {"input": "main.ml.scoring", "output": "o",
                                               "engine": engine}}})
    if refused:  # a path in this process: it must be there
        with pytest.raises(DataError, match="serving.batch.input: main.ml.scoring does not "
                                            "exist"):
            BatchPredictStage.check(spec)
    else:  # a catalog table's name, read by Spark
        BatchPredictStage.check(spec)


def test_the_serving_mode_compiles_to_what_its_targets_say():
    """Plan stages, job tasks, validate checks and job warnings come from the mode's targets."""
    from dbspec.seams.targets import job_tasks, serving_stages

    assert serving_stages("batch") == ("batch_predict",)
    assert serving_stages("realtime") == ("serve",)
    assert serving_stages("none") == job_tasks("none") == ()
    assert job_tasks("realtime") == ("update_endpoint",)


def test_a_target_registered_at_run_time_adds_its_stage_and_checks(own_registry):
    from dbspec.seams.targets import Finding, serving_findings, serving_stages
    from dbspec.spec.sections import Spec

    class Nightly(EchoTarget):
        engine = "nightly"
        stage = "nightly_scoring"

        def check(self, spec):
            yield Finding(("serving", "batch"), "the nightly target wants a batch section")

    own_registry.register("nightly", Nightly())
    assert serving_stages("batch") == ("batch_predict", "nightly_scoring")
    spec = Spec.model_validate({
        "name": "x", "data": {"source": {"kind": "sklearn", "name": "diabetes"},
                              "task": "regression"},
        "model": {"layers": [{"linear": {"out": 1}}]}, "serving": {"mode": "batch"}})
    assert [f.message for f in serving_findings(spec)] == [
        "batch serving loads a registered model; add a registry section with a name",
        "mode batch needs a 'batch' section with input and output",
        "the nightly target wants a batch section"]
