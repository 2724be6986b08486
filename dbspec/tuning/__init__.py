"""Hyperparameter search: an Optuna study whose trials train through the same code as ``train``.

Each trial applies its suggestions to a copy of the spec at the ``search.space`` paths, validates
the result, trains, and reports ``search.metric`` every epoch so the pruner really stops weak
trials. Trials are nested MLflow runs under the study's run; the study lives in Optuna RDB
storage, so an interrupted search continues where it stopped.

The parts: :mod:`~dbspec.tuning.study` (direction, sampler, pruner, suggestions, study name),
:mod:`~dbspec.tuning.pruning` (pruning without a storage query per epoch),
:mod:`~dbspec.tuning.storage` (where the study lives; trials of dead workers),
:mod:`~dbspec.tuning.records` (what a trial produces), :mod:`~dbspec.tuning.trial_runs` (the
trials' MLflow runs) and :mod:`~dbspec.tuning.objective` (the trial itself, and the worker
processes). Nothing here imports Optuna, MLflow or torch at import time.
"""

from dbspec.tuning.records import ReportFn, TrialFailed, TrialRecord, best_value_of, timed
from dbspec.tuning.storage import (
    GRACE_SECONDS,
    HEARTBEAT_SECONDS,
    WORKER_ATTR,
    fail_stale_trials,
    open_storage,
    storage_url,
    worker_attr,
)
from dbspec.tuning.study import (
    default_study_name,
    direction,
    grid_space,
    make_pruner,
    make_sampler,
    suggest,
)

__all__ = [
    "GRACE_SECONDS", "HEARTBEAT_SECONDS", "WORKER_ATTR", "ReportFn", "TrialFailed",
    "TrialRecord", "best_value_of", "default_study_name", "direction", "fail_stale_trials",
    "grid_space", "make_pruner", "make_sampler", "open_storage", "storage_url", "suggest",
    "timed", "worker_attr",
]
