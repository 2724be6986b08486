"""Ask the executors, before any work, whether they can do it: a tiny Spark job (a task per
core) reports each executor's Python, its dbspec version (or import error), and which of the
given paths it sees and can write. A missing module, a wrong version or an unreachable shared
dir then fails in a second with the cause, not minutes into training as a Java stack."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Optional, Sequence

from dbspec.errors import DbspecError


class ExecutorCheckFailed(DbspecError):
    """An executor cannot import dbspec or reach a path the run hands it."""


@dataclass(frozen=True)
class ExecutorReport:
    """What one executor task found."""

    host: str
    executor: str
    python: str
    dbspec: str  # the version, or the import error
    visible: tuple[bool, ...]
    writable: tuple[bool, ...]


def _make_probe(paths: tuple[str, ...], markers: tuple[Optional[str], ...]):
    # defined inside a function so cloudpickle ships it by value: unpickling it on an
    # executor must not need dbspec, whose import is what it checks
    def probe(_):
        import contextlib
        import os
        import socket
        import sys
        import tempfile

        try:
            import dbspec

            version = dbspec.__version__
        except Exception as exc:  # reported, not raised: the driver words the error
            version = f"!{type(exc).__name__}: {exc}"
        seen, writes = [], []
        for path, marker in zip(paths, markers):
            # a shared dir must be the same directory, not one of the same name on this
            # node's own disk: the driver's marker file tells
            seen.append(os.path.exists(os.path.join(path, marker) if marker else path))
            ok = False
            if marker:
                with contextlib.suppress(OSError), tempfile.TemporaryFile(dir=path):
                    ok = True
            writes.append(ok)
        # a standalone or YARN executor runs in a directory named after its id
        name = os.path.basename(os.getcwd())
        executor = name if name.isdigit() else f"pid {os.getpid()}"
        yield (socket.gethostname(), executor, sys.executable, version, tuple(seen),
               tuple(writes))

    return probe


def probe_executors(session, *, read: Sequence[str] = (), shared: Sequence[str] = (),
                    tasks: Optional[int] = None) -> list[ExecutorReport]:
    """Run the probe on (up to) every executor core (``tasks``, default: the cluster's default
    parallelism); raises on the first problem. Every executor must see the ``read`` paths, and
    see as this machine does and write the ``shared`` directories (created here if missing).

    Raises:
        ExecutorCheckFailed: naming the executor, what it lacks and what to do.
    """
    import os
    import uuid

    import dbspec
    from dbspec.spark.session import python_cause

    markers: list[Optional[str]] = [None] * len(read)
    for directory in shared:
        marker = f".dbspec-driver-{uuid.uuid4().hex}"
        try:
            os.makedirs(directory, exist_ok=True)
            open(os.path.join(directory, marker), "w").close()
        except OSError as exc:
            raise ExecutorCheckFailed(f"cannot write {directory} on this machine: "
                                      f"{exc.strerror or exc}") from None
        markers.append(marker)
    paths = tuple(read) + tuple(shared)
    context = session.sparkContext
    count = tasks or max(context.defaultParallelism, 1)
    try:
        rows = context.parallelize(range(count), count) \
            .mapPartitions(_make_probe(paths, tuple(markers))).collect()
    except Exception as exc:  # Py4J carries the executor's Python error
        raise ExecutorCheckFailed(f"the executors of {context.master} cannot run dbspec's "
                                  f"check task: {python_cause(exc)}") from None
    finally:
        for directory, marker in zip(paths, markers):
            if marker:
                with contextlib.suppress(OSError):
                    os.remove(os.path.join(directory, marker))
    reports = [ExecutorReport(*row) for row in rows]
    for report in reports:
        _check_report(report, paths, markers, dbspec.__version__)
    return reports


def _check_report(report: ExecutorReport, paths, markers, version: str) -> None:
    where = f"executor {report.executor} on {report.host} ({report.python})"
    if report.dbspec.startswith("!"):
        raise ExecutorCheckFailed(
            f"{where} cannot import dbspec: {report.dbspec[1:]}; install dbspec {version} on "
            "every node, or point spark.pyspark.python (spark.conf) / PYSPARK_PYTHON at an "
            "interpreter that has it")
    if report.dbspec != version:
        raise ExecutorCheckFailed(f"{where} has dbspec {report.dbspec}, the driver {version}; "
                                  "install the same version on every node")
    for path, marker, seen, can_write in zip(paths, markers, report.visible, report.writable):
        if marker and not seen:
            raise ExecutorCheckFailed(
                f"{where} does not see {path} as this machine does (there it is another, "
                "node-local directory); use a directory every node mounts: a UC Volume, "
                "dbfs:/, NFS, or object storage")
        if marker and not can_write:
            raise ExecutorCheckFailed(f"{where} cannot write {path}; it must be writable from "
                                      "every node")
        if not marker and not seen:
            raise ExecutorCheckFailed(
                f"{where} does not see {path}: it is on this machine only; use a path every "
                "node reaches (the shared dir, a UC Volume, object storage)")


def check_executors(session, spec, *, shared_dir: Optional[str], executor: str,
                    say=lambda text: None) -> None:
    """Probe the executors (:func:`probe_executors`) when this run hands them work and they are
    on other machines: the shared dir for ranks and trials, the source for the spark executor."""
    from dbspec.spark.placement import is_local_master, ranks_on_executors, trials_on_executors

    master = session.sparkContext.master
    if is_local_master(master):
        return
    needs_shared = ranks_on_executors(spec) or trials_on_executors(spec, executor)
    read = source_paths(spec) if executor == "spark" else []
    shared = [shared_dir] if needs_shared and shared_dir else []
    if not (shared or read):
        return
    reports = probe_executors(session, read=read, shared=shared)
    hosts = sorted({f"{r.executor}@{r.host}" for r in reports})
    what = " and ".join(part for part in (
        f"read {', '.join(read)}" if read else "", f"write {shared_dir}" if shared else "")
        if part)
    say(f"  executors checked: {', '.join(hosts)} import dbspec and {what}")


def source_paths(spec) -> list[str]:
    """The data source's path when it is a file on this machine's file system (not a URI)."""
    from pathlib import Path

    path = getattr(spec.data.source, "path", None)
    if not path or "://" in path or path.startswith("dbfs:"):
        return []
    resolved = Path(path).expanduser().resolve()
    return [str(resolved)] if resolved.exists() else []  # a missing file: load_data says so
