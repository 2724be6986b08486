"""One ``dbspec run`` per run directory at a time.

The lock is ``<run dir>/run.lock``, on the directory whose ``state.json`` and ``stages/`` two
runs would share (one per state dir would also serialise unrelated specs of one project). It is
a :class:`~dbspec.filelocks.HostLock`: taken at once or refused with its holder's name, dropped
by the kernel when the holder dies, which the next run is told (:attr:`RunLock.previous`).
"""

from __future__ import annotations

from pathlib import Path

from dbspec.filelocks import HostLock, LockBusy, describe_holder

__all__ = ["LOCK_NAME", "RunLock", "RunLocked", "describe_holder"]

LOCK_NAME = "run.lock"


class RunLocked(LockBusy):
    """Another live process runs this spec in this run directory."""


class RunLock(HostLock):
    """The lock of one run directory, held from :meth:`acquire` to :meth:`release`."""

    def __init__(self, run_dir: Path):
        super().__init__(Path(run_dir) / LOCK_NAME)

    def acquire(self, what: str, *, wait: float = 0.0,
                unsupported_ok: bool = True) -> "RunLock":
        """Take the lock or fail at once; ``what`` names the run in the refusal. A file
        system without advisory locks lets the run go on unlocked (``supported`` False).

        Raises:
            RunLocked: a live process holds it (the message names its PID, host and start).
        """
        try:
            super().acquire(what, wait=wait, unsupported_ok=unsupported_ok)
        except LockBusy as busy:
            raise RunLocked(f"{what} is already running in {self.path.parent} "
                            f"({describe_holder(busy.holder)}); wait for it to end or stop it, "
                            "then run again", busy.holder) from None
        return self
