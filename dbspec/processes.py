"""Processes of this host: whether one still lives, and how a holder names itself.

Locks and pending markers record ``host:pid`` (:func:`owner`); whoever finds one decides with
:func:`process_alive` whether its holder is gone, so a dead holder's lock can be taken over.
"""

from __future__ import annotations

import os
import socket
from typing import Optional


def owner() -> str:
    """``host:pid`` of this process."""
    return f"{socket.gethostname()}:{os.getpid()}"


def process_alive(pid: int, *, since_ms: Optional[float] = None) -> bool:
    """Whether process ``pid`` of this host lives (with ``since_ms``: and started before that
    time, so a PID the kernel has reused for a later process counts as dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: it exists
    stat = _proc_stat(pid)
    if stat is None:
        return True  # no /proc (not Linux): existence is all we know
    state, started = stat
    if state in ("Z", "X"):
        return False  # killed, not yet reaped by its parent
    return since_ms is None or started is None or started <= since_ms / 1000 + 2


def _proc_stat(pid: int) -> Optional[tuple[str, Optional[float]]]:
    """(state letter, start time in seconds since the epoch) from ``/proc``."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        with open("/proc/stat", encoding="ascii") as handle:
            boot = next(float(line.split()[1]) for line in handle if line.startswith("btime"))
    except (OSError, StopIteration, IndexError, ValueError):
        return None
    try:
        started: Optional[float] = boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (IndexError, ValueError, OSError):
        started = None
    return fields[0], started
