"""Where a study lives, and the RUNNING trials of workers that died.

Optuna's heartbeat (RDB storages only) fails a trial whose heartbeat is older than
:data:`GRACE_SECONDS`. :func:`fail_stale_trials` adds what Optuna cannot see: a trial whose
worker (its :data:`WORKER_ATTR`) is a gone process of this host is failed at once, with no
grace period and on journal storages too, which keep no heartbeats; a trial naming no worker
lost it before the objective's first line and is failed once :data:`UNCLAIMED_SECONDS` old.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Optional

from dbspec.spec.sections.search import SearchSpec

#: Seconds between the heartbeats of a running trial.
HEARTBEAT_SECONDS = 10
#: A running trial without a heartbeat for this long belongs to a dead worker.
GRACE_SECONDS = 60
#: The trial attribute naming the process that runs it.
WORKER_ATTR = "dbspec.worker"
#: A live worker names itself within milliseconds of Optuna creating its trial.
UNCLAIMED_SECONDS = 1.0


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


def open_storage(url: str):
    """An RDB storage with heartbeats for a database URL, a journal file storage for
    ``journal:///path``.

    A SQLite file is switched to write-ahead logging with ``synchronous=NORMAL``: in the
    default mode each of a trial's dozen-plus writes waits for disk syncs (~12 ms here, longer
    than an epoch of a small network). A killed process loses nothing, a power cut at most
    the last writes.
    """
    import warnings

    from optuna.storages import JournalStorage, RDBStorage

    if url.startswith("journal://"):
        from optuna.storages.journal import JournalFileBackend

        return JournalStorage(JournalFileBackend(url[len("journal://"):]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # heartbeat_interval is marked experimental
        storage = RDBStorage(url, heartbeat_interval=HEARTBEAT_SECONDS,
                             grace_period=GRACE_SECONDS)
    in_memory = url.rstrip("/") in ("sqlite:", "sqlite://") or ":memory:" in url
    if storage.engine.dialect.name == "sqlite" and not in_memory:
        _write_ahead(storage.engine)
    return storage


def _write_ahead(engine) -> None:
    """Every connection ``engine`` opens from now on uses WAL with ``synchronous=NORMAL``."""
    from sqlalchemy import event

    def on_connect(connection, _record) -> None:
        cursor = connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")  # kept in the file: other readers see it
        cursor.execute("PRAGMA synchronous=NORMAL")  # per connection
        cursor.close()

    event.listen(engine, "connect", on_connect)
    engine.dispose()  # the connections Optuna opened while creating its tables


def worker_attr() -> dict[str, Any]:
    """This process as a trial's :data:`WORKER_ATTR` attribute (host, PID, start in ms)."""
    import os
    import socket

    return {"host": socket.gethostname(), "pid": os.getpid(), "since_ms": int(time.time() * 1000)}


def fail_stale_trials(study, *, settle: bool = False) -> tuple[int, int]:
    """Mark failed the RUNNING trials of dead workers (see the module docstring).

    With ``settle`` (at the end of a stage, when this run's own trials are done), an unclaimed
    trial is given the rest of its :data:`UNCLAIMED_SECONDS` rather than left RUNNING.

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
    if settle:
        ages = [_age_seconds(t.datetime_start) for t in running()
                if WORKER_ATTR not in t.user_attrs]
        if ages and min(ages) <= UNCLAIMED_SECONDS:
            time.sleep(UNCLAIMED_SECONDS - min(ages) + 0.05)
    for trial in running():
        worker = trial.user_attrs.get(WORKER_ATTR)
        if worker is None:
            dead = _age_seconds(trial.datetime_start) > UNCLAIMED_SECONDS
        else:
            dead = worker.get("host") == socket.gethostname() and isinstance(worker.get("pid"), int) and \
                not process_alive(worker["pid"], since_ms=worker.get("since_ms"))
        if dead:
            try:
                study.tell(trial.number, state=TrialState.FAIL)
            except ValueError:
                pass  # it finished meanwhile
    failed = {t.number for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,))}
    return len(before & failed), len(before & {t.number for t in running()})


def _age_seconds(start) -> float:
    """Seconds since ``start``: RDB storages stamp local naive times, journals aware UTC ones."""
    from datetime import datetime

    if start is None:
        return 0.0
    return (datetime.now(start.tzinfo) - start).total_seconds()
