"""Crash consistency of ``dbspec run``: one run per run directory, dead runs ended KILLED,
metrics complete after kill -9 and resume, SIGTERM flushes, state errors are errors, and
Optuna's heartbeats reclaim only dead workers' trials."""

from __future__ import annotations

import http.server
import json
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dbspec.executors.lock import RunLock, RunLocked
from tests.conftest import MINIMAL, run_in_process
from tests.helpers.pause import kill_paused, run_until_paused

EPOCHS = 8
SPEC = MINIMAL + f"""\
training: {{epochs: {EPOCHS}, checkpointing: {{every_n_epochs: 3}}}}
tracking: {{system_metrics: false}}
"""
EPOCH_METRICS = ("train_loss", "val_loss", "lr", "epoch_seconds")


def client_for(workdir: Path):
    import mlflow

    return mlflow.MlflowClient(tracking_uri=f"sqlite:///{workdir / '.dbspec' / 'mlflow.db'}")


def train_run(workdir: Path) -> str:
    return json.loads((workdir / ".dbspec/runs/minimal/stages/train/run.json").read_text())[
        "run_id"]


def dead_pid() -> int:
    """The PID of a process that has exited (and been reaped)."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def _try_lock(directory, barrier, results):
    barrier.wait()
    try:
        held = RunLock(Path(directory)).acquire("dbspec run x")  # (a lock let go is released)
        results.put("won")
        time.sleep(1.0)  # hold it while the others try
        held.release()
    except RunLocked:
        results.put("refused")


def test_simultaneous_starts_have_one_winner(tmp_path):
    context = multiprocessing.get_context("fork")
    barrier, results = context.Barrier(6), context.Queue()
    processes = [context.Process(target=_try_lock, args=(str(tmp_path), barrier, results))
                 for _ in range(6)]
    for process in processes:
        process.start()
    outcomes = sorted(results.get(timeout=30) for _ in processes)
    for process in processes:
        process.join(timeout=30)
    assert outcomes == ["refused"] * 5 + ["won"]


def test_lock_names_its_holder_and_a_dead_holder_is_taken_over(tmp_path):
    first = RunLock(tmp_path).acquire("dbspec run x")
    with pytest.raises(RunLocked) as refused:
        RunLock(tmp_path).acquire("dbspec run x")
    message = str(refused.value)
    assert "\n" not in message and f"pid {os.getpid()} on host {socket.gethostname()}" in message
    first.release()
    again = RunLock(tmp_path).acquire("dbspec run x")
    assert again.previous is None  # a clean release leaves no holder behind
    again.release()
    # what a kill -9 leaves: the holder's name in a file nobody locks any more
    (tmp_path / "run.lock").write_text(json.dumps({"pid": dead_pid(), "host": "h",
                                                   "started": "T"}))
    taken = RunLock(tmp_path).acquire("dbspec run x")
    assert taken.previous["host"] == "h"
    taken.release()


def test_second_run_is_refused_then_kill_9_and_resume_log_every_epoch_once(workdir):
    (workdir / "spec.yaml").write_text(SPEC)
    marker = workdir / "paused"
    # checkpoints are written after epochs 2 and 5: paused after epoch 5, before its
    # checkpoint, the kill loses the buffered metrics and the resume retrains epochs 3-5
    process = run_until_paused(["run", "spec.yaml", "-q"], "train.epoch.5", marker,
                               cwd=workdir)
    checkpoints = workdir / ".dbspec/runs/minimal/stages/train/checkpoints"
    try:
        before = sorted(p.name for p in checkpoints.iterdir())
        second = run_in_process("run", "spec.yaml", "-q", cwd=workdir, timeout=60)
        assert second.returncode == 1, second.stderr
        (line,) = second.stderr.strip().splitlines()
        assert "is already running" in line and f"pid {process.pid} on host" in line
        assert sorted(p.name for p in checkpoints.iterdir()) == before == ["epoch-2.pt"]
    finally:
        kill_paused(process)
    client = client_for(workdir)
    run_id = train_run(workdir)
    assert client.get_run(run_id).info.status == "RUNNING"  # what kill -9 leaves
    resumed = run_in_process("run", "spec.yaml", "--resume", cwd=workdir, timeout=240)
    assert resumed.returncode == 0, resumed.stderr
    assert "taking over" in resumed.stderr and f"pid {process.pid}" in resumed.stderr
    assert f"MLflow run {run_id} (" in resumed.stderr and "marked KILLED" in resumed.stderr
    assert "train (resuming)" in resumed.stderr
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert f"process {process.pid}" in run.data.tags["dbspec.ended_by"]
    for key in EPOCH_METRICS:
        steps = sorted(m.step for m in client.get_metric_history(run_id, key))
        assert steps == list(range(EPOCHS)), (key, steps)


def test_the_next_run_ends_runs_of_dead_processes_killed(workdir):
    (workdir / "spec.yaml").write_text(SPEC)
    client = client_for(workdir)
    experiment = client.create_experiment("minimal")
    here = socket.gethostname()

    def running(pid, host, target=""):
        return client.create_run(experiment, tags={
            "dbspec.spec": "minimal", "dbspec.target": target, "dbspec.pid": str(pid),
            "dbspec.host": host}).info.run_id

    killed = dead_pid()
    dead, live = running(killed, here), running(os.getpid(), here)
    elsewhere, other_target = running(dead_pid(), "another-host"), running(dead_pid(), here, "t")
    lock = workdir / ".dbspec/runs/minimal/run.lock"  # as the kill -9 left it
    lock.parent.mkdir(parents=True)
    lock.write_text(json.dumps({"pid": killed, "host": here, "started": "T"}))
    # the next run of the spec ends them: this one stops at a usage error right after
    result = run_in_process("run", "spec.yaml", "--only", "evaluate", cwd=workdir)
    assert result.returncode == 2, result.stderr
    assert f"MLflow run {dead} (" in result.stderr
    assert client.get_run(dead).info.status == "KILLED"
    assert "died while the run was RUNNING" in client.get_run(dead).data.tags["dbspec.ended_by"]
    for untouched in (live, elsewhere, other_target):
        assert client.get_run(untouched).info.status == "RUNNING"


class _SigtermReachedTheTest(BaseException):
    pass


def test_sigterm_flushes_the_metrics_and_ends_the_run_killed(workdir):
    (workdir / "spec.yaml").write_text(SPEC)
    marker = workdir / "paused"

    def terminate_when_paused():
        deadline = time.monotonic() + 120
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)

    def unhandled(signum, frame):  # the run's own handler replaces this one while it runs
        raise _SigtermReachedTheTest()

    previous = signal.signal(signal.SIGTERM, unhandled)
    threading.Thread(target=terminate_when_paused, daemon=True).start()
    try:
        # epoch 3 is not checkpointed: its metrics sit in the buffer when SIGTERM comes
        result = run_in_process("run", "spec.yaml", "-q", cwd=workdir, timeout=120, env={
            "DBSPEC_PAUSE_AT": "train.epoch.3", "DBSPEC_PAUSE_FILE": str(marker)})
    except _SigtermReachedTheTest:
        pytest.fail("SIGTERM was not handled by the run")
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert result.returncode == 143, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: stopped by SIGTERM during stage 'train'")
    assert "resume with: dbspec run spec.yaml --resume" in line
    client = client_for(workdir)
    run = client.get_run(train_run(workdir))
    assert run.info.status == "KILLED"
    for key in EPOCH_METRICS:
        assert sorted(m.step for m in client.get_metric_history(run.info.run_id, key)) == \
            [0, 1, 2, 3]
    state = json.loads((workdir / ".dbspec/runs/minimal/state.json").read_text())
    assert state["stages"]["train"]["status"] == "failed"
    assert not (workdir / ".dbspec/runs/minimal/run.lock").read_text()  # released cleanly


def test_a_resumed_training_logs_each_epoch_once(workdir):
    from dbspec.spec.loader import load_spec
    from dbspec.tracking.mlflow_tracking import Tracker

    (workdir / "spec.yaml").write_text(SPEC)
    spec = load_spec("spec.yaml").spec
    history = [{"train_loss": 1.0 / (i + 1), "lr": 0.1} for i in range(8)]
    killed = Tracker(spec, workdir / ".dbspec")
    with killed.run() as run_id:  # trained epochs 0-5; 2 and 3 were still buffered at the kill
        for epoch in (0, 1, 4, 5):
            killed.log_epoch(history[epoch], epoch)
    resumed = Tracker(spec, workdir / ".dbspec")
    with resumed.run(run_id):  # from the checkpoint of epoch 2: epochs 3-7 are trained again
        resumed.resume_epochs()
        for epoch in range(3, 8):
            resumed.log_epoch(history[epoch], epoch)
        assert resumed.log_missing_epochs(history) == 2  # epoch 2's two metrics
        assert resumed.log_missing_epochs(history) == 0
    for key in ("train_loss", "lr"):
        logged = resumed.client.get_metric_history(run_id, key)
        assert sorted(m.step for m in logged) == list(range(8))


class _FailingArtifacts(http.server.BaseHTTPRequestHandler):
    """A tracking server whose runs answer and whose artifact store is down (503)."""

    RUN = {"info": {"run_id": "r1", "run_uuid": "r1", "experiment_id": "1", "status": "FINISHED",
                    "artifact_uri": "mlflow-artifacts:/1/r1/artifacts", "lifecycle_stage":
                    "active", "start_time": 1}, "data": {"tags": []}}

    def _answer(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):  # noqa: N802 (http.server's names)
        path = self.path.split("?")[0]
        if path == "/health":
            self._answer(200, {})
        elif path.endswith("/experiments/get-by-name"):
            self._answer(200, {"experiment": {"experiment_id": "1", "name": "minimal",
                                              "lifecycle_stage": "active"}})
        elif path.endswith("/runs/get"):
            self._answer(200, {"run": self.RUN})
        else:
            self._answer(503, {"error_code": "TEMPORARILY_UNAVAILABLE",
                               "message": "artifact store unavailable"})

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path.endswith("/runs/search"):
            self._answer(200, {"runs": [self.RUN]})
        else:
            self._answer(503, {"error_code": "TEMPORARILY_UNAVAILABLE", "message": "down"})

    def log_message(self, *args):
        pass


def test_a_tracking_error_while_loading_stage_state_is_an_error(workdir):
    (workdir / "spec.yaml").write_text(SPEC)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FailingArtifacts)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        uri = f"http://127.0.0.1:{server.server_address[1]}"
        result = run_in_process("run", "spec.yaml", "--run-key", "k1", cwd=workdir, timeout=60,
                                env={"MLFLOW_TRACKING_URI": uri,
                                     "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"})
    finally:
        server.shutdown()
    assert result.returncode == 1, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: --run-key k1: cannot use the stage state in MLflow run r1")
    assert "artifact store unavailable" in line or "503" in line
    assert not (workdir / ".dbspec/runs/minimal/key-k1/stages").exists()  # nothing redone


def test_heartbeats_reclaim_only_trials_of_dead_workers(tmp_path, monkeypatch):
    import optuna
    from optuna.trial import TrialState

    import dbspec.tuning.storage as tuning

    monkeypatch.setattr(tuning, "HEARTBEAT_SECONDS", 1)
    monkeypatch.setattr(tuning, "GRACE_SECONDS", 1)
    storage = tuning.open_storage(f"sqlite:///{tmp_path / 'optuna.db'}")
    study = optuna.create_study(study_name="s", storage=storage)
    dead, killed_here, live = study.ask(), study.ask(), study.ask()
    storage.record_heartbeat(dead._trial_id)  # its worker beat once, then was killed
    killed_here.set_user_attr(tuning.WORKER_ATTR, {**tuning.worker_attr(), "pid": dead_pid()})
    live.set_user_attr(tuning.WORKER_ATTR, tuning.worker_attr())
    stop = threading.Event()

    def beat():  # a live worker: Optuna's heartbeat thread does this while a trial runs
        while not stop.is_set():
            storage.record_heartbeat(live._trial_id)
            stop.wait(0.3)

    worker = threading.Thread(target=beat)
    worker.start()
    try:
        time.sleep(2.2)  # past the grace period (SQLite's clock has whole seconds)
        assert tuning.fail_stale_trials(study) == (2, 1)
    finally:
        stop.set()
        worker.join()
    states = {t.number: t.state for t in study.get_trials()}
    assert states == {dead.number: TrialState.FAIL, killed_here.number: TrialState.FAIL,
                      live.number: TrialState.RUNNING}
