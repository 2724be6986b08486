"""A pruner that reads the study's finished trials once per trial, not at every report.

Optuna's median pruner lists the study's finished trials each time a trial reports. On an RDB storage every listing is a database query, which on SQLite cost about
as much as an epoch of the small networks a search tries (12 ms per ``should_prune``,
measured in ``benchmarks/search_pruning.py``): pruning saved epochs but not time. A finished
trial never changes, so :class:`FinishedTrialsPruner` lists them when a trial first reports
and hands the wrapped pruner that list, renewed every :data:`REFRESH_SECONDS`, until the trial
ends. (Successive halving is not wrapped: it lists all trials, whatever their state, which the
list cannot answer.)
"""

from __future__ import annotations

import copy
import threading
import time
from typing import Any, Callable, Container, Optional

from optuna.pruners import BasePruner
from optuna.trial import TrialState

_FINISHED = tuple(state for state in TrialState if state.is_finished())

#: A trial that another worker (a thread or process) finishes reaches this worker's pruning at
#: most this many seconds late; with one worker the list is exact.
REFRESH_SECONDS = 2.0


class FinishedTrialsPruner(BasePruner):
    """Optuna's ``inner`` pruner, shown the study's finished trials from a list taken at each
    trial's first report and again every :data:`REFRESH_SECONDS` while it runs (a worker that
    starts after the list was taken may finish trials meanwhile).

    With one worker this is exactly what the storage would answer: no trial finishes while
    this one runs. Everything else the pruner reads or writes (the study's direction, this
    trial's reports, the rung attributes successive halving records) goes to the study as
    before.

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
    """The study as the inner pruner sees it: listings of finished trials come from the
    list; any other listing, and every other attribute, from the study itself."""

    def __init__(self, study: Any, finished: list):
        self._study = study
        self._listed = finished

    def get_trials(self, deepcopy: bool = True,
                   states: Optional[Container[Any]] = None) -> list:
        wanted = _finished_states_only(states)
        if wanted is None:
            return self._study.get_trials(deepcopy=deepcopy, states=states)
        trials = [t for t in self._listed if t.state in wanted]
        return copy.deepcopy(trials) if deepcopy else trials

    def __getattr__(self, name: str) -> Any:
        return getattr(self._study, name)


def _finished_states_only(states: Optional[Container[Any]]) -> Optional[tuple]:
    """``states`` as a tuple when every state in it is a finished one, else None."""
    if states is None:
        return None
    try:
        wanted: tuple = tuple(states)  # type: ignore[arg-type]
    except TypeError:  # a container that cannot be listed: ask the study
        return None
    return wanted if wanted and all(state.is_finished() for state in wanted) else None
