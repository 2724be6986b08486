"""``dbspec run`` end to end with real MLflow (SQLite in a temp dir), stage caching and resume."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.conftest import run_main as run
from tests.helpers.pause import run_until_paused

SPECS = ROOT / "specs"


def client_for(workdir: Path):
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{workdir / '.dbspec' / 'mlflow.db'}")
    return mlflow.MlflowClient()


@pytest.fixture(scope="module")
def diabetes_run(tmp_path_factory):
    """One full run of the README's diabetes spec, shared by the tests that read it."""
    workdir = tmp_path_factory.mktemp("diabetes")
    previous = Path.cwd()
    saved = os.environ.pop("MLFLOW_TRACKING_URI", None)
    os.chdir(workdir)
    try:
        code, out, err = run("run", str(SPECS / "diabetes.yaml"), "--summary-json", "summary.json")
        yield workdir, code, out, err, json.loads((workdir / "summary.json").read_text())
    finally:
        os.chdir(previous)
        if saved is not None:
            os.environ["MLFLOW_TRACKING_URI"] = saved


def test_diabetes_learns_registers_and_promotes(diabetes_run):
    workdir, code, out, err, summary = diabetes_run
    assert code == 0, err
    assert summary["metrics"]["test_rmse"] <= 58  # the course demo ends near 169
    assert summary["model_name"] == "diabetes_predictor" and summary["model_version"] == "1"
    # two stages: the gates move @staging; @production waits for `dbspec approve`
    assert summary["aliases_set"] == {"staging": "1"}
    assert summary["promotion"] == "awaiting_approval"
    assert {"run_id", "experiment_id", "gates", "metrics"} <= set(summary)
    assert re.search(r"model version +diabetes_predictor v1", out)
    assert "dbspec approve diabetes_predictor 1 --alias production" in out
    client = client_for(workdir)
    version = client.get_model_version_by_alias("diabetes_predictor", "staging")
    assert version.tags["dbspec.decision"] == "promoted"
    assert json.loads(version.tags["dbspec.approval.production"])["state"] == "pending"
    assert json.loads(version.tags["dbspec.gate.0"])["passed"] is True
    run_data = client.get_run(summary["run_id"]).data
    assert run_data.params["training.optimizer.lr"] == "0.005"
    assert run_data.tags["dbspec.data_version"].startswith("sklearn-")
    history = client.get_metric_history(summary["run_id"], "val_loss")
    assert len(history) == summary["training"]["epochs_run"]
    artifacts = {a.path for a in client.list_artifacts(summary["run_id"], "plots")}
    assert artifacts == {"plots/loss_curve.png", "plots/residuals.png"}
    assert {a.path for a in client.list_artifacts(summary["run_id"], "spec")} == {
        "spec/diabetes.yaml", "spec/resolved.yaml"}


def test_logged_model_takes_raw_rows(diabetes_run):
    import mlflow
    import numpy as np
    from sklearn.datasets import load_diabetes

    workdir, *_, summary = diabetes_run
    client_for(workdir)
    model = mlflow.pyfunc.load_model(summary["model_uri"])
    frame = load_diabetes(as_frame=True).data.head(20)
    predictions = model.predict(frame)["prediction"]
    assert predictions.between(25, 346).all()  # the target's range, in its own units
    schema = model.metadata.get_input_schema()  # positional, so unnamed input gets through
    assert not schema.has_input_names() and len(schema.inputs) == len(frame.columns)
    assert model.metadata.metadata["dbspec_features"] == list(frame.columns)
    positional = model.predict(frame.to_numpy())["prediction"]
    assert np.allclose(positional, predictions)


def test_unchanged_rerun_skips_every_stage(diabetes_run, monkeypatch):
    workdir, *_ = diabetes_run
    monkeypatch.chdir(workdir)
    # the spec as it is, once more: other tests of this module may have run a changed spec
    # since the module's run, in whatever order they ran
    assert run("run", str(SPECS / "diabetes.yaml"), "-q")[0] == 0
    code, out, err = run("run", str(SPECS / "diabetes.yaml"))
    assert code == 0
    assert re.search(r"stages run +none \(all unchanged\)", out)
    assert err.count("unchanged, skipped") == 8


def test_changed_training_reruns_downstream_and_rescores_the_champion(diabetes_run, monkeypatch):
    workdir, *_ = diabetes_run
    monkeypatch.chdir(workdir)
    # 7 epochs: a value no other test of this module trains with, so train runs whatever
    # ran before it
    code, out, _ = run("run", str(SPECS / "diabetes.yaml"), "--set", "training.epochs=7",
                       "--summary-json", "second.json")
    assert code == 0
    second = json.loads((workdir / "second.json").read_text())
    ran = [s["name"] for s in second["stages"] if s["action"] == "ran"]
    assert ran == ["train", "evaluate", "register", "promote", "serve"]
    versions = client_for(workdir).search_model_versions("name='diabetes_predictor'")
    assert second["model_version"] == str(max(int(v.version) for v in versions)) != "1"
    versus = second["gates"][1]
    assert "@staging has" in versus  # the holder was re-scored on this run's test split


def test_fail_on_reject_gives_ci_an_exit_code(workdir):
    """A version the gates reject is a successful run (exit 0) unless --fail-on-reject."""
    weak = ("run", str(SPECS / "diabetes.yaml"), "--smoke", "-q",
            "--set", "training.optimizer.lr=1e-9")  # an untrained net: test_rmse > 65
    code, out, err = run(*weak, "--fail-on-reject")
    assert code == 3, out + err
    assert re.search(r"promotion +rejected", out)
    assert re.search(r"error: the promotion gates rejected diabetes_predictor\S* v1 "
                     r"\(--fail-on-reject\)", err)
    code, out, _ = run(*weak)  # the same rejected version, now without the flag
    assert code == 0 and re.search(r"promotion +rejected", out)


def test_models_promote_rollback_commands(diabetes_run, monkeypatch):
    workdir, *_ = diabetes_run
    monkeypatch.chdir(workdir)
    # a second version, whatever order the tests run in (cached when it already exists)
    assert run("run", str(SPECS / "diabetes.yaml"), "--set", "training.epochs=5", "-q")[0] == 0
    code, out, _ = run("models", "diabetes_predictor")
    assert code == 0 and "v1" in out and "@staging" in out
    code, _, err = run("promote", "diabetes_predictor", "1", "--alias", "canary")
    assert code == 0
    code, out, _ = run("models", "diabetes_predictor", "--format", "json")
    described = json.loads(out)
    assert "canary" in next(v for v in described["versions"] if v["version"] == "1")["aliases"]
    code, out, _ = run("promote", "diabetes_predictor", "2", "--alias", "canary", "--force")
    assert code == 0 and "(was v1)" in out
    code, out, _ = run("rollback", "diabetes_predictor", "--alias", "canary")
    assert code == 0 and "-> v1 (rolled back from v2)" in out
    code, _, err = run("rollback", "diabetes_predictor", "--alias", "nope")
    assert code == 1 and "no earlier holder" in err
    code, _, err = run("models", "diabetes_predictr")
    assert code == 1 and "did you mean 'diabetes_predictor'" in err


def test_only_and_from(diabetes_run, monkeypatch):
    workdir, *_ = diabetes_run
    monkeypatch.chdir(workdir)
    spec = str(SPECS / "diabetes.yaml")
    assert run("run", spec, "--set", "training.epochs=5", "-q")[0] == 0  # state: epochs=5
    code, _, err = run("run", spec, "--only", "evaluate")
    assert code == 2 and "the output of 'train' is missing or stale" in err
    code, out, err = run("run", spec, "--set", "training.epochs=5", "--only", "evaluate")
    assert code == 0 and re.search(r"stages run +evaluate\n", out)
    code, out, _ = run("run", spec, "--set", "training.epochs=5", "--from", "register", "-q")
    assert code == 0 and re.search(r"stages run +register, promote, serve\n", out)
    code, _, err = run("run", spec, "--only", "evaluat")
    assert code == 2 and "did you mean 'evaluate'" in err


def test_only_without_recorded_inputs_is_a_usage_error(workdir):
    code, _, err = run("run", str(SPECS / "diabetes.yaml"), "--only", "train")
    assert code == 2 and "the output of 'load_data' is missing" in err


@pytest.mark.parametrize("spec", ["diabetes.yaml", "monitoring_synthetic.yaml", "digits_cnn.yaml",
                                  "breast_cancer_search.yaml"])
def test_example_specs_run_in_smoke_mode(workdir, spec):
    code, out, err = run("run", str(SPECS / spec), "--smoke", "--summary-json", "s.json")
    assert code == 0, err
    summary = json.loads((workdir / "s.json").read_text())
    assert summary["training"]["epochs_run"] == 1
    assert all(s["action"] == "ran" for s in summary["stages"])
    if summary["model_name"]:
        assert summary["model_name"].endswith("_smoke")  # never the real registry entry


BROKEN_DATA = """\
name: broken-data
data:
  source: {kind: csv, path: rows.csv}
  task: regression
  target: %s
model: {layers: [{linear: {out: 1}}]}
registry: {name: never_registered}
"""


@pytest.mark.parametrize("content, target, message", [
    (None, "y", "error: data.source.path: .*rows.csv does not exist"),
    # found from the CSV's header before any stage runs
    ("a,b,y\n1,2,3\n4,5,6\n", "z", "spec.yaml:5:11: data.target: no column 'z' in rows.csv; "
                                   "its header has: a, b, y"),
    ("a,b,y\n1,x,3\n4,5,6\n", "y", "non-numeric columns b"),
    ("a,b,y\n1,,3\n4,5,6\n7,8,9\n1,2,3\n5,5,5\n", "y", "missing values in b"),
])
def test_bad_data_fails_the_stage_cleanly(workdir, content, target, message):
    if content is not None:
        (workdir / "rows.csv").write_text(content)
    (workdir / "spec.yaml").write_text(BROKEN_DATA % target)
    code, _, err = run("run", "spec.yaml")
    assert code == 1
    assert re.search(message, err), err
    if "stage '" in message:  # a data error: rerunning the same command would not help
        assert "fix the data or the spec (or its --set values), then run again; finished " \
               "stages are kept: dbspec run spec.yaml" in err and "--resume" not in err
    assert "Traceback" not in err
    client = client_for(workdir)
    assert client.search_registered_models() == []


def test_tracking_uri_from_the_environment_wins(workdir, monkeypatch):
    store = workdir / "elsewhere.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store}")
    code, out, err = run("run", str(SPECS / "diabetes.yaml"), "--smoke")
    assert code == 0, err
    assert f"sqlite:///{store}" in out and store.exists()
    assert not (workdir / ".dbspec" / "mlflow.db").exists()


RESUMABLE = """\
name: resumable
data:
  source: {kind: synthetic, rows: 20000, features: 20, seed: 1}
  task: binary
model: {layers: [{linear: {out: 64}}, relu, {linear: {out: 1}}]}
training: {epochs: 6, batch_size: 64, optimizer: {name: sgd, lr: 0.01}}
tracking: {system_metrics: false}
registry: {name: resumable_model}
"""


@pytest.mark.slow
def test_kill_9_during_training_then_resume(workdir):
    # the run stops at a pause point in its third epoch, once two checkpoints exist, and is
    # killed there: mid-training by construction, so few epochs suffice (60 were a margin)
    (workdir / "spec.yaml").write_text(RESUMABLE)
    checkpoints = workdir / ".dbspec" / "runs" / "resumable" / "stages" / "train" / "checkpoints"
    process = run_until_paused(["run", "spec.yaml", "-q"], "train.epoch.2",
                               workdir / "paused", cwd=workdir, timeout=120)
    assert len(list(checkpoints.glob("epoch-*.pt"))) == 2
    process.send_signal(signal.SIGKILL)
    process.communicate(timeout=30)
    assert process.returncode == -signal.SIGKILL
    client = client_for(workdir)
    assert client.search_registered_models() == []  # a dead run registers nothing
    code, out, err = run("run", "spec.yaml", "--resume", "--summary-json", "s.json")
    assert code == 0, err
    summary = json.loads((workdir / "s.json").read_text())
    assert "train (resuming)" in err
    state = json.loads((workdir / ".dbspec/runs/resumable/state.json").read_text())
    assert state["stages"]["train"]["output"]["resumed_from_epoch"] == 2
    assert summary["training"]["epochs_run"] == 6
    assert summary["model_version"] == "1"


@pytest.mark.slow
def test_logged_model_is_servable_by_mlflow_models_serve(diabetes_run):
    import socket
    import urllib.request

    workdir, *_, summary = diabetes_run
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    mlflow_cli = shutil.which("mlflow")
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{workdir / '.dbspec' / 'mlflow.db'}"}
    server = subprocess.Popen([mlflow_cli, "models", "serve", "-m", summary["model_uri"], "-h",
                               "127.0.0.1", "-p", str(port), "--env-manager", "local"],
                              cwd=workdir, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise AssertionError("mlflow models serve did not come up")
                time.sleep(0.5)
        columns = ["age", "sex", "bmi", "bp", "s1", "s2", "s3", "s4", "s5", "s6"]
        body = json.dumps({"dataframe_split": {"columns": columns, "data": [[0.0] * 10]}})
        request = urllib.request.Request(f"http://127.0.0.1:{port}/invocations", body.encode(),
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            answer = json.loads(response.read())
        (row,) = answer["predictions"]
        assert 25 <= row["prediction"] <= 346
    finally:
        server.terminate()
        server.wait(timeout=30)
