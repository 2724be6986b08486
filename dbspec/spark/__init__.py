"""The Spark session dbspec starts and stops, in one place."""

from __future__ import annotations

import contextlib
import os
import re
import sys
from typing import Callable, Iterator, Optional

from dbspec.errors import DbspecError


def master_url(spec, override: Optional[str] = None) -> str:
    """``--master`` > ``spark.master`` in the spec > ``SPARK_MASTER`` > ``local[*]``."""
    return override or (spec.spark.master if spec is not None else None) or os.environ.get("SPARK_MASTER") or "local[*]"


def executor_python(spec, master: str) -> Optional[str]:
    """The interpreter to give the executors, or None to leave Spark's choice.

    ``spark.pyspark.python`` in ``spark.conf`` wins; else ``PYSPARK_PYTHON`` as set; else, for
    ``spark://`` masters, the driver's own interpreter (measured: without it a standalone
    cluster's executors run whatever ``python3`` their PATH has, and fail minutes later with
    ``No module named 'dbspec'``).
    """
    conf = spec.spark.conf if spec is not None else {}
    if "spark.pyspark.python" in conf:
        return str(conf["spark.pyspark.python"])
    if os.environ.get("PYSPARK_PYTHON") or not master.startswith("spark://"):
        return None
    return sys.executable


@contextlib.contextmanager
def spark_session(spec, master: Optional[str] = None,
                  say: Callable[[str], None] = lambda text: None) -> Iterator[object]:
    """An active SparkSession for the block; stopped afterwards if this block started it.

    Raises:
        DbspecError: pyspark is not installed (names the extra to install).
    """
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise DbspecError("this spec needs Spark: pip install 'dbspec[spark]'") from None
    active = SparkSession.getActiveSession()
    if active is not None:
        yield active
        return
    builder = (SparkSession.builder.master(master_url(spec, master))
               .appName(spec.spark.app_name or f"dbspec-{spec.name}" if spec is not None
                        else "dbspec")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false"))
    for key, value in (spec.spark.conf if spec is not None else {}).items():
        builder = builder.config(key, str(value))
    python = executor_python(spec, master_url(spec, master))
    if python:
        why = "spark.pyspark.python" if python != sys.executable else "the driver's interpreter"
        say(f"  executors run {python} ({why}; set spark.pyspark.python in spark.conf or "
            "PYSPARK_PYTHON to choose another)")
    try:
        # a SparkContext made from Python reads its executors' interpreter from PYSPARK_PYTHON
        # only (spark.pyspark.python is spark-submit's), and only while it starts
        with _environment("PYSPARK_PYTHON", python):
            session = builder.getOrCreate()
    except Exception as exc:  # a bad master URL, no Java: PySparkRuntimeError and friends
        raise DbspecError(f"cannot start Spark on {master_url(spec, master)}: "
                          f"{str(exc).strip().splitlines()[0][:300]}") from None
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()


@contextlib.contextmanager
def _environment(name: str, value: Optional[str]) -> Iterator[None]:
    """``name=value`` in the environment for the block (nothing when value is None)."""
    if value is None:
        yield
        return
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


_PY_ERROR = re.compile(r"^(?:[\w.]+\.)?(\w*(?:Error|Exception|Interrupt|Exit)|DbspecError\w*)"
                       r"(?::\s?(.*))?$")


def python_cause(exc: BaseException) -> str:
    """The Python exception an executor raised, out of the Py4J/Java error that carries it.

    A task's Python error reaches the driver as ``An error occurred while calling o56.…``, a
    Java stack, and the Python traceback somewhere inside; this returns the traceback's last
    ``Type: message`` line, with the lost executor when Spark names one.
    """
    text = str(exc)
    lines = [line.strip() for line in text.splitlines()]
    lost = next((m.group(0) for line in lines
                 if (m := re.search(r"ExecutorLostFailure \(executor \S+ exited[^)]*\)"
                                    r"(?: Reason: [^\n]{0,200})?", line))), "")
    cause = ""
    for index, line in enumerate(lines):
        if "Traceback (most recent call last)" in line:
            tail = next((candidate for candidate in lines[index + 1:]
                         if _PY_ERROR.match(candidate)), "")
            cause = tail or cause
    if not cause:
        cause = next((line for line in lines if line.startswith("pyspark.errors")
                      or "PythonException" in line), "")
    parts = [part for part in (cause, lost) if part]
    return "; ".join(parts) if parts else (lines[0] if lines else type(exc).__name__)[:500]
