"""Start a command that stops at a named :mod:`dbspec.faults` pause point, then kill it there."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import ROOT, checkout_env


def run_until_paused(args: list[str], point: str, marker: Path, *, cwd: Path = ROOT,
                     env: dict | None = None, timeout: float = 180) -> subprocess.Popen:
    """``python -m dbspec ARGS`` in a new process, returned once it sleeps at ``point``.

    Fails the test (with the command's output) when the process exits or does not reach
    ``point`` within ``timeout`` seconds.
    """
    marker.unlink(missing_ok=True)
    full = checkout_env({**(env or {}), "DBSPEC_PAUSE_AT": point,
                         "DBSPEC_PAUSE_FILE": str(marker)})
    process = subprocess.Popen([sys.executable, "-m", "dbspec", *args], cwd=cwd, env=full,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + timeout
    while not marker.exists():
        if process.poll() is not None:
            output = process.stdout.read() if process.stdout else ""
            raise AssertionError(f"{args} exited {process.returncode} before {point}:\n{output}")
        if time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"{args} did not reach {point} in {timeout:.0f} s")
        time.sleep(0.1)
    return process


def kill_paused(process: subprocess.Popen) -> str:
    """SIGKILL a process from :func:`run_until_paused`; returns what it printed."""
    os.kill(process.pid, signal.SIGKILL)
    output, _ = process.communicate(timeout=30)
    return output or ""
