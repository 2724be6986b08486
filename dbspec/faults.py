"""Named pause points, so a test can kill a process inside a crash window deterministically.

Production code calls :func:`pause_point` at the few places where a kill would leave state
half-written (between creating a registry version and recording its gate decision, between
moving an alias and writing its history...). Unless ``DBSPEC_PAUSE_AT`` names that point the
call does nothing (one dictionary lookup). When it does, the process writes its PID to the
file named by ``DBSPEC_PAUSE_FILE`` (if set) and sleeps until it is killed, so the test waits
for the file, sends ``SIGKILL`` and then checks what the next run makes of the leftovers.

This is a test seam only: nothing in a spec or on the command line reaches it.
"""

from __future__ import annotations

import os
import time

from dbspec.atomic import write_atomic

PAUSE_ENV = "DBSPEC_PAUSE_AT"
PAUSE_FILE_ENV = "DBSPEC_PAUSE_FILE"


def pause_point(name: str) -> None:
    """Sleep forever here when ``DBSPEC_PAUSE_AT`` names ``name`` (comma-separated list)."""
    wanted = os.environ.get(PAUSE_ENV)
    if not wanted or name not in wanted.split(","):
        return
    marker = os.environ.get(PAUSE_FILE_ENV)
    if marker:
        write_atomic(marker, f"{os.getpid()} {name}\n", durable=False)
    while True:  # the test kills the process here
        time.sleep(3600)
