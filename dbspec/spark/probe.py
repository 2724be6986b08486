"""Ask the executors, before any work, whether they can do it.

A cluster's executors have their own interpreter and their own disk. A tiny Spark job — one
task per core — reports from each executor its Python, whether it imports dbspec (and which
version), and which of the given paths it sees and can write. A missing module, a wrong
version or an unreachable shared dir then fails in a second with the cause, instead of minutes
into training as a Java stack.
"""

from __future__ import annotations

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


def _make_probe(paths: tuple[str, ...], writable: tuple[bool, ...]):
    # defined inside a function so cloudpickle ships it by value: unpickling it on an
    # executor must not need dbspec, whose import is what it checks
    def probe(_):
        import os
        import socket
        import sys
        import uuid

        try:
            import dbspec

            version = dbspec.__version__
        except Exception as exc:  # reported, not raised: the driver words the error
            version = f"!{type(exc).__name__}: {exc}"
        seen, writes = [], []
        for path, check_write in zip(paths, writable):
            seen.append(os.path.exists(path))
            ok = False
            if check_write:
                try:
                    os.makedirs(path, exist_ok=True)
                    marker = os.path.join(path, f".dbspec-probe-{uuid.uuid4().hex}")
                    with open(marker, "w") as handle:
                        handle.write("x")
                    os.remove(marker)
                    ok = True
                except OSError:
                    ok = False
            writes.append(ok)
        from pyspark import TaskContext

        context = TaskContext.get()
        executor = context.getLocalProperty("spark.executor.id") if context else None
        yield (socket.gethostname(), executor or os.environ.get("SPARK_EXECUTOR_ID", "?"),
               sys.executable, version, tuple(seen), tuple(writes))

    return probe


def probe_executors(session, *, read: Sequence[str] = (), write: Sequence[str] = (),
                    tasks: Optional[int] = None) -> list[ExecutorReport]:
    """Run the probe on (up to) every executor core; raises on the first problem.

    Args:
        session: The active SparkSession.
        read: Paths every executor must see (inputs).
        write: Directories every executor must be able to write (created if missing).
        tasks: Probe tasks (default: the cluster's default parallelism).

    Raises:
        ExecutorCheckFailed: naming the executor, what it lacks and what to do.
    """
    import dbspec
    from dbspec.spark import python_cause

    paths = tuple(read) + tuple(write)
    flags = tuple(False for _ in read) + tuple(True for _ in write)
    context = session.sparkContext
    count = tasks or max(context.defaultParallelism, 1)
    try:
        rows = context.parallelize(range(count), count) \
            .mapPartitions(_make_probe(paths, flags)).collect()
    except Exception as exc:  # Py4J carries the executor's Python error
        raise ExecutorCheckFailed(f"the executors of {context.master} cannot run dbspec's "
                                  f"check task: {python_cause(exc)}") from None
    reports = [ExecutorReport(*row) for row in rows]
    for report in reports:
        where = f"executor {report.executor} on {report.host} ({report.python})"
        if report.dbspec.startswith("!"):
            raise ExecutorCheckFailed(
                f"{where} cannot import dbspec: {report.dbspec[1:]}; install dbspec "
                f"{dbspec.__version__} on every node, or point spark.pyspark.python "
                "(spark.conf) / PYSPARK_PYTHON at an interpreter that has it")
        if report.dbspec != dbspec.__version__:
            raise ExecutorCheckFailed(
                f"{where} has dbspec {report.dbspec}, the driver {dbspec.__version__}; install "
                "the same version on every node")
        for path, seen, can_write, must_write in zip(paths, report.visible, report.writable,
                                                     flags):
            if must_write and not can_write:
                raise ExecutorCheckFailed(
                    f"{where} cannot write {path}; the shared dir must be a directory every "
                    "node mounts read-write (spark.shared_dir, DBSPEC_SHARED_DIR, --shared-dir)")
            if not must_write and not seen:
                raise ExecutorCheckFailed(
                    f"{where} does not see {path}: it is on this machine only; use a path "
                    "every node reaches (the shared dir, a UC Volume, object storage)")
    return reports


def check_executors(session, spec, *, shared_dir: Optional[str], executor: str,
                    say=lambda text: None) -> None:
    """Probe the executors when this run hands them work and they are on other machines.

    Raises:
        ExecutorCheckFailed: see :func:`probe_executors`.
    """
    from dbspec.spark.placement import is_local_master, ranks_on_executors, trials_on_executors

    master = session.sparkContext.master
    if is_local_master(master) or not (ranks_on_executors(spec)
                                       or trials_on_executors(spec, executor)):
        return
    reports = probe_executors(session, write=[shared_dir] if shared_dir else [])
    hosts = sorted({f"{r.executor}@{r.host}" for r in reports})
    say(f"  executors checked: {', '.join(hosts)} import dbspec and write {shared_dir}")
