"""Every command on a SQLite store and on a real ``mlflow server`` (artifacts proxied).

Each test runs once per store. With the server, every dbspec process runs from its own working
directory and, where the machine allows it (root and ``unshare``), with the server's directory
hidden behind an empty tmpfs: whatever it logs must travel through the server's REST and
artifact API, and the test then finds it under the server's ``--artifacts-destination``. On
SQLite, with nothing to hide, the commands but ``serve`` run the CLI in this process.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import NamedTuple, Optional

import httpx
import numpy as np
import pytest

from tests.conftest import ROOT, checkout_env, run_in_process, run_main

SPEC = """\
name: tracked-regressor
data:
  source: {kind: sklearn, name: diabetes}
  task: regression
  preprocessing: [{standard_scale: all}]
model:
  layers: [{linear: {out: 16}}, relu, {linear: {out: 1}}]
training: {optimizer: {name: adam, lr: 0.01}, epochs: 4}
tracking: {experiment: tracking-store-test, tensorboard: true, system_metrics: false}
registry:
  name: tracking_store_regressor
  promotion:
    alias: production
    gates:
      - {metric: test_rmse, max: 1000}
      - {metric: test_rmse, better_than: production, tolerance: 1000}
serving: {mode: realtime}
"""
MODEL = "tracking_store_regressor"
SEARCH = """\
name: tracked-search
data:
  source: {kind: sklearn, name: breast_cancer}
  task: binary
  split: {validation: 0.25, test: 0.2, seed: 0}
  preprocessing: [standard_scale]
model: {layers: [{linear: {out: "{{ hidden }}"}}, relu, {linear: {out: 1}}]}
vars: {hidden: 8}
training: {epochs: 3, batch_size: 64, optimizer: {name: adam, lr: 0.001}}
tracking: {experiment: EXPERIMENT, tensorboard: true, system_metrics: false}
search:
  n_trials: 2
  sampler: {name: random, seed: 3}
  pruner: {name: none}
  metric: val_loss
  space:
    training.optimizer.lr: {float: [1.0e-3, 0.05], log: true}
    vars.hidden: {int: [4, 16]}
"""
SCORING = ROOT / "specs" / "data" / "diabetes_scoring.parquet"


class Store(NamedTuple):
    """A tracking store: its URI and, for the server, the directory it keeps to itself."""

    kind: str
    uri: str
    artifacts: Optional[Path] = None

    @property
    def private(self) -> Optional[Path]:
        """The server's own directory (database, artifacts), hidden from dbspec processes."""
        return self.artifacts.parent if self.artifacts is not None else None


@pytest.fixture(scope="module", params=["sqlite", "server"])
def store(request, tmp_path_factory) -> Store:
    if request.param == "server":
        server = request.getfixturevalue("mlflow_server")
        return Store("server", server.uri, server.artifacts)
    return Store("sqlite", f"sqlite:///{tmp_path_factory.mktemp('sqlite-store') / 'mlflow.db'}")


@functools.lru_cache(maxsize=1)
def can_hide() -> bool:
    """Whether a process can be started with a directory hidden (a private mount namespace)."""
    if not shutil.which("unshare") or os.geteuid() != 0:
        return False
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "true"],
                           capture_output=True)
    return probe.returncode == 0


def isolated(store: Store, argv: list[str]) -> list[str]:
    """``argv`` with the server's directory hidden behind an empty tmpfs, where possible."""
    if store.private is None or not can_hide():
        return argv
    script = f"mount -t tmpfs tmpfs {shlex.quote(str(store.private))} && exec {shlex.join(argv)}"
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", script]


def command(store: Store, *args: str) -> list[str]:
    """``python -m dbspec ARGS``, isolated from the server's disk."""
    return isolated(store, [sys.executable, "-m", "dbspec", *args])


def environment(store: Store) -> dict:
    env = checkout_env({"MLFLOW_TRACKING_URI": store.uri})
    env.pop("DBSPEC_TOKEN", None)  # serve without auth on 127.0.0.1
    return env


def dbspec(store: Store, *args: str, cwd: Path, timeout: float = 600) -> str:
    """Run a dbspec command as a user would; its stdout (the test fails with its stderr).

    On the server, a process of its own that cannot see the server's disk; on SQLite, where
    there is nothing to hide, the CLI in this process (no interpreter start, no imports again).
    """
    cwd.mkdir(parents=True, exist_ok=True)
    if store.private is None:
        result = run_in_process(*args, cwd=cwd, env={"MLFLOW_TRACKING_URI": store.uri},
                                timeout=int(timeout))
    else:
        result = subprocess.run(command(store, *args), cwd=cwd, env=environment(store),
                                capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"dbspec {shlex.join(args)} failed:\n{result.stderr[-4000:]}"
    assert "Traceback" not in result.stderr, result.stderr[-4000:]
    return result.stdout


@pytest.fixture
def on_store(store, monkeypatch, tmp_path):
    """For commands run in this process (``run_main``): the store in the environment, a fresh
    working dir, and MLflow's process-wide tracking URI put back afterwards."""
    from mlflow.tracking._tracking_service import utils

    previous = utils._tracking_uri  # what open_registry's set_tracking_uri replaces
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store.uri)
    monkeypatch.chdir(tmp_path)
    yield store
    import mlflow

    mlflow.set_tracking_uri(previous)


def in_process(*args: str) -> str:
    """A dbspec command in this process (no disk access to hide: registry calls only)."""
    code, out, err = run_main(*args)
    assert code == 0, f"dbspec {shlex.join(args)} failed:\n{err}"
    assert "Traceback" not in err, err
    return out


def client_of(store: Store):
    import mlflow

    return mlflow.MlflowClient(tracking_uri=store.uri, registry_uri=store.uri)


def server_files(store: Store, pattern: str) -> list[Path]:
    """Files under the server's --artifacts-destination matching ``pattern``."""
    return sorted(store.artifacts.glob(pattern))


class Trained(NamedTuple):
    workdir: Path
    spec: Path
    first: dict
    second: dict


@pytest.fixture(scope="module")
def trained(store, tmp_path_factory) -> Trained:
    """Two full runs of a small spec (the second with another learning rate): v1 and v2 of
    the model, both through every stage up to serve, @production ending on v2."""
    workdir = tmp_path_factory.mktemp(f"trained-{store.kind}")
    spec = workdir / "spec.yaml"
    spec.write_text(SPEC)
    summaries = []
    for index, extra in enumerate(([], ["--set", "training.optimizer.lr=0.03"])):
        dbspec(store, "run", str(spec), "-q", *extra, "--summary-json", f"run{index}.json",
               cwd=workdir)
        summaries.append(json.loads((workdir / f"run{index}.json").read_text()))
    return Trained(workdir, spec, *summaries)


def holder(store: Store, alias: str) -> str:
    return str(client_of(store).get_model_version_by_alias(MODEL, alias).version)


def predicted(store: Store, version: str, rows: np.ndarray) -> list[float]:
    """What a registered version predicts, loaded in this process from the store."""
    from dbspec.serving.source import ModelTarget, load_version

    loaded = load_version(client_of(store), ModelTarget(MODEL, version=version), version)
    return loaded.model.predict_frame(rows.astype(np.float32))["prediction"].tolist()


# Proves the register fix: on the server, `create_model_version` without the logged model's id
# fails the run in `register` with INVALID_PARAMETER_VALUE ("Invalid model version source");
# and that the whole pipeline (gates re-scoring the champion, the serve stage) works there, with
# every artifact stored by the server, none on the client's disk.
def test_a_full_run_registers_promotes_and_serves(store, trained):
    for summary, version, previous in ((trained.first, "1", None), (trained.second, "2", "1")):
        ran = [s["name"] for s in summary["stages"] if s["action"] == "ran"]
        assert {"train", "evaluate", "register", "promote", "serve"} <= set(ran)
        assert summary["model_name"] == MODEL and summary["model_version"] == version
        assert summary["promotion"] == "promoted" and summary["previous_alias_holder"] == previous
        assert summary["serve"]["model_version"] == version
    assert any("@production has" in gate for gate in trained.second["gates"])  # re-scored v1
    version = client_of(store).get_model_version(MODEL, "2")
    assert version.run_id == trained.second["run_id"]
    assert version.source == trained.second["model_uri"]
    model_id = trained.second["model_uri"].removeprefix("models:/")
    linked = json.loads(client_of(store).get_logged_model(model_id).tags["mlflow.modelVersions"])
    assert [(e["name"], str(e["version"])) for e in linked] == [(MODEL, "2")]  # once
    if store.kind == "server":
        experiment, run = trained.second["experiment_id"], trained.second["run_id"]
        assert server_files(store, f"{experiment}/models/{model_id}/artifacts/MLmodel")
        assert server_files(store, f"{experiment}/{run}/artifacts/tensorboard/*tfevents*")
        assert server_files(store, f"{experiment}/{run}/artifacts/evaluation/metrics.json")
        assert not list(trained.workdir.rglob("mlartifacts"))  # nothing logged locally
        assert not list(trained.workdir.rglob("*.db"))
        if can_hide():  # and the dbspec processes could not have put anything there
            seen = subprocess.run(isolated(store, [sys.executable, "-c",
                                                   "import os, sys; print(os.listdir(sys.argv[1]))",
                                                   str(store.artifacts.parent)]),
                                  capture_output=True, text=True, check=True).stdout
            assert seen.strip() == "[]" and list(store.artifacts.parent.iterdir())


# Proves the registry commands work on each store: listing, a gate-checked promote, a forced
# one, and a rollback to the earlier holder (on an alias of this test's own).
def test_models_promote_and_rollback(on_store, trained):
    store = on_store
    listed = json.loads(in_process("models", MODEL, "--format", "json"))
    assert [v["version"] for v in listed["versions"][-2:]] == ["2", "1"]
    assert any(g.startswith("test_rmse=") for g in listed["versions"][-1]["gates"])
    in_process("promote", MODEL, "1", "--alias", "staging")
    moved = in_process("promote", MODEL, "2", "--alias", "staging", "--force")
    assert f"{MODEL}@staging -> v2" in moved and holder(store, "staging") == "2"
    back = in_process("rollback", MODEL, "--alias", "staging")
    assert f"{MODEL}@staging -> v1 (rolled back from v2)" in back
    assert holder(store, "staging") == "1"


# Proves `dbspec serve models:/NAME@ALIAS` loads the alias holder from the store and answers a
# real HTTP request with that version's predictions.
def test_serve_answers_from_the_registry(store, trained, tmp_path):
    version = holder(store, "production")
    log = tmp_path / "serve.log"
    with log.open("w") as handle:
        process = subprocess.Popen(command(store, "serve", f"models:/{MODEL}@production",
                                           "--port", "0"),
                                   cwd=tmp_path, env=environment(store), stdout=handle,
                                   stderr=subprocess.STDOUT)
    try:
        url = wait_for_url(process, log)
        rows = scoring_rows(3)
        response = httpx.post(f"{url}/invocations", json={"inputs": rows.tolist()}, timeout=30)
        assert response.status_code == 200, response.text
        got = [p["prediction"] for p in response.json()["predictions"]]
        assert got == pytest.approx(predicted(store, version, rows), rel=1e-5)
        assert f"{MODEL} v{version}" in log.read_text()
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0, log.read_text()


def wait_for_url(process: subprocess.Popen, log: Path, seconds: float = 180) -> str:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and process.poll() is None:
        found = re.search(r" on (http://\S+)", log.read_text())
        if found:
            for _ in range(100):
                try:
                    httpx.get(found.group(1) + "/ping", timeout=5)
                    return found.group(1)
                except httpx.TransportError:
                    time.sleep(0.1)
        time.sleep(0.2)
    raise AssertionError(f"dbspec serve did not start:\n{log.read_text()}")


def scoring_rows(count: int) -> np.ndarray:
    import pandas as pd

    features = pd.read_parquet(SCORING).drop(columns=["patient_id"])
    return features.to_numpy(dtype=np.float64)[:count]


# Proves `dbspec predict` downloads the alias holder through the store and scores a table.
def test_predict_scores_a_table_with_the_alias_holder(store, trained, tmp_path):
    from deltalake import DeltaTable

    version = holder(store, "production")
    out = dbspec(store, "predict", f"models:/{MODEL}@production", "--input", str(SCORING),
                 "--output", str(tmp_path / "scored"), cwd=tmp_path)
    assert f"with {MODEL} v{version}" in out
    scored = DeltaTable(str(tmp_path / "scored")).to_pandas()
    assert len(scored) == 442 and set(scored["model_version"].astype(str)) == {version}


# Proves `dbspec tensorboard RUN_ID` fetches a run's event files through the store into a
# directory that has never seen the run.
def test_tensorboard_fetches_the_event_files(store, trained, tmp_path):
    run = trained.second["run_id"]
    printed = dbspec(store, "tensorboard", run, "--logdir-only", cwd=tmp_path)
    logdir = tmp_path / printed.strip().splitlines()[-1]  # a relative path is from the cwd
    assert run in str(logdir) and logdir.resolve().is_relative_to(tmp_path.resolve())
    assert list(logdir.glob("*tfevents*")), printed


# Proves `dbspec tensorboard SPEC` finds the spec's last training run in its state and fetches
# that run's event files from the store, and that an unknown run id is told as such by either
# store (not as "the store did not answer").
def test_tensorboard_finds_the_run_of_a_spec(on_store, trained, monkeypatch):
    monkeypatch.chdir(trained.workdir)
    logdir = Path(in_process("tensorboard", str(trained.spec), "--logdir-only").strip())
    assert trained.second["run_id"] in str(logdir) and list(logdir.glob("*tfevents*"))
    code, _, err = run_main("tensorboard", "0123456789abcdef", "--logdir-only")
    assert code == 1 and "no MLflow run 0123456789abcdef in this tracking store" in err


# Proves the --run-key hand-over: job tasks as separate processes, each in its own working
# directory with its own empty state dir, share stage state and files through the store alone
# (on the server: as artifacts the server keeps), through batch_predict. On the server only:
# tests/jobs/test_handover.py runs the same hand-over, in five tasks, on a SQLite store.
@pytest.mark.parametrize("store", ["server"], indirect=True)
def test_run_key_hands_stages_over_between_processes(store, tmp_path):
    key = f"job-{uuid.uuid4().hex[:8]}"
    spec = str(ROOT / "specs" / "diabetes_batch.yaml")
    pinned = ["--set", "registry.name=tracking_store_handover",
              "--set", "tracking.experiment=tracking-store-handover"]
    tasks = [["load_data,split,preprocess", "train"], ["evaluate", "register", "promote"],
             ["batch_predict"]]
    summaries = []
    for index, only in enumerate(tasks):
        task = tmp_path / f"task{index}"
        if "batch_predict" in only:  # the spec's batch input is relative to the working dir
            (task / "specs" / "data").mkdir(parents=True)
            shutil.copy(SCORING, task / "specs" / "data")
        dbspec(store, "run", spec, "--smoke", "-q", *pinned, *[a for s in only
                                                               for a in ("--only", s)],
               "--run-key", key, "--summary-json", "summary.json", cwd=task)
        summaries.append(json.loads((task / "summary.json").read_text()))
    last = summaries[-1]
    assert [s["name"] for s in last["stages"] if s["action"] == "ran"] == ["batch_predict"]
    assert last["batch_predict"]["rows"] == 442
    assert last["model_version"] == summaries[1]["model_version"]
    assert last["run_id"] == summaries[0]["run_id"]  # the training run, found through the key
    # the evaluate task fetched what it needs into its own, otherwise empty, state dir
    (stages,) = (tmp_path / "task1").glob(".dbspec/runs/*/key-*/stages")
    assert all(any((stages / name).iterdir()) for name in ("load_data", "split", "preprocess"))
    assert (stages / "train" / "served").is_dir()
    if store.kind == "server":
        pipeline = client_of(store).search_runs(
            [summaries[0]["experiment_id"]], f"tags.`dbspec.run_key` = '{key}'")[0]
        stages = server_files(store, f"*/{pipeline.info.run_id}/artifacts/dbspec/stages/*")
        assert {p.name for p in stages} >= {"load_data", "split", "preprocess", "train"}
        assert server_files(store, f"*/{pipeline.info.run_id}/artifacts/dbspec/state/train.json")


# Proves a search logs its trials as nested runs of the study's run on the store, and that
# their per-epoch metrics carry the wall-clock time of the epoch (they used to be logged at
# timestamp 0, which MLflow shows as 1970).
def test_search_trials_are_nested_runs_with_real_timestamps(store, tmp_path):
    experiment = f"tracking-store-search-{uuid.uuid4().hex[:8]}"
    (tmp_path / "search.yaml").write_text(SEARCH.replace("EXPERIMENT", experiment))
    started = int(time.time() * 1000)
    dbspec(store, "run", "search.yaml", "-q", "--summary-json", "s.json", cwd=tmp_path)
    finished = int(time.time() * 1000)
    summary = json.loads((tmp_path / "s.json").read_text())
    client = client_of(store)
    trials = client.search_runs([summary["experiment_id"]], "tags.`dbspec.trial` != ''")
    assert len(trials) == 2
    for trial in trials:
        assert trial.data.tags["mlflow.parentRunId"] == summary["search"]["study_run_id"]
        history = client.get_metric_history(trial.info.run_id, "val_loss")
        assert [m.step for m in sorted(history, key=lambda m: m.step)] == [0, 1, 2]
        stamps = [m.timestamp for m in sorted(history, key=lambda m: m.step)]
        assert all(started <= t <= finished for t in stamps), stamps
        assert stamps == sorted(stamps)
        if store.kind == "server":
            assert server_files(store, f"*/{trial.info.run_id}/artifacts/tensorboard/*tfevents*")
