"""The Spark session dbspec starts and stops, in one place.

A session dbspec starts is quiet unless ``--verbose`` (``DBSPEC_VERBOSE=1``): the driver's
log4j starts from :data:`QUIET_LOG4J` (no start-up notices a run cannot act on) unless the
spec's ``spark.driver.extraJavaOptions`` names its own, and pyspark's FutureWarning about
pandas 3 is hidden (every Spark path dbspec uses runs in its tests with pandas 3). The JVM's
"WARNING: Using incubator modules" stays: no setting turns it off.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from dbspec.atomic import write_atomic
from dbspec.errors import DbspecError

VERBOSE_ENV = "DBSPEC_VERBOSE"

#: The driver's log4j2 configuration while a session starts (the root level must stay WARN:
#: Spark prints "Setting default log level" whenever the root level differs from the shell's
#: default, WARN); dbspec sets the level to ERROR once the session is up.
QUIET_LOG4J = """\
rootLogger.level = warn
rootLogger.appenderRef.console.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex
logger.hostname.name = org.apache.spark.util.Utils
logger.hostname.level = error
logger.hadoop.name = org.apache.hadoop.util.NativeCodeLoader
logger.hadoop.level = error
"""


def verbose() -> bool:
    return os.environ.get(VERBOSE_ENV, "") not in ("", "0")


def quiet_java_options(conf: dict) -> Optional[str]:
    """``spark.driver.extraJavaOptions`` that start the driver's log4j from
    :data:`QUIET_LOG4J` (after the spec's own options), or None to leave them as they are."""
    given = str(conf.get("spark.driver.extraJavaOptions", ""))
    if verbose() or "log4j2.configurationFile" in given or "log4j.configuration" in given:
        return None
    digest = hashlib.sha256(QUIET_LOG4J.encode()).hexdigest()[:12]
    path = Path(tempfile.gettempdir()) / f"dbspec-log4j2-{digest}.properties"
    if not path.is_file():
        write_atomic(path, QUIET_LOG4J, durable=False)  # others may write the same bytes at once
    return f"{given} -Dlog4j2.configurationFile={path.as_uri()}".strip()


def quiet_pyspark_warnings() -> None:
    """Hide pyspark's 'does not yet fully support pandas >= 3.0.0' (see the module docstring)."""
    if not verbose():
        warnings.filterwarnings("ignore", message=r"PySpark does not yet fully support pandas",
                                category=FutureWarning)


def master_url(spec, override: Optional[str] = None) -> str:
    """``--master`` > ``spark.master`` in the spec > ``SPARK_MASTER`` > ``local[*]``."""
    return (override or (spec.spark.master if spec is not None else None)
            or os.environ.get("SPARK_MASTER") or "local[*]")


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


def session_at_hand() -> Optional[Any]:
    """The Spark session running in this process, else a Databricks cluster's own (neither
    configured nor stopped by dbspec); None without either, or without pyspark."""
    import importlib.util

    if importlib.util.find_spec("pyspark") is None:
        return None
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is None and os.environ.get("DATABRICKS_RUNTIME_VERSION"):
        active = SparkSession.builder.getOrCreate()
    return active


@contextlib.contextmanager
def spark_session(spec, master: Optional[str] = None,
                  say: Callable[[str], None] = lambda text: None) -> Iterator[object]:
    """An active SparkSession for the block; stopped afterwards if this block started it, never
    on a Databricks cluster, whose session serves every task (a :class:`DbspecError` naming the
    extra when pyspark is not installed)."""
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise DbspecError("this spec needs Spark: pip install 'dbspec[spark]'") from None
    active = session_at_hand()
    if active is not None:
        yield active
        return
    builder = (SparkSession.builder.master(master_url(spec, master))
               .appName(spec.spark.app_name or f"dbspec-{spec.name}" if spec is not None
                        else "dbspec")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false"))
    conf = spec.spark.conf if spec is not None else {}
    for key, value in conf.items():
        builder = builder.config(key, str(value))
    java_options = quiet_java_options(conf)
    if java_options is not None:
        builder = builder.config("spark.driver.extraJavaOptions", java_options)
    quiet_pyspark_warnings()
    python = executor_python(spec, master_url(spec, master))
    if python:
        why = "spark.pyspark.python" if python != sys.executable else "the driver's interpreter"
        say(f"  executors run {python} ({why}; set spark.pyspark.python in spark.conf or "
            "PYSPARK_PYTHON to choose another)")
    try:
        # a SparkContext made from Python reads its executors' interpreter from PYSPARK_PYTHON
        # only (spark.pyspark.python is spark-submit's), and only while it starts
        with environment_variable("PYSPARK_PYTHON", python):
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
def environment_variable(name: str, value: Optional[str]) -> Iterator[None]:
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
