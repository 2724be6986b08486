"""The registry lock behind :meth:`dbspec.registry.Registry.guarded_move`: dbspec's one file
lock (:mod:`dbspec.filelocks`), on a file chosen by the store.

- A SQLite store: ``<database>.dbspec-lock`` beside the database. Every process that uses the
  store runs on this machine, so every writer is excluded.
- Any other store (an ``mlflow server``, Databricks): a file in the user's cache directory named
  after the store and the model. It serialises dbspec writers on this machine only. MLflow has
  no compare-and-set, so nothing serialises writers on different machines; the re-reads around
  each move (``guarded_move``) catch a holder that changed in between, and on Databricks the
  generated deployment job runs one promotion at a time (its runs queue). What is and is not
  serialised is said in the README's registry guarantees.
"""

from __future__ import annotations

import hashlib
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional

from dbspec.filelocks import HostLock, LockBusy
from dbspec.registry.errors import RegistryError


def lock_path(database: Optional[Path], store_uri: str, name: str) -> Path:
    """The lock file of ``name``'s aliases: beside a SQLite ``database``, else in the cache."""
    if database is not None:
        return Path(f"{database}.dbspec-lock")
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    digest = hashlib.sha256(f"{store_uri}\n{name}".encode()).hexdigest()[:24]
    return cache / "dbspec" / "registry-locks" / f"{digest}.lock"


@contextmanager
def registry_lock(path: Path, name: str, wait: float) -> Iterator[None]:
    """Hold the lock at ``path`` (waiting at most ``wait`` seconds).

    Raises:
        RegistryError: it stayed held, or the lock file cannot be made.
    """
    lock = HostLock(path)
    try:
        lock.acquire(f"the registry lock of {name} ({path})", wait=wait)
    except LockBusy as busy:
        raise RegistryError(str(busy)) from None
    except OSError as exc:
        raise RegistryError(f"cannot open the registry lock {path}: {exc.strerror}") from None
    try:
        yield
    finally:
        lock.release()
