"""Hyperparameter search: an Optuna study whose trials train through the same code as ``train``.

Each trial applies its suggestions to a copy of the spec at the ``search.space`` paths, validates
the result, trains, and reports ``search.metric`` every epoch so the pruner really stops weak
trials. Trials are nested MLflow runs under the study's run; the study lives in Optuna RDB
storage, so an interrupted search continues where it stopped.

A trial's worker records an Optuna heartbeat every :data:`HEARTBEAT_SECONDS` while the trial
runs (RDB storages: SQLite, PostgreSQL, MySQL). A RUNNING trial whose heartbeat is older than
:data:`GRACE_SECONDS` belongs to a dead worker and is marked failed, by Optuna before each new
trial and by the tune stage when it starts (:func:`fail_stale_trials`). The stage also fails at
once the RUNNING trials whose worker (recorded as the trial's ``dbspec.worker`` attribute) is a
process of this host that is gone, so a rerun right after a kill need not wait for the grace
period. Trials of live workers, in this run or in another process sharing the study, are never
touched.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from dbspec.errors import DbspecError
from dbspec.spec.sections import Spec
from dbspec.spec.sections.search import CategoricalDistribution, FloatDistribution, SearchSpec
from dbspec.spec.semantics import lower_is_better


class TrialFailed(DbspecError):
    """A trial could not produce a value (invalid suggestion, NaN loss, a crash)."""


def direction(search: SearchSpec) -> str:
    """``minimize`` or ``maximize``: given, or from the metric name."""
    if search.direction != "auto":
        return search.direction
    return "minimize" if lower_is_better(search.metric) else "maximize"


def make_sampler(search: SearchSpec, seed: int):
    """The Optuna sampler named in ``search.sampler``."""
    import optuna

    name, startup = search.sampler.name, search.sampler.startup_trials
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "cmaes":
        return optuna.samplers.CmaEsSampler(seed=seed, n_startup_trials=startup,
                                            warn_independent_sampling=False)
    if name == "qmc":
        return optuna.samplers.QMCSampler(seed=seed, warn_independent_sampling=False)
    return optuna.samplers.GridSampler(grid_space(search), seed=seed)


def grid_space(search: SearchSpec) -> dict[str, list]:
    """Every value of each path, for the grid sampler (validation ensures it is finite)."""
    space: dict[str, list] = {}
    for path, dist in search.space.items():
        if isinstance(dist, CategoricalDistribution):
            space[path] = list(dist.choices)
        elif isinstance(dist, FloatDistribution):
            low, high = dist.low_high
            count = int(math.floor((high - low) / dist.step + 1e-9)) + 1
            space[path] = [round(low + i * dist.step, 12) for i in range(count)]
        else:
            low, high = dist.low_high
            space[path] = list(range(low, high + 1, dist.step))
    return space


def make_pruner(search: SearchSpec, epochs: int):
    """The Optuna pruner named in ``search.pruner``; it sees one report per epoch."""
    import optuna

    spec = search.pruner
    if spec.name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=spec.startup_trials,
                                           n_warmup_steps=spec.warmup_epochs)
    if spec.name == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=spec.min_resource,
                                              max_resource=max(epochs, spec.min_resource),
                                              reduction_factor=spec.reduction_factor)
    if spec.name == "successive_halving":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=spec.min_resource,
                                                      reduction_factor=spec.reduction_factor)
    return optuna.pruners.NopPruner()


def suggest(trial, search: SearchSpec) -> dict[str, Any]:
    """One value per space path, named by the path."""
    values: dict[str, Any] = {}
    for path, dist in search.space.items():
        if isinstance(dist, CategoricalDistribution):
            values[path] = trial.suggest_categorical(path, dist.choices)
        elif isinstance(dist, FloatDistribution):
            low, high = dist.low_high
            values[path] = trial.suggest_float(path, low, high, log=dist.log, step=dist.step)
        else:
            low, high = dist.low_high
            values[path] = trial.suggest_int(path, low, high, log=dist.log,
                                             step=1 if dist.log else dist.step)
    return values


def default_study_name(spec: Spec, target: Optional[str], fingerprint: str, smoke: bool) -> str:
    """The spec's name, target and search fingerprint: a changed search starts a new study."""
    if spec.search.study_name:
        return spec.search.study_name + ("-smoke" if smoke else "")
    base = spec.name + (f"@{target}" if target else "")
    return f"{base}-{fingerprint[:8]}" + ("-smoke" if smoke else "")


def storage_url(search: SearchSpec, project_dir: Path, shared_dir: Optional[Path] = None) -> str:
    """``search.storage``; else, for trials on other machines, a journal file in the shared
    dir (every executor appends to it; measured faster than SQLite for concurrent workers);
    else a SQLite file next to the local tracking store."""
    if search.storage:
        return search.storage
    if shared_dir is not None:
        shared_dir.mkdir(parents=True, exist_ok=True)
        return f"journal:///{(shared_dir / 'optuna.journal').resolve()}"
    project_dir.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{(project_dir / 'optuna.db').resolve()}"


#: Seconds between the heartbeats of a running trial.
HEARTBEAT_SECONDS = 10
#: A running trial without a heartbeat for this long belongs to a dead worker.
GRACE_SECONDS = 60


def open_storage(url: str):
    """What Optuna takes as ``storage``: an RDB storage with heartbeats for a database URL, a
    journal file storage for ``journal:///path`` (Optuna has no heartbeats for journals)."""
    import warnings

    from optuna.storages import JournalStorage, RDBStorage

    if url.startswith("journal://"):
        from optuna.storages.journal import JournalFileBackend

        return JournalStorage(JournalFileBackend(url[len("journal://"):]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # heartbeat_interval is marked experimental
        return RDBStorage(url, heartbeat_interval=HEARTBEAT_SECONDS, grace_period=GRACE_SECONDS)


WORKER_ATTR = "dbspec.worker"


def worker_attr() -> dict[str, Any]:
    """This process as a trial's ``dbspec.worker`` attribute (host, PID, start in ms)."""
    import os
    import socket

    return {"host": socket.gethostname(), "pid": os.getpid(), "since_ms": int(time.time() * 1000)}


def fail_stale_trials(study) -> tuple[int, int]:
    """Mark failed the RUNNING trials of dead workers: Optuna's heartbeat check (a heartbeat
    older than the grace period), then trials whose worker process is gone from this host.

    Returns:
        (trials marked failed, trials still RUNNING: live workers', or ones whose death this
        host cannot see yet: another host's worker within the grace period, or any of another
        host on a journal storage, which keeps no heartbeats).
    """
    import socket
    import warnings

    import optuna
    from optuna.trial import TrialState

    from dbspec.tracking.mlflow_tracking import process_alive

    def running():
        return study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))

    before = {t.number for t in running()}
    if not before:
        return 0, 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fail_stale_trials is marked experimental
        optuna.storages.fail_stale_trials(study)
    here = socket.gethostname()
    for trial in running():
        worker = trial.user_attrs.get(WORKER_ATTR) or {}
        if worker.get("host") == here and isinstance(worker.get("pid"), int) and \
                not process_alive(worker["pid"], since_ms=worker.get("since_ms")):
            try:
                study.tell(trial.number, state=TrialState.FAIL)
            except ValueError:
                pass  # it finished meanwhile
    failed = {t.number for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,))}
    return len(before & failed), len(before & {t.number for t in running()})


@dataclass
class TrialRecord:
    """What one trial did, for progress lines and the study summary."""

    number: int
    state: str
    value: Optional[float]
    params: dict[str, Any]
    epochs: int
    seconds: float
    error: str = ""

    def describe(self) -> str:
        shown = "-" if self.value is None else f"{self.value:.6g}"
        params = ", ".join(f"{k}={_short(v)}" for k, v in self.params.items())
        error = f"  ({self.error})" if self.error else ""
        return (f"trial {self.number:>3}  {self.state:<8} value {shown:<10} "
                f"{self.epochs:>3} epochs  {params}{error}")


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def best_value_of(history: list[dict[str, float]], metric: str, best_epoch: int,
                  restored: bool) -> float:
    """The metric of the model a trial ends with (the restored best epoch, or the last)."""
    row = history[best_epoch] if restored and 0 <= best_epoch < len(history) else history[-1]
    if metric not in row:
        raise TrialFailed(f"search.metric '{metric}' was not logged by the trial")
    return float(row[metric])


ReportFn = Callable[[TrialRecord], None]


def timed() -> Callable[[], float]:
    start = time.perf_counter()
    return lambda: time.perf_counter() - start
