"""The trials' nested MLflow runs, written by one background thread so trials do not wait.

A trial's run takes five writes; on the default SQLite store each waits for disk syncs (about a
third of a second per trial, as much as several epochs of a small network). :class:`TrialRuns`
queues them, in order, with the times taken when the trial started and ended;
:meth:`TrialRuns.close` waits for them, and a failed write is raised when the next trial starts
or at :meth:`TrialRuns.close`.
"""

from __future__ import annotations

import math
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional


@dataclass(frozen=True)
class TrialRunSettings:
    """Where the trials' runs go and what tags they all carry."""

    tracking_uri: str
    experiment_id: str
    parent_run_id: str
    study_name: str
    spec_name: str
    target: str


@dataclass
class TrialOutcome:
    """What a finished trial leaves in its run."""

    history: list[dict[str, float]]
    stamps: list[int]  # when each epoch was reported, in ms
    state: str  # complete, pruned or failed
    value: Optional[float]
    error: str
    events: Optional[Path]  # TensorBoard files to attach, if any
    ended_ms: int


class TrialRuns:
    """Creates and completes the trials' runs in a background thread, in submission order.

    Args:
        settings: The experiment, parent run and tags.
        client: An ``mlflow.MlflowClient`` (default: one for ``settings.tracking_uri``).
    """

    def __init__(self, settings: TrialRunSettings, client: Any = None):
        if client is None:
            import mlflow

            client = mlflow.MlflowClient(tracking_uri=settings.tracking_uri)
        self.settings = settings
        self.client = client
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dbspec-trial-runs")
        self._writes: list[Future] = []

    def start(self, number: int, values: dict[str, Any]) -> Future:
        """Queue the run of trial ``number`` with its parameters; the future holds its id."""
        self._raise_failed()
        started_ms = now_ms()
        run = self._writer.submit(self._create, number, values, started_ms)
        self._writes.append(run)
        return run

    def finish(self, run: Future, outcome: TrialOutcome,
               cleanup: Callable[[], None] = lambda: None) -> None:
        """Queue the end of ``run``: files, metrics, state tags, status; then ``cleanup``.
        Never raises for an earlier write (it would hide the trial's own error)."""
        self._writes.append(self._writer.submit(self._complete, run, outcome, cleanup))

    def close(self) -> None:
        """Wait for every queued write; raise the first that failed."""
        self._writer.shutdown(wait=True)
        self._raise_failed()

    def _raise_failed(self) -> None:
        done = [w for w in self._writes if w.done()]
        self._writes = [w for w in self._writes if not w.done()]
        for write in done:
            write.result()  # re-raises the write's error here, in the trial's thread

    def _create(self, number: int, values: dict[str, Any], started_ms: int) -> str:
        from mlflow.entities import Param

        from dbspec.tracking.mlflow_tracking import process_tags

        s = self.settings
        run = self.client.create_run(s.experiment_id, run_name=f"trial-{number}",
                                     start_time=started_ms, tags={
            "mlflow.parentRunId": s.parent_run_id, "dbspec.study": s.study_name,
            "dbspec.trial": str(number), "dbspec.worker_pid": str(os.getpid()),
            # a later run of the spec ends this run KILLED if its worker dies
            "dbspec.spec": s.spec_name, "dbspec.target": s.target, **process_tags()})
        self.client.log_batch(run.info.run_id,
                              params=[Param(k[:250], str(v)[:6000]) for k, v in values.items()])
        return run.info.run_id

    def _complete(self, run: Future, outcome: TrialOutcome,
                  cleanup: Callable[[], None]) -> None:
        from mlflow.entities import RunTag

        from dbspec.tracking.metrics import MetricBuffer

        try:
            run_id = run.result()
            if outcome.events is not None and outcome.events.is_dir():
                self.client.log_artifacts(run_id, str(outcome.events), "tensorboard")
            # each epoch at the time it was reported: MLflow's wall-time axis shows the trial
            metrics = MetricBuffer(self.client, run_id, flush_seconds=None, background=False)
            for step, (row, stamp) in enumerate(zip(outcome.history, outcome.stamps)):
                metrics.log(row, step, timestamp=stamp)
            if outcome.value is not None and math.isfinite(outcome.value):
                metrics.log({"trial_value": outcome.value}, 0, timestamp=outcome.ended_ms)
            metrics.flush()
            tags = [RunTag("dbspec.trial_state", outcome.state)]
            if outcome.error:
                tags.append(RunTag("dbspec.error", outcome.error[:5000]))
            self.client.log_batch(run_id, tags=tags)
            self.client.set_terminated(run_id, "FAILED" if outcome.state == "failed"
                                       else "FINISHED", end_time=outcome.ended_ms)
        finally:
            cleanup()


def now_ms() -> int:
    return int(time.time() * 1000)
