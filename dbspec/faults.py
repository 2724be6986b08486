"""Named pause points, so a test can kill a process inside a crash window deterministically.

:func:`pause_point` does nothing unless ``DBSPEC_PAUSE_AT`` names the point; then the process
writes its PID to ``DBSPEC_PAUSE_FILE`` (if set) and sleeps until the test kills it. A test seam
only: nothing in a spec or on the command line reaches it.
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
