"""The study's storage: SQLite in write-ahead mode, trials of workers that died unclaimed."""

from __future__ import annotations

import sqlite3

import optuna
from optuna.trial import TrialState

from dbspec.tuning import storage as storages

optuna.logging.set_verbosity(optuna.logging.WARNING)


def test_a_sqlite_study_writes_ahead(tmp_path):
    path = tmp_path / "optuna.db"
    study = optuna.create_study(storage=storages.open_storage(f"sqlite:///{path}"))
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    with sqlite3.connect(path) as connection:
        assert connection.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    # any other reader of the file sees the same study
    assert len(optuna.load_study(study_name=study.study_name,
                                 storage=f"sqlite:///{path}").trials) == 2


def test_an_in_memory_sqlite_study_keeps_its_tables():
    # an in-memory database lives in its connection: it must not be switched (and reconnected)
    study = optuna.create_study(storage=storages.open_storage("sqlite:///:memory:"))
    study.enqueue_trial({"x": 0.5})
    assert [t.state for t in study.trials] == [TrialState.WAITING]


def test_a_trial_whose_worker_died_before_naming_itself_is_failed_once_old(tmp_path, monkeypatch):
    study = optuna.create_study(storage=storages.open_storage(f"sqlite:///{tmp_path / 'o.db'}"))
    unclaimed = study.ask()  # the worker was killed before the objective's first line
    claimed = study.ask()
    claimed.set_user_attr(storages.WORKER_ATTR, storages.worker_attr())  # this live process
    monkeypatch.setattr(storages, "UNCLAIMED_SECONDS", 3600.0)
    assert storages.fail_stale_trials(study) == (0, 2)  # young: maybe a worker about to name itself
    monkeypatch.setattr(storages, "UNCLAIMED_SECONDS", 0.0)
    assert storages.fail_stale_trials(study) == (1, 1)
    states = {t.number: t.state for t in study.get_trials()}
    assert states == {unclaimed.number: TrialState.FAIL, claimed.number: TrialState.RUNNING}


def test_settling_gives_a_young_unclaimed_trial_the_rest_of_its_time(tmp_path, monkeypatch):
    # a rerun right after a kill finished its own trials while the dead run's unclaimed trial
    # was still young: it stayed RUNNING for good (seen in CI)
    study = optuna.create_study(storage=storages.open_storage(f"sqlite:///{tmp_path / 'o.db'}"))
    study.ask()
    monkeypatch.setattr(storages, "UNCLAIMED_SECONDS", 0.5)
    assert storages.fail_stale_trials(study) == (0, 1)
    assert storages.fail_stale_trials(study, settle=True) == (1, 0)


def test_an_unclaimed_trial_of_a_journal_study_is_failed_too(tmp_path, monkeypatch):
    study = optuna.create_study(
        storage=storages.open_storage(f"journal:///{tmp_path / 'o.journal'}"))
    study.ask()
    monkeypatch.setattr(storages, "UNCLAIMED_SECONDS", 0.0)
    assert storages.fail_stale_trials(study) == (1, 0)  # its times are UTC-aware, not naive
