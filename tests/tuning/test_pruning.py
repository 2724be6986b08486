"""The pruner that lists finished trials once per trial: same verdicts, fewer storage reads."""

from __future__ import annotations

import optuna
import pytest
from optuna.storages import InMemoryStorage
from optuna.trial import TrialState

from dbspec.tuning.pruning import FinishedTrialsPruner

optuna.logging.set_verbosity(optuna.logging.WARNING)


class CountingStorage(InMemoryStorage):
    """An in-memory storage that counts how often all trials are listed."""

    def __init__(self):
        super().__init__()
        self.listings = 0

    def get_all_trials(self, study_id, deepcopy=True, states=None):
        self.listings += 1
        return super().get_all_trials(study_id, deepcopy=deepcopy, states=states)


def curve(trial, epochs=8):
    """A deterministic learning curve per suggested rate: some trials are clearly worse."""
    rate = trial.suggest_float("rate", 0.0, 1.0)
    for step in range(epochs):
        trial.report(rate + 1.0 / (step + 1), step)
        if trial.should_prune():
            raise optuna.TrialPruned()
    return rate


def run_study(pruner, storage=None, trials=12):
    study = optuna.create_study(storage=storage, sampler=optuna.samplers.RandomSampler(seed=4),
                                pruner=pruner)
    study.optimize(curve, n_trials=trials)
    return study


@pytest.mark.parametrize("make", [
    lambda: optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=1),
    lambda: optuna.pruners.PercentilePruner(25.0, n_startup_trials=2, n_warmup_steps=1),
])
def test_verdicts_equal_the_wrapped_pruners(make):
    plain = run_study(make())
    wrapped = run_study(FinishedTrialsPruner(make()))
    assert [t.state for t in wrapped.trials] == [t.state for t in plain.trials]
    assert TrialState.PRUNED in [t.state for t in plain.trials]  # the comparison means something
    assert [t.intermediate_values for t in wrapped.trials] == \
        [t.intermediate_values for t in plain.trials]


def test_finished_trials_are_listed_once_per_trial():
    median = lambda: optuna.pruners.MedianPruner(n_startup_trials=2)  # noqa: E731
    plain, wrapped = CountingStorage(), CountingStorage()
    reports = sum(len(t.intermediate_values) for t in run_study(median(), plain).trials)
    run_study(FinishedTrialsPruner(median(), refresh_seconds=3600), wrapped)
    # the plain pruner lists them at every report, the wrapped one at each trial's first
    assert plain.listings >= reports > 4 * 12
    assert wrapped.listings <= 2 * 12


class Spy(optuna.pruners.BasePruner):
    """Records what the study shows it: completed trials, and the running ones."""

    def __init__(self):
        self.seen = []

    def prune(self, study, trial):
        self.seen.append((len(study.get_trials(states=(TrialState.COMPLETE,))),
                          len(study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)))))
        return False


def test_the_list_is_renewed_per_trial_and_when_old_while_others_run():
    now = [0.0]
    spy = Spy()
    pruner = FinishedTrialsPruner(spy, refresh_seconds=10, clock=lambda: now[0])
    study = optuna.create_study(pruner=pruner)
    mine, other = study.ask(), study.ask()  # another worker's trial runs alongside this one
    pruner.prune(study, study._storage.get_trial(mine._trial_id))
    study.tell(other, 1.0)
    pruner.prune(study, study._storage.get_trial(mine._trial_id))
    now[0] = 11.0
    pruner.prune(study, study._storage.get_trial(mine._trial_id))
    study.tell(mine, 2.0)
    following = study.ask()
    pruner.prune(study, study._storage.get_trial(following._trial_id))
    # finished trials: listed, kept while young, renewed when old or for a new trial; running
    # trials always come from the study itself
    assert spy.seen == [(0, 2), (0, 1), (1, 1), (2, 1)]


def test_a_trial_finished_by_a_worker_that_started_later_is_seen_after_the_refresh():
    # alone at its first report, this trial's list holds no other trial; a worker that starts
    # afterwards finishes one, which the pruner must see once the list is older than the
    # refresh period (it used to be renewed only if others ran at the first report: never)
    now = [0.0]
    spy = Spy()
    pruner = FinishedTrialsPruner(spy, refresh_seconds=2, clock=lambda: now[0])
    study = optuna.create_study(pruner=pruner)
    mine = study.ask()
    pruner.prune(study, study._storage.get_trial(mine._trial_id))
    late = study.ask()
    study.tell(late, 1.0)
    now[0] = 1.0
    pruner.prune(study, study._storage.get_trial(mine._trial_id))
    now[0] = 3.5
    pruner.prune(study, study._storage.get_trial(mine._trial_id))
    assert [completed for completed, _ in spy.seen] == [0, 0, 1]


def test_successive_halving_is_not_wrapped():
    from dbspec.tuning.study import make_pruner
    from dbspec.spec.sections.search import SearchSpec

    search = SearchSpec.model_validate({"n_trials": 2, "metric": "val_loss",
                                        "pruner": {"name": "successive_halving"},
                                        "space": {"training.optimizer.lr": {"float": [0.01, 0.1]}}})
    assert type(make_pruner(search, epochs=10)) is optuna.pruners.SuccessiveHalvingPruner
