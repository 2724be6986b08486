"""The one metric buffer: real timestamps, the right steps, batches, and nothing lost."""

from __future__ import annotations

import math
import time

import pytest

from dbspec.tracking.metrics import MetricBuffer

SPEC = """\
name: tracked
data: {source: {kind: sklearn, name: diabetes}, task: regression}
model: {layers: [{linear: {out: 1}}]}
"""


@pytest.fixture
def store(tmp_path):
    """An MLflow client on a fresh SQLite store and a run in it."""
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.create_experiment("metrics", artifact_location=tmp_path.as_uri())
    return client, client.create_run(experiment).info.run_id


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("background", [True, False])
def test_values_arrive_with_wall_clock_time_and_their_step(store, background):
    client, run_id = store
    buffer = MetricBuffer(client, run_id, background=background)
    before = int(time.time() * 1000)
    for epoch in range(3):
        buffer.log({"train_loss": 1.0 / (epoch + 1), "lr": 0.1}, epoch)
    buffer.flush()
    after = int(time.time() * 1000)
    logged = client.get_metric_history(run_id, "train_loss")
    assert sorted((m.step, m.value) for m in logged) == [(0, 1.0), (1, 0.5), (2, 1 / 3)]
    assert all(before <= m.timestamp <= after for m in logged)
    assert len(client.get_metric_history(run_id, "lr")) == 3


def test_a_given_timestamp_is_kept_and_missing_values_are_left_out(store):
    client, run_id = store
    buffer = MetricBuffer(client, run_id)
    buffer.log({"val_loss": 2.0, "gone": None, "nan": math.nan, "inf": math.inf}, 4,
               timestamp=1_700_000_000_000)
    buffer.flush()
    (logged,) = client.get_metric_history(run_id, "val_loss")
    assert (logged.step, logged.timestamp) == (4, 1_700_000_000_000)
    assert set(client.get_run(run_id).data.metrics) == {"val_loss"}


def test_batches_go_out_when_the_period_passes_not_on_every_log(store):
    client, run_id = store
    clock = Clock()
    buffer = MetricBuffer(client, run_id, flush_seconds=5.0, background=False, clock=clock)
    buffer.log({"a": 1.0}, 0)
    clock.now = 4.0
    buffer.log({"a": 2.0}, 1)
    assert len(buffer) == 2 and client.get_metric_history(run_id, "a") == []
    clock.now = 5.5
    buffer.log({"a": 3.0}, 2)
    assert len(buffer) == 0 and len(client.get_metric_history(run_id, "a")) == 3


def test_a_full_buffer_is_sent_in_batches_of_mlflow_s_limit(store):
    client, run_id = store
    sent = []
    original = client.log_batch

    def counting(run, metrics, **kwargs):
        sent.append(len(metrics))
        return original(run, metrics=metrics, **kwargs)

    client.log_batch = counting
    buffer = MetricBuffer(client, run_id, flush_seconds=None, max_buffered=2500,
                          background=False)
    for step in range(1250):
        buffer.log({"a": float(step), "b": 1.0}, step)
    assert sent == [1000, 1000, 500] and len(buffer) == 0
    assert len(client.get_metric_history(run_id, "a")) == 1250


def test_a_batch_the_store_refuses_in_the_background_fails_the_flush(store):
    from mlflow.exceptions import MlflowException

    client, _ = store
    buffer = MetricBuffer(client, "no-such-run", flush_seconds=0.0)
    buffer.log({"a": 1.0}, 0)  # due at once: handed to MLflow's background logging
    with pytest.raises(MlflowException):
        buffer.flush()


def test_the_flush_waits_for_every_batch_before_it_raises_the_first_failure(store):
    from mlflow.exceptions import MlflowException

    client, run_id = store
    buffer = MetricBuffer(client, "no-such-run", flush_seconds=0.0)
    buffer.log({"a": 1.0}, 0)  # refused, in the background
    buffer.run_id = run_id
    buffer.log({"b": 2.0}, 0)  # accepted, in the background, after the refused one
    with pytest.raises(MlflowException):
        buffer.flush()
    assert [m.value for m in client.get_metric_history(run_id, "b")] == [2.0]


def test_the_tracker_refuses_metrics_outside_a_run(workdir):
    from dbspec.spec.loader import load_spec
    from dbspec.tracking.mlflow_tracking import Tracker, TrackingError

    (workdir / "spec.yaml").write_text(SPEC)
    tracker = Tracker(load_spec("spec.yaml").spec, workdir / ".dbspec")
    with pytest.raises(TrackingError, match="metrics logged outside a run"):
        tracker.log_metrics({"a": 1.0})
    with tracker.run() as run_id:
        tracker.log_metrics({"a": 1.0})
    (logged,) = tracker.client.get_metric_history(run_id, "a")
    assert logged.step == 0 and logged.timestamp > 1_600_000_000_000
