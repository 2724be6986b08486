"""An unusable tracking store or state directory is one clear line and exit 1, in seconds.

Each URI here once ended in a SQLAlchemy or MLflow traceback: a file that is not a database,
MLflow 3's refused file store, a missing database driver, an unknown scheme.
"""

from __future__ import annotations

import os
import time

import pytest

from dbspec.filelocks import HostLock
from dbspec.tracking import stores
from dbspec.tracking.mlflow_tracking import TrackingError
from dbspec.tracking.stores import check_store, sqlite_path
from tests.conftest import run_main
from tests.tracking.test_tracking_errors import COMMANDS

UNUSABLE = {
    "not-a-database": ("sqlite:////etc/passwd", "/etc/passwd is not a SQLite database"),
    "a-directory": ("sqlite:////etc", "/etc is a directory, not a SQLite database file"),
    "file-store": ("file:///etc", "MLflow 3 no longer accepts a file store"),
    "plain-path": ("/etc", "MLflow 3 no longer accepts a file store"),
    "no-driver": ("postgresql://u:p@127.0.0.1:1/db", "the database driver is not installed"),
    "unknown-scheme": ("nosuchscheme://x", "unsupported URI 'nosuchscheme://x'"),
}


@pytest.mark.parametrize("case", sorted(UNUSABLE))
def test_an_unusable_store_is_one_line(case, monkeypatch):
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    uri, message = UNUSABLE[case]
    with pytest.raises(TrackingError) as raised:
        check_store(uri, must_exist=False)
    assert str(raised.value).startswith(f"tracking URI {uri}: ") and message in str(raised.value)
    assert "\n" not in str(raised.value)


def test_a_missing_database_is_refused_to_readers_and_created_for_runs(tmp_path):
    database = tmp_path / "new" / "mlflow.db"
    with pytest.raises(TrackingError, match="no database at .*: run a spec first"):
        check_store(f"sqlite:///{database}", must_exist=True)
    assert not database.exists()
    check_store(f"sqlite:///{database}", must_exist=False)
    assert database.read_bytes().startswith(b"SQLite format 3\x00")
    check_store(f"sqlite:///{database}", must_exist=True)  # now it is there


def test_a_store_another_process_sets_up_is_waited_for(tmp_path):
    database = tmp_path / "mlflow.db"
    other = HostLock(tmp_path / "mlflow.db.lock").acquire("another run")
    said: list[str] = []

    def say(line: str) -> None:
        said.append(line)
        if line.startswith("waiting for"):
            other.release()  # the other process is done with the store

    check_store(f"sqlite:///{database}", must_exist=False, say=say)
    assert said[0].startswith(f"creating the MLflow tracking store {database} ")
    assert said[1].startswith(f"waiting for pid {os.getpid()} on host ") and \
        said[1].endswith(f"which is setting up the tracking store {database}")
    assert database.read_bytes().startswith(b"SQLite format 3\x00")


def test_a_store_held_past_the_wait_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(stores, "_STORE_WAIT_SECONDS", 0.0)
    other = HostLock(tmp_path / "mlflow.db.lock").acquire("another run")
    try:
        with pytest.raises(TrackingError, match=rf"the tracking store {tmp_path}/mlflow.db is "
                                                rf"held by pid {os.getpid()} on host "):
            check_store(f"sqlite:///{tmp_path / 'mlflow.db'}", must_exist=False)
    finally:
        other.release()


def test_sqlite_paths_absolute_and_relative():
    assert str(sqlite_path("sqlite:////abs/m.db")) == "/abs/m.db"
    assert str(sqlite_path("sqlite:///rel/m.db")) == "rel/m.db"
    assert sqlite_path("sqlite://") is None and sqlite_path("http://x") is None


# every command that takes a tracking URI, with a file that is not a database
@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_refuses_a_store_that_is_not_a_database(name, workdir, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:////etc/passwd")
    started = time.monotonic()
    code, _, err = run_main(*COMMANDS[name])
    assert code == 1, err
    assert "tracking URI sqlite:////etc/passwd: /etc/passwd is not a SQLite database" in err
    assert "Traceback" not in err and time.monotonic() - started < 60


@pytest.mark.parametrize("state_dir, message", [
    ("/proc/dbspec-none/state", "cannot create it: No such file or directory"),
    ("a-file", "exists and is not a directory"),
    ("a-file/below", "cannot create it: Not a directory"),
])
def test_run_with_an_unusable_state_dir_is_one_line(state_dir, message, workdir):
    (workdir / "a-file").write_text("")
    code, _, err = run_main(*COMMANDS["run"], "--state-dir", state_dir)
    assert code == 1 and f"error: --state-dir {state_dir}: {message}" in err, err
    assert "Traceback" not in err
