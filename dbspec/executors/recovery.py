"""How a run that fails or dies is told, and how the next run deals with what it left.

* A failed stage says its cause and how to go on from where it stopped
  (:func:`failure_message`).
* Every MLflow run dbspec starts is tagged with its process (``dbspec.pid``, ``dbspec.host``);
  the next run of the spec ends those whose process is gone as KILLED (:func:`end_dead_runs`).
* SIGTERM unwinds a run like Ctrl-C (:func:`sigterm_unwinds`): the MLflow run ends KILLED with
  its metrics flushed, the stage is recorded as failed and can be resumed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

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
    """End as KILLED the RUNNING runs of ``spec``@``target`` whose process died on this host;
    returns their ids. Runs of other hosts, or without the process tags, are left alone."""
    here = socket.gethostname()
    found = client.search_runs([experiment_id], f"attributes.status = 'RUNNING' and "
                               f"tags.`dbspec.spec` = '{quoted(spec)}'", max_results=200)
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


def quoted(value: str) -> str:
    """``value`` escaped for a quoted string of an MLflow search filter."""
    return value.replace("\\", "\\\\").replace("'", "\\'")


@contextlib.contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """Turn the first SIGTERM into :class:`Terminated` in the main thread; later ones are
    ignored while the run unwinds, so its flush and its MLflow run's end are not cut short.
    Off the main thread signals cannot be handled: no-op."""
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


def failure_message(spec: Any, name: str, exc: BaseException, directory: Path,
                    resume_command: Optional[str]) -> str:
    """``stage 'NAME' failed: CAUSE`` and a hint to fix and resume (finished stages are kept).

    A data error is fixed in the data or the spec, so the same command runs again; a
    refusal of the tracking server names the permission; anything unexpected points at the
    stage's ``error.txt`` with its traceback.
    """
    from dbspec.data.sources import DataError
    from dbspec.registry.errors import is_permission_denied

    resume = f"\n  resume with: {resume_command} --resume" if resume_command else ""
    if isinstance(exc, DataError):
        cause = str(exc)
        resume = ("\n  fix the data or the spec (or its --set values), then run again; "
                  "finished stages are kept" + (f": {resume_command}" if resume_command else ""))
    elif isinstance(exc, DbspecError):
        cause = str(exc)
    elif is_permission_denied(exc):  # a tracking server with auth refused its user
        cause = _refusal(spec, name, exc)
        resume = resume.replace("resume with", "then resume with")
    else:
        cause = f"{type(exc).__name__}: {exc} (traceback in {directory / 'error.txt'})"
    return f"stage '{name}' failed: {cause}{resume}"


def _refusal(spec: Any, stage: str, exc: BaseException) -> str:
    """Who may not do what in ``stage``, and the permission it takes (docs/howto/roles.md)."""
    from dbspec.registry.errors import denied

    if stage in ("register", "promote"):
        what, needs = f"registered model '{spec.registry.name}'", "EDIT on the registered model"
    else:
        what = f"experiment '{spec.tracking.experiment or spec.name}'"
        needs = "EDIT on the experiment (roles.data_scientist or roles.admin)"
    return str(denied(exc, f"write the {stage} stage's results to the {what}", needs))
