"""The trial objective, and the worker processes that share a study for ``parallelism > 1``."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

from dbspec.data import store
from dbspec.errors import DbspecError
from dbspec.spec.document import Document
from dbspec.tuning.records import ReportFn, TrialFailed, TrialRecord, best_value_of
from dbspec.tuning.storage import WORKER_ATTR, worker_attr
from dbspec.tuning.study import suggest
from dbspec.tuning.trial_runs import TrialOutcome, TrialRuns, TrialRunSettings, now_ms


@dataclass(frozen=True)
class StudySetup:
    """Everything a trial needs, as plain picklable values (workers are spawned processes)."""

    source: Document
    target: Optional[str]
    data_dirs: dict[str, str]
    table_meta: dict[str, Any]
    tune_dir: str
    tracking_uri: str
    experiment_id: str
    parent_run_id: str
    study_name: str
    storage: str
    epochs: Optional[int]
    seed: int
    save_models: bool


class Objective:
    """Apply a trial's suggestions to the spec, train, report every epoch, log a nested run."""

    def __init__(self, setup: StudySetup, report: ReportFn):
        from dbspec.spec.loader import from_source

        self.setup = setup
        self.report = report
        self.loaded = from_source(setup.source, setup.target)
        self.streamed = None  # (StreamedData, stats) when the data streams from shards
        if setup.table_meta.get("shards"):
            from dbspec.data.access import StreamedData
            from dbspec.data.shards import open_shard_set

            stats = json.loads((Path(setup.data_dirs["preprocess"]) / "stats.json").read_text())
            self.streamed = (StreamedData(open_shard_set(Path(setup.table_meta["shards"]))),
                             stats)
        else:
            self.table = store.read_table(Path(setup.data_dirs["load_data"]), setup.table_meta,
                                          Path(setup.data_dirs["preprocess"]))
            self.splits = store.read_splits(Path(setup.data_dirs["split"]))
        self.fitted = store.read_preprocessing(Path(setup.data_dirs["preprocess"]))
        self.runs = TrialRuns(TrialRunSettings(
            tracking_uri=setup.tracking_uri, experiment_id=setup.experiment_id,
            parent_run_id=setup.parent_run_id, study_name=setup.study_name,
            spec_name=self.loaded.spec.name, target=setup.target or ""))

    def close(self) -> None:
        """Wait until every trial's MLflow run is written (raises the first failed write)."""
        self.runs.close()

    def __call__(self, trial) -> float:
        import optuna

        search = self.loaded.spec.search
        started = time.perf_counter()
        trial.set_user_attr(WORKER_ATTR, worker_attr())  # lets a rerun see this worker die
        values = suggest(trial, search)
        run = self.runs.start(trial.number, values)
        history: list[dict[str, float]] = []
        stamps: list[int] = []  # when each epoch was reported, in ms
        scratch = tempfile.TemporaryDirectory(prefix="dbspec-trial-")
        events = Path(scratch.name) / "tensorboard"
        state, value, error = "failed", None, ""
        try:
            trial_spec = self._trial_spec(values)
            on_epoch = _epoch_reporter(trial, search.metric, history, stamps)
            result = self._fit(trial_spec, on_epoch, events)
            early = trial_spec.training.early_stopping
            value = best_value_of(result.outcome.history, search.metric,
                                  result.outcome.best_epoch, bool(early and early.restore_best))
            state = "complete"
            if self.setup.save_models:
                self._save(trial.number, result)
            return value
        except optuna.TrialPruned:
            state = "pruned"
            raise
        except Exception as exc:  # a trial that crashes is recorded and the study goes on
            error = str(exc) if isinstance(exc, DbspecError) else f"{type(exc).__name__}: {exc}"
            trial.set_user_attr("error", error[:500])
            raise TrialFailed(error) from None
        finally:
            trial.set_user_attr("epochs", len(history))
            # the run is written in the background; the scratch dir goes once its files are in
            self.runs.finish(run, TrialOutcome(history, stamps, state, value, error, events,
                                               now_ms()), cleanup=scratch.cleanup)
            self.report(TrialRecord(trial.number, state, value, values, len(history),
                                    time.perf_counter() - started, error))

    def _trial_spec(self, values: dict[str, Any]):
        """The spec with a trial's suggested values applied; TrialFailed when they make it
        invalid or change its data section."""
        from dbspec.spec.loader import apply_values

        try:
            trial_spec = apply_values(self.loaded, values).spec
        except DbspecError as exc:
            raise TrialFailed(f"the suggested values make the spec invalid: {exc}") from None
        if trial_spec.data != self.loaded.spec.data:
            raise TrialFailed("the suggested values change the data section, which is "
                              "prepared once per study")
        return trial_spec

    def _fit(self, trial_spec, on_epoch, events: Path):
        """Train on the study's prepared data; TensorBoard events go to ``events``."""
        from dbspec.observability.observer import TrainingObserver
        from dbspec.training.fit import FitOptions, fit_spec, fit_streamed

        observer = TrainingObserver(trial_spec, log_dir=events, say=lambda text: None)
        options = FitOptions(epochs=self.setup.epochs, callbacks=[on_epoch], observer=observer)
        with observer:
            if self.streamed is not None:
                return fit_streamed(trial_spec, *self.streamed, self.fitted, options)
            return fit_spec(trial_spec, self.table, self.splits, self.fitted, options)

    def _save(self, number: int, result) -> None:
        from dataclasses import asdict

        from dbspec.models.served import save_served_model

        directory = Path(self.setup.tune_dir) / str(number)
        save_served_model(result.served, directory / "served")
        (directory / "outcome.json").write_text(json.dumps(asdict(result.outcome), default=str))


def _epoch_reporter(trial, metric: str, history: list[dict[str, float]], stamps: list[int]):
    """The epoch callback of a trial: keeps each epoch's metrics and when they came, reports
    ``metric`` to the trial, and raises TrialPruned when the pruner says so (TrialFailed when
    the metric is missing or not finite)."""
    import optuna

    def on_epoch(*, epoch: int, metrics: dict[str, float], **_: Any) -> None:
        history.append(metrics)
        stamps.append(now_ms())
        reported = metrics.get(metric)
        if reported is None or not math.isfinite(reported):
            raise TrialFailed(f"search.metric {metric} is {reported} at epoch {epoch + 1}")
        trial.report(reported, epoch)
        if trial.should_prune():
            raise optuna.TrialPruned(f"pruned at epoch {epoch + 1}")

    return on_epoch


def optimize(setup: StudySetup, sampler_seed: int, quota: int, timeout: Optional[float],
             report: ReportFn, *, storage: Any = None) -> None:
    """Run ``quota`` trials of the study in this process, in ``storage`` when it is open
    already (else in ``setup.storage``)."""
    import optuna

    from dbspec.tuning.storage import open_storage
    from dbspec.tuning.study import make_pruner, make_sampler

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    objective = Objective(setup, report)
    search = objective.loaded.spec.search
    epochs = setup.epochs or objective.loaded.spec.training.epochs
    study = optuna.load_study(study_name=setup.study_name,
                              storage=storage or open_storage(setup.storage),
                              sampler=make_sampler(search, sampler_seed),
                              pruner=make_pruner(search, epochs))
    quiet = _NoInterruptTraceback()
    handlers = logging.getLogger("optuna").handlers
    for handler in handlers:
        handler.addFilter(quiet)
    try:
        with runs_written(objective):  # the trials' MLflow runs are complete when this returns
            study.optimize(objective, n_trials=quota, timeout=timeout, catch=(TrialFailed,),
                           gc_after_trial=False)
    finally:
        for handler in handlers:
            handler.removeFilter(quiet)


@contextlib.contextmanager
def runs_written(objective) -> Iterator[None]:
    """Wait for the trials' queued MLflow writes on the way out. A failed write is raised when
    the study ended normally; when something else is on its way out (Ctrl-C, SIGTERM, a
    trial's error), that wins and the failed write is only told."""
    try:
        yield
    except BaseException:
        try:
            objective.close()
        except Exception as exc:
            print(f"  warning: a trial's MLflow run was not written: {exc}", file=sys.stderr,
                  flush=True)
        raise
    objective.close()


class _NoInterruptTraceback(logging.Filter):
    """Optuna logs a trial that Ctrl-C or SIGTERM stopped with the interrupt's traceback; the
    run reports the stop in one line of its own, so the traceback is dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], KeyboardInterrupt):
            record.exc_info = None
            record.exc_text = None
        return True


def print_record(record: TrialRecord) -> None:
    """A worker's progress line (workers have no terminal of their own)."""
    print("  " + record.describe(), file=sys.stderr, flush=True)


def run_worker(setup: StudySetup, sampler_seed: int, quota: int,
               timeout: Optional[float]) -> None:
    """Entry point of a spawned worker process."""
    from dbspec.tracking.mlflow_tracking import quiet_mlflow

    quiet_mlflow()
    optimize(setup, sampler_seed, quota, timeout, print_record)
