"""A tracking store URI checked before anything uses it: a clear message, in bounded time.

MLflow reports an unusable store from deep inside whatever first touches it (a SQLAlchemy
traceback for ``sqlite:////etc/passwd``, a driver's ``ImportError``, minutes of retries for a
server that is down); :func:`check_tracking_server` says it in one :class:`TrackingError` line.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Callable, Optional
from urllib.parse import unquote, urlparse

from dbspec.errors import DbspecError, redact
from dbspec.filelocks import HostLock, LockBusy, describe_holder

_SQLITE_MAGIC = b"SQLite format 3\x00"
_PROBE_SECONDS = 10.0
#: How long a run waits for another process that creates or migrates the same SQLite store.
_STORE_WAIT_SECONDS = 600.0
#: Stores that passed :func:`check_store` in this process (http(s) servers: probed each time).
_CHECKED: set[tuple[str, bool]] = set()


class TrackingError(DbspecError):
    """The MLflow tracking store cannot be used (a server that does not answer)."""


def quiet_mlflow() -> None:
    """MLflow's INFO lines (database migrations, 'created version') would bury our output."""
    for name in ("mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    # with a tracking server MLflow prints 'View run ... at URL' on stdout after every run,
    # where our summary and --format json output go
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")


def check_tracking_server(uri: str, *, must_exist: bool = False,
                          say: Optional[Callable[[str], None]] = None) -> None:
    """Fail in seconds, with one line, when the tracking store at ``uri`` is unusable.

    An ``http(s)://`` server is probed (``/health``, one retry; MLflow retries for minutes):
    any HTTP answer counts as alive, and TLS problems are left to MLflow's own settings. Any
    other store goes to :func:`check_store` (``must_exist``: a reading command's SQLite
    database must be there).

    Raises:
        TrackingError: nothing answers there in time, or the store cannot be used.
    """
    if not uri.lower().startswith(("http://", "https://")):
        check_store(uri, must_exist=must_exist, say=say)
        return
    import requests

    for attempt in (1, 2):
        try:
            requests.get(f"{uri.rstrip('/')}/health", timeout=_PROBE_SECONDS,
                         allow_redirects=False)
            return
        except requests.exceptions.SSLError:
            return
        except (requests.exceptions.ConnectionError, requests.exceptions.Timeout) as exc:
            if attempt == 1:
                time.sleep(0.5)  # one retry: a server that is just starting, a dropped packet
                continue
            raise TrackingError(f"the MLflow tracking server at {uri} does not answer "
                                f"({_reason(exc)}): start it, or point MLFLOW_TRACKING_URI / "
                                "tracking.tracking_uri / --tracking-uri at one that runs") \
                from None
        except requests.exceptions.RequestException as exc:
            raise TrackingError(f"MLflow tracking URI {uri}: {_reason(exc)}") from None


def _reason(exc: Exception) -> str:
    import requests

    if isinstance(exc, requests.exceptions.Timeout):
        return f"no answer within {_PROBE_SECONDS:g} s"
    text = str(exc)
    for known in ("Connection refused", "Name or service not known", "No route to host",
                  "Temporary failure in name resolution", "Network is unreachable"):
        if known in text:
            return known.lower()
    return text.splitlines()[0][:200] if text else type(exc).__name__


def sqlite_path(uri: str) -> Optional[Path]:
    """The database file of a ``sqlite:///`` URI; None for any other URI or an in-memory one."""
    if not uri.startswith("sqlite:"):
        return None
    path = unquote(urlparse(uri).path)
    if uri.startswith("sqlite:////"):
        path = "/" + path.lstrip("/")
    elif uri.startswith("sqlite:///"):
        path = path[1:] if path.startswith("/") else path
    return Path(path) if path and path != ":memory:" else None


def check_location(uri: str, *, must_exist: bool = False) -> None:
    """What :func:`check_tracking_server` checks without MLflow (a run whose stages are all
    cached opens no store, but one it could not use is still refused): a server is probed."""
    if uri.lower().startswith(("http://", "https://")):
        check_tracking_server(uri)
        return
    database = sqlite_path(uri)
    if database is not None:
        _check_sqlite_file(database, redact(uri), must_exist=must_exist)
    file_store = uri.startswith("file:") or "://" not in uri and \
        not uri.startswith(("sqlite:", "databricks", "uc:"))
    if file_store and os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").lower() != "true":
        raise TrackingError(f"tracking URI {redact(uri)}: MLflow 3 no longer accepts a file "
                            "store (a directory of runs); use a database such as "
                            "sqlite:///path/mlflow.db or an MLflow server (http://...)")


def check_store(uri: str, *, must_exist: bool,
                say: Optional[Callable[[str], None]] = None) -> None:
    """Fail with one clear line, naming the URI, unless MLflow can use it as its store; a
    SQLite store under ``<database>.lock`` (two processes creating its tables fail each other).

    Args:
        must_exist: A command that only reads needs the store to be there already; ``run``
            may create a SQLite database.
        say: Told that the store is being created, or waited for (seconds).
    """
    if (uri, must_exist) in _CHECKED or (uri, True) in _CHECKED:
        return  # a Tracker, the stage state and the executor each check the same store
    if uri.lower().startswith(("http://", "https://")):
        check_tracking_server(uri)
        return
    check_location(uri, must_exist=must_exist)
    if uri.startswith(("databricks", "uc:")):
        return  # MLflow's Databricks client reports its own credential errors; no probe here
    database = sqlite_path(uri)
    if database is not None and not database.exists() and say is not None:
        say(f"creating the MLflow tracking store {database} (a first run: MLflow "
            "sets up its tables, some seconds)")
    import mlflow

    quiet_mlflow()
    lock = _store_lock(database, say) if database else None
    try:
        mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri).search_experiments(max_results=1)
    except Exception as exc:  # SQLAlchemy, MlflowException, a missing driver: all the same here
        raise TrackingError(f"tracking URI {redact(uri)}: {_first_line(exc)}") from None
    finally:
        if lock is not None:
            lock.release()
    _CHECKED.add((uri, must_exist))


def _store_lock(database: Path, say: Optional[Callable[[str], None]]) -> HostLock:
    """``<database>.lock``, taken (after a process setting the store up lets go of it) unless
    the folder cannot hold it (a reader of a read-only store)."""
    lock, what = HostLock(f"{database}.lock"), f"the tracking store {database}"
    try:
        try:
            lock.acquire(what, unsupported_ok=True)
        except LockBusy as busy:
            if say is not None:
                say(f"waiting for {describe_holder(busy.holder)}, which is setting up {what}")
            lock.acquire(what, wait=_STORE_WAIT_SECONDS, unsupported_ok=True)
    except LockBusy as busy:
        raise TrackingError(str(busy)) from None
    except OSError:
        pass  # no lock file there (a read-only folder): go on without; release() is a no-op
    return lock


def _check_sqlite_file(database: Path, shown: str, *, must_exist: bool) -> None:
    if database.is_dir():
        raise TrackingError(f"tracking URI {shown}: {database} is a directory, not a SQLite "
                            "database file")
    if database.exists():
        try:
            with open(database, "rb") as handle:
                head = handle.read(len(_SQLITE_MAGIC))
        except OSError as exc:
            raise TrackingError(f"tracking URI {shown}: cannot read {database}: "
                                f"{exc.strerror or exc}") from None
        if head and head != _SQLITE_MAGIC:
            raise TrackingError(f"tracking URI {shown}: {database} is not a SQLite database")
        return
    if must_exist:
        raise TrackingError(f"tracking URI {shown}: no database at {database}: run a spec "
                            "first, or give the store that holds the runs")
    parent = database.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TrackingError(f"tracking URI {shown}: cannot create {parent}: "
                            f"{exc.strerror or exc}") from None
    if not os.access(parent, os.W_OK | os.X_OK):
        raise TrackingError(f"tracking URI {shown}: {parent} is not writable")


def _first_line(exc: Exception) -> str:
    text = str(exc).strip() or type(exc).__name__
    if type(exc).__name__ == "ModuleNotFoundError":
        text = f"the database driver is not installed ({text})"
    return redact(text.splitlines()[0][:300])
