"""What a run leaves behind when its process dies, and how the next run deals with it.

* Every MLflow run dbspec starts carries ``dbspec.pid`` and ``dbspec.host`` tags
  (:func:`dbspec.tracking.mlflow_tracking.process_tags`). The next ``dbspec run`` of the same
  spec and target ends the RUNNING runs whose process is gone from this host as KILLED
  (:func:`end_dead_runs`): a ``kill -9`` leaves no RUNNING run behind for longer than it takes
  to start the spec again.
* SIGTERM unwinds a run like Ctrl-C (:func:`sigterm_unwinds`): the MLflow run ends KILLED with
  its buffered metrics flushed, the stage is recorded as failed and can be resumed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
from typing import Callable, Iterator, Optional

from dbspec.errors import DbspecError
from dbspec.tracking.mlflow_tracking import process_alive

PID_TAG, HOST_TAG = "dbspec.pid", "dbspec.host"
ENDED_TAG = "dbspec.ended_by"


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived. A KeyboardInterrupt, so everything that cleans up after Ctrl-C (MLflow
    runs ending KILLED, stage records, Optuna trials) does so here too, and no ``except
    Exception`` in a stage or trial swallows it."""


class RunTerminated(DbspecError):
    """The run stopped on SIGTERM (exit code 143, as a shell reports a SIGTERM'd command)."""

    exit_code = 143


def end_dead_runs(client, experiment_id: str, *, spec: str, target: Optional[str],
                  say: Callable[[str], None]) -> list[str]:
    """End as KILLED the RUNNING runs of ``spec``@``target`` whose process died on this host.

    Runs of other hosts are left alone (their processes cannot be seen from here), and so are
    runs without the process tags (older dbspec versions, other tools). Returns the run ids.
    """
    here = socket.gethostname()
    name = spec.replace("\\", "\\\\").replace("'", "\\'")
    found = client.search_runs([experiment_id], f"attributes.status = 'RUNNING' and "
                               f"tags.`dbspec.spec` = '{name}'", max_results=200)
    ended = []
    for run in found:
        tags = run.data.tags
        if run.info.status != "RUNNING" or tags.get("dbspec.target", "") != (target or ""):
            continue
        if tags.get(HOST_TAG) != here or not tags.get(PID_TAG, "").isdigit():
            continue
        pid = int(tags[PID_TAG])
        if process_alive(pid, since_ms=run.info.start_time):
            continue
        reason = (f"process {pid} on {here} died while the run was RUNNING; ended KILLED by "
                  f"the next run of {spec} (pid {os.getpid()})")
        client.set_tag(run.info.run_id, ENDED_TAG, reason)
        client.set_terminated(run.info.run_id, "KILLED")
        say(f"warning: MLflow run {run.info.run_id} ({run.info.run_name}) was left RUNNING by "
            f"process {pid}, which died: marked KILLED")
        ended.append(run.info.run_id)
    return ended


@contextlib.contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """Turn the first SIGTERM into :class:`Terminated` in the main thread; later ones are
    ignored while the run unwinds, so its flush and its MLflow run's end are not cut short
    (SIGKILL still stops it at once). Off the main thread signals cannot be handled: no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    fired: list[int] = []

    def handler(signum, frame):
        if fired:
            return
        fired.append(signum)
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
