"""One ``dbspec run`` per run directory at a time: an advisory lock file with its holder's name.

The lock is ``<run dir>/run.lock`` (``.dbspec/runs/<spec>[@target][-smoke][/key-K]/``), the
directory whose ``state.json`` and ``stages/`` two runs would otherwise share. A lock per state
dir would also serialise unrelated specs (or targets) of one project, which share nothing but
the MLflow store.

``fcntl.flock`` on the file decides who holds it: the kernel grants it to one open file at a
time, so two simultaneous starts cannot both win, and it drops it when the holder dies, however
it dies, so no lock outlives its process. The file's content only names the holder (PID, host,
start time) for the refusal message. A clean exit empties the file; a file that still names a
holder when the lock is free was left by a process that died holding it, which the next run
says when it takes over (the file is never removed: removing it would let a third process lock
a new file while a second one locks the old).
"""

from __future__ import annotations

import errno
import json
import os
import socket
import time
from pathlib import Path
from typing import Optional

from dbspec.errors import DbspecError

LOCK_NAME = "run.lock"


class RunLocked(DbspecError):
    """Another live process runs this spec in this run directory."""


class RunLock:
    """The lock of one run directory, held from :meth:`acquire` to :meth:`release`.

    Attributes:
        path: The lock file.
        previous: What a holder that died left in the file (``pid``, ``host``, ``started``),
            found by :meth:`acquire`; None when the last holder let go cleanly.
        supported: False when the file system refused advisory locks (the run then goes on
            unlocked, and the caller says so).
    """

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / LOCK_NAME
        self.previous: Optional[dict] = None
        self.supported = True
        self._fd: Optional[int] = None

    def acquire(self, what: str) -> "RunLock":
        """Take the lock or fail at once; ``what`` names the run in the refusal.

        Raises:
            RunLocked: a live process holds it (the message names its PID, host and start).
        """
        import fcntl

        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd, tries=5)
            os.close(fd)
            raise RunLocked(f"{what} is already running in {self.path.parent} "
                            f"({describe_holder(holder)}); wait for it to end or stop it, "
                            "then run again") from None
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                self.supported = False
                return self
            raise
        self._fd = fd
        left = _read_holder(fd, tries=1)
        self.previous = left or None
        record = {"pid": os.getpid(), "host": socket.gethostname(),
                  "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        data = json.dumps(record).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)
        os.fsync(fd)
        return self

    def release(self) -> None:
        """Empty the file (a clean end) and let go; safe to call twice."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            os.ftruncate(fd, 0)
        finally:
            os.close(fd)  # closing the last descriptor drops the flock


def describe_holder(holder: Optional[dict]) -> str:
    """``pid 123 on host h since T`` (or that the holder is still writing its name)."""
    if not holder:
        return "held by a process that is just starting"
    return (f"pid {holder.get('pid')} on host {holder.get('host')} since "
            f"{holder.get('started')}")


def _read_holder(fd: int, *, tries: int) -> dict:
    """The holder's record, or {} for an empty or half-written file (a holder's first
    instants, between taking the lock and writing its name: read ``tries`` times)."""
    for attempt in range(tries):
        if attempt:
            time.sleep(0.02)
        raw = os.pread(fd, 4096, 0)
        if raw:
            try:
                found = json.loads(raw.decode())
                return found if isinstance(found, dict) else {}
            except (ValueError, UnicodeDecodeError):
                pass
    return {}
