"""The one file lock dbspec takes: a run directory, a registry's aliases, an inference table's
writer.

It is ``filelock``'s (``flock`` on POSIX): the kernel grants it to one open file at a time and
drops it when the holder dies, however it dies. The file's content only names the holder (PID,
host, start time) for refusals; a clean release empties it, so a file still naming a holder
when the lock is free was left by a dead one (:attr:`HostLock.previous`). The file is never
removed: a third process could then lock a new file while a second one locks the old.
It excludes processes (and threads) of one machine, not other machines.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import time
from pathlib import Path
from typing import Any, Optional

from dbspec.errors import DbspecError

#: errno values of file systems that refuse advisory locks.
_UNSUPPORTED = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)


class LockBusy(DbspecError):
    """Another live process holds the lock.

    Attributes:
        holder: What the holder wrote in the lock file (``pid``, ``host``, ``started``); empty
            while it is just starting.
    """

    def __init__(self, message: str, holder: dict[str, Any]):
        super().__init__(message)
        self.holder = holder


class HostLock:
    """An exclusive lock on one file, held from :meth:`acquire` to :meth:`release`; keep the
    object meanwhile (``filelock`` lets go of a collected lock).

    Attributes:
        previous: What a holder that died left in the file; None after a clean release.
        supported: False when the file system refused advisory locks (``unsupported_ok``).
    """

    def __init__(self, path: Path | str):
        self.path = Path(path)
        self.previous: Optional[dict[str, Any]] = None
        self.supported = True
        self._lock: Any = None

    def acquire(self, what: str, *, wait: float = 0.0,
                unsupported_ok: bool = False) -> "HostLock":
        """Take the lock, waiting at most ``wait`` seconds; ``what`` names it in a refusal.

        Raises:
            LockBusy: a live process held it throughout (the message names it).
            OSError: the lock file cannot be made, or advisory locks are refused and not
                ``unsupported_ok``.
        """
        from filelock import FileLock, Timeout

        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock = FileLock(self.path, timeout=wait, thread_local=False, is_singleton=False,
                        preserve_lock_file=True, fallback_to_soft=False)
        try:
            lock.acquire()
        except Timeout:
            holder = read_holder(self.path, tries=5)
            raise LockBusy(f"{what} is held by {describe_holder(holder)}"
                           + (f"; waited {wait:.0f} s" if wait >= 1 else ""), holder) from None
        except OSError as exc:
            if unsupported_ok and exc.errno in _UNSUPPORTED:
                self.supported = False
                return self
            raise
        self._lock = lock
        self.previous = read_holder(self.path, tries=1) or None
        record = {"pid": os.getpid(), "host": socket.gethostname(),
                  "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        _write(self.path, json.dumps(record).encode())
        return self

    def release(self) -> None:
        """Empty the file (a clean end) and let go; safe to call twice."""
        lock, self._lock = self._lock, None
        if lock is None:
            return
        try:
            _write(self.path, b"")
        except FileNotFoundError:
            pass  # the holder removed its file before letting go (nothing to empty)
        finally:
            lock.release()

    def __enter__(self) -> "HostLock":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def describe_holder(holder: Optional[dict[str, Any]]) -> str:
    """``pid 123 on host h since T`` (or that the holder is still writing its name)."""
    if not holder:
        return "a process that is just starting"
    return f"pid {holder.get('pid')} on host {holder.get('host')} since {holder.get('started')}"


def read_holder(path: Path, *, tries: int) -> dict[str, Any]:
    """The holder's record, or {} for an empty or half-written file (a holder's first
    instants, between taking the lock and writing its name: read ``tries`` times)."""
    for attempt in range(tries):
        if attempt:
            time.sleep(0.02)
        try:
            found = json.loads(path.read_bytes().decode() or "null")
        except (OSError, ValueError, UnicodeDecodeError):
            continue
        if isinstance(found, dict):
            return found
    return {}


def _write(path: Path, data: bytes) -> None:
    """Replace the file's content in place (the lock is on the file, not on its name)."""
    fd = os.open(path, os.O_RDWR)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)
        os.fsync(fd)
    finally:
        os.close(fd)
