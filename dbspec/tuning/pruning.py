"""A pruner that reads the study's finished trials once per trial, not at every report.

Optuna's median pruner lists the study's finished trials at each report; on SQLite that query
cost about as much as an epoch of a small network (12 ms per ``should_prune``,
``benchmarks/search_pruning.py``), so pruning saved epochs but not time. A finished trial never
changes, so :class:`FinishedTrialsPruner` lists them at a trial's first report and renews the
list every :data:`REFRESH_SECONDS`.
"""

from __future__ import annotations

import copy
import threading
import time
from typing import Any, Callable, Collection, Optional

from optuna.pruners import BasePruner
from optuna.trial import TrialState

_FINISHED = tuple(state for state in TrialState if state.is_finished())

#: A trial that another worker finishes reaches this worker's pruning at most this late.
REFRESH_SECONDS = 2.0


class FinishedTrialsPruner(BasePruner):
    """Optuna's ``inner`` pruner, shown the study's finished trials from the list; everything
    else it reads or writes goes to the study. With one worker the list is exact.

    Args:
        inner: An Optuna pruner that lists only finished trials (median, percentile; not
            successive halving, which lists every trial, nor Hyperband, whose sampler must see
            the ``HyperbandPruner`` itself).
        refresh_seconds: How old the list may grow during one trial.
        clock: Seconds, for the refresh (a test seam).
    """

    def __init__(self, inner: Any, refresh_seconds: float = REFRESH_SECONDS,
                 clock: Callable[[], float] = time.monotonic):
        self.inner = inner
        self.refresh_seconds = refresh_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._key: Optional[tuple[str, int]] = None
        self._taken = 0.0
        self._finished: list = []

    def prune(self, study: Any, trial: Any) -> bool:
        """The inner pruner's verdict on ``trial``, over the listed finished trials."""
        return self.inner.prune(_FinishedTrialsView(study, self._finished_trials(study, trial)),
                                trial)

    def _finished_trials(self, study: Any, trial: Any) -> list:
        key = (study.study_name, trial.number)
        with self._lock:
            now = self._clock()
            if key != self._key or now - self._taken > self.refresh_seconds:
                self._finished = study.get_trials(deepcopy=False, states=_FINISHED)
                self._key, self._taken = key, now
            return self._finished


class _FinishedTrialsView:
    """The study, but listings of finished trials only come from the list."""

    def __init__(self, study: Any, finished: list):
        self._study = study
        self._listed = finished

    def get_trials(self, deepcopy: bool = True,
                   states: Optional[Collection[Any]] = None) -> list:
        if states is None or not all(state.is_finished() for state in states):
            return self._study.get_trials(deepcopy=deepcopy, states=states)
        trials = [t for t in self._listed if t.state in states]
        return copy.deepcopy(trials) if deepcopy else trials

    def __getattr__(self, name: str) -> Any:
        return getattr(self._study, name)
