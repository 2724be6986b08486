"""The trials' MLflow runs, written in the background: complete, in order, errors not lost."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from dbspec.tuning.trial_runs import TrialOutcome, TrialRuns, TrialRunSettings

SETTINGS = TrialRunSettings(tracking_uri="unused", experiment_id="7", parent_run_id="parent",
                            study_name="s", spec_name="spec", target="")


class FakeClient:
    """Records the calls an MlflowClient would get, and the thread each came from."""

    def __init__(self, fail_on=None):
        self.calls, self.threads, self.fail_on = [], set(), fail_on

    def _record(self, name, *args, **kwargs):
        self.threads.add(threading.get_ident())
        if name == self.fail_on:
            raise RuntimeError(f"{name} refused")
        self.calls.append((name, args, kwargs))

    def create_run(self, experiment_id, start_time=None, tags=None, run_name=None):
        self._record("create_run", experiment_id, start_time=start_time, tags=tags,
                     run_name=run_name)
        return SimpleNamespace(info=SimpleNamespace(run_id=f"run-{run_name}"))

    def log_batch(self, run_id, metrics=(), params=(), tags=(), synchronous=None):
        self._record("log_batch", run_id, metrics=list(metrics), params=list(params),
                     tags=list(tags))

    def log_artifacts(self, run_id, local_dir, artifact_path=None):
        self._record("log_artifacts", run_id, artifact_path)

    def set_terminated(self, run_id, status=None, end_time=None):
        self._record("set_terminated", run_id, status=status, end_time=end_time)


def outcome(state="complete", value=0.5, events=None, error=""):
    return TrialOutcome(history=[{"val_loss": 0.9}, {"val_loss": 0.5}], stamps=[1000, 2000],
                        state=state, value=value, error=error, events=events, ended_ms=3000)


def test_a_trial_run_is_written_in_order_off_the_trial_thread(tmp_path):
    (tmp_path / "events").mkdir()
    client, cleaned = FakeClient(), []
    runs = TrialRuns(SETTINGS, client)
    run = runs.start(3, {"training.optimizer.lr": 0.01})
    runs.finish(run, outcome(events=tmp_path / "events"), cleanup=lambda: cleaned.append(1))
    runs.close()
    names = [name for name, _, _ in client.calls]
    assert names == ["create_run", "log_batch", "log_artifacts", "log_batch", "log_batch",
                     "set_terminated"]
    create = client.calls[0][2]
    assert create["run_name"] == "trial-3" and create["tags"]["mlflow.parentRunId"] == "parent"
    assert create["tags"]["dbspec.trial"] == "3" and create["start_time"] > 0
    assert [(p.key, p.value) for p in client.calls[1][2]["params"]] == \
        [("training.optimizer.lr", "0.01")]
    metrics = {(m.key, m.step, m.timestamp, m.value) for m in client.calls[3][2]["metrics"]}
    assert metrics == {("val_loss", 0, 1000, 0.9), ("val_loss", 1, 2000, 0.5),
                       ("trial_value", 0, 3000, 0.5)}
    assert [(t.key, t.value) for t in client.calls[4][2]["tags"]] == \
        [("dbspec.trial_state", "complete")]
    assert client.calls[5][2] == {"status": "FINISHED", "end_time": 3000}
    assert cleaned == [1]
    assert threading.get_ident() not in client.threads


def test_a_failed_trial_ends_failed_with_its_error():
    client = FakeClient()
    runs = TrialRuns(SETTINGS, client)
    runs.finish(runs.start(0, {}), outcome(state="failed", value=None, error="loss became nan"))
    runs.close()
    tags = [(t.key, t.value) for t in client.calls[-2][2]["tags"]]
    assert tags == [("dbspec.trial_state", "failed"), ("dbspec.error", "loss became nan")]
    assert client.calls[-1][2]["status"] == "FAILED"


@pytest.mark.parametrize("failing", ["create_run", "set_terminated"])
def test_a_write_that_fails_stops_the_study(failing):
    client, cleaned = FakeClient(fail_on=failing), []
    runs = TrialRuns(SETTINGS, client)
    runs.finish(runs.start(0, {}), outcome(), cleanup=lambda: cleaned.append(1))
    with pytest.raises(RuntimeError, match=f"{failing} refused"):
        runs.close()  # or at the next start(): whichever the trial thread reaches first
    assert cleaned == [1]  # the trial's scratch files go even so


def test_the_next_trial_sees_an_earlier_failure():
    client = FakeClient(fail_on="create_run")
    runs = TrialRuns(SETTINGS, client)
    runs.start(0, {}).exception()  # wait until the write has failed
    with pytest.raises(RuntimeError, match="create_run refused"):
        runs.start(1, {})
    runs.close()


class _FailingRuns:
    def __init__(self):
        self.closed = 0

    def close(self):
        self.closed += 1
        raise RuntimeError("INTERNAL_ERROR: store refused the trial's metrics")


def test_a_failed_trial_write_does_not_hide_an_interrupt(capsys):
    from dbspec.tuning.objective import runs_written

    runs = _FailingRuns()
    with pytest.raises(KeyboardInterrupt):  # the stop is still reported as a stop
        with runs_written(runs):
            raise KeyboardInterrupt
    assert runs.closed == 1  # the queued writes were still waited for
    assert "a trial's MLflow run was not written: INTERNAL_ERROR" in capsys.readouterr().err


def test_a_failed_trial_write_fails_a_study_that_ended_normally():
    from dbspec.tuning.objective import runs_written

    with pytest.raises(RuntimeError, match="INTERNAL_ERROR"):
        with runs_written(_FailingRuns()):
            pass
