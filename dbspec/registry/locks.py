"""The registry lock behind :meth:`dbspec.registry.Registry.guarded_move`.

A SQLite store gets an ``flock`` on a file beside the database (:func:`file_lock`: every
process on the host, threads included). Any other store (an mlflow server, Databricks) gets
a lease in the registered model's ``dbspec.lock`` tag (:class:`TagLease`); its limits are in
the class's docstring and the README's "Registry guarantees".
"""

from __future__ import annotations

import json
import os
import random
import secrets
import time
from contextlib import contextmanager
from typing import Any, Iterator, Optional

from dbspec.processes import owner
from dbspec.registry.errors import RegistryError, is_permission_denied

LEASE_TAG = "dbspec.lock"


class Lease:
    """A held lock that cannot be lost (the file lock)."""

    def held(self, tags: Optional[dict[str, str]] = None) -> bool:
        """Whether the lock is still ours (``tags``: the model's, when just read)."""
        return True


class TagLease(Lease):
    """A lease in a registered-model tag: ``{"owner", "expires", "by"}``.

    MLflow has no compare-and-set, so a writer takes a free (or expired) lease by writing it,
    waiting :attr:`Registry.lease_settle_s` and reading it back: of writers that raced, the
    last write wins and the others see it and wait. This excludes as long as no writer takes
    longer than the settle time between reading the lease free and writing it, and holders
    finish within the lease's time (clocks agreeing to well under it); the re-reads around
    each move are the second line of defence.
    """

    def __init__(self, registry: Any, name: str):
        self.registry, self.name = registry, name
        self.token = secrets.token_hex(8)
        self.expires = 0.0

    def _current(self, tags: dict[str, str]) -> Optional[dict]:
        """The unexpired lease in ``tags``, or None."""
        try:
            lease = json.loads(tags.get(LEASE_TAG) or "null")
        except json.JSONDecodeError:
            return None
        return lease if isinstance(lease, dict) and lease.get("expires", 0) > time.time() \
            else None

    def _ours(self, tags: dict[str, str]) -> bool:
        lease = self._current(tags)
        return lease is not None and lease.get("owner") == self.token

    def acquire(self) -> None:
        registry = self.registry
        deadline = time.monotonic() + registry.lock_wait_s
        while True:
            lease = self._current(registry.snapshot(self.name).tags)
            if lease is None or lease.get("owner") == self.token:
                if self._write():
                    time.sleep(registry.lease_settle_s)
                    if self._ours(registry.snapshot(self.name).tags):
                        return
            elif time.monotonic() > deadline:
                raise RegistryError(f"the registry lock on {self.name} (its {LEASE_TAG} tag) is "
                                    f"held by {lease.get('by', '?')}; waited "
                                    f"{registry.lock_wait_s:.0f} s. A dead holder's lease "
                                    "expires by itself; try again later")
            time.sleep(random.uniform(0.05, 0.25))

    def _write(self) -> bool:
        """Write our lease; False when a concurrent write of the tag made the store refuse
        (an mlflow server on SQLite answers a UNIQUE constraint error): the race is lost.

        Raises:
            MlflowException: the server refused the caller (403/401), which the registry's
                callers report as a :class:`~dbspec.registry.errors.RegistryPermissionError`.
        """
        from mlflow.exceptions import MlflowException

        self.expires = time.time() + self.registry.lease_ttl_s
        value = {"owner": self.token, "expires": self.expires, "by": owner()}
        try:
            self.registry.client.set_registered_model_tag(self.name, LEASE_TAG, json.dumps(value))
        except MlflowException as exc:
            if is_permission_denied(exc):
                raise  # a caller who may not write tags (READ only) waits for nothing
            return False
        return True

    def held(self, tags: Optional[dict[str, str]] = None) -> bool:
        """True while the lease is ours (renewed past half its time); else it is taken again
        and the caller must read anew (False)."""
        if self._ours(self.registry.snapshot(self.name).tags if tags is None else tags):
            if self.expires - time.time() < self.registry.lease_ttl_s / 2:
                self._write()
            return True
        self.acquire()
        return False

    def release(self) -> None:
        from mlflow.exceptions import MlflowException

        if self._ours(self.registry.snapshot(self.name).tags):
            try:
                self.registry.client.delete_registered_model_tag(self.name, LEASE_TAG)
            except MlflowException:
                pass  # raced with a writer taking it over; the lease expires anyway


@contextmanager
def file_lock(path: str, wait: float) -> Iterator[None]:
    """``flock`` on ``path`` (separate opens exclude each other, threads included)."""
    import fcntl

    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise RegistryError(f"cannot open the registry lock {path}: {exc.strerror}") from None
    try:
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "?"
                    raise RegistryError(f"the registry lock {path} is held by {holder}; waited "
                                        f"{wait:.0f} s") from None
                time.sleep(0.01)
        os.ftruncate(fd, 0)
        os.pwrite(fd, owner().encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock
