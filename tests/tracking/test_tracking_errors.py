"""A tracking store that cannot be used is reported in seconds, with its cause, no traceback."""

from __future__ import annotations

import socket
import time

import pytest

from tests.conftest import ROOT, run_main
from tests.servers import free_port

DIABETES = str(ROOT / "specs" / "diabetes.yaml")
COMMANDS = {
    "run": ["run", DIABETES, "--smoke", "-q"],
    "run-key": ["run", DIABETES, "--smoke", "-q", "--run-key", "job-1"],
    "models": ["models", "some_model"],
    "promote": ["promote", "some_model", "1", "--alias", "production"],
    "rollback": ["rollback", "some_model", "--alias", "production"],
    "serve": ["serve", "models:/some_model@production", "--port", "0"],
    "predict": ["predict", "models:/some_model@production", "--input",
                str(ROOT / "specs" / "data" / "diabetes_scoring.parquet"), "--output", "out"],
    "tensorboard": ["tensorboard", "0123456789abcdef", "--logdir-only"],
}


# Proves every command that talks to MLflow refuses a tracking server nothing listens on within
# seconds (MLflow alone retries for about four minutes, then fails with a raw connection error
# in whatever stage logged first), saying which URI and what to do.
@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_tracking_server_that_is_not_running_is_reported_at_once(name, workdir, monkeypatch):
    uri = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    started = time.monotonic()
    code, _, err = run_main(*COMMANDS[name])
    assert code == 1, err
    assert f"the MLflow tracking server at {uri} does not answer (connection refused)" in err
    assert "MLFLOW_TRACKING_URI" in err and "Traceback" not in err
    assert time.monotonic() - started < 60
    if name == "run":  # refused before any stage, not at the first stage that logs
        assert not (workdir / ".dbspec" / "runs").exists()


# Proves a server that accepts connections but never answers is given up on after the probe's
# timeout instead of MLflow's two minutes per request.
def test_a_tracking_server_that_never_answers_times_out(workdir, monkeypatch):
    from dbspec.tracking import stores

    with socket.socket() as silent:  # listens, so connecting works, but never replies
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        uri = f"http://127.0.0.1:{silent.getsockname()[1]}"
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        monkeypatch.setattr(stores, "_PROBE_SECONDS", 1.0)
        code, _, err = run_main("models", "some_model")
    assert code == 1
    assert f"the MLflow tracking server at {uri} does not answer (no answer within 1 s)" in err
    assert "Traceback" not in err


# Proves a hand-over whose files cannot be fetched names the stage and the run instead of
# leaking MLflow's or the OS's traceback (here the download's scratch path is taken by a file).
def test_stage_files_that_cannot_be_fetched_name_the_stage(tmp_path):
    from dbspec.errors import DbspecError
    from dbspec.executors.state import MlflowState

    def state(name: str) -> MlflowState:
        return MlflowState(tmp_path / name, tracking_uri=f"sqlite:///{tmp_path / 'm.db'}",
                           experiment="handover-errors", key="k", tags={},
                           state_dir=tmp_path / name)

    producer = state("producer")
    (producer.stage_dir("split") / "rows.json").parent.mkdir(parents=True)
    (producer.stage_dir("split") / "rows.json").write_text("[1, 2]")
    producer.publish("split")
    consumer = state("consumer")
    consumer.stage_dir("split").parent.mkdir(parents=True)
    (consumer.stage_dir("split").parent / ".split.download").write_text("in the way")
    with pytest.raises(DbspecError, match=r"cannot fetch the files of stage 'split' from "
                                          rf"MLflow run {producer.run_id}: "):
        consumer.fetch(["split"])
    state("again").fetch(["split"])  # and without the obstacle the same fetch works
    assert (tmp_path / "again" / "key-k" / "stages" / "split" / "rows.json").read_text() == \
        "[1, 2]"
