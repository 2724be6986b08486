"""The Spark session dbspec starts and stops, in one place."""

from __future__ import annotations

import contextlib
import os
from typing import Iterator, Optional

from dbspec.errors import DbspecError


def master_url(spec, override: Optional[str] = None) -> str:
    """``--master`` > ``spark.master`` in the spec > ``SPARK_MASTER`` > ``local[*]``."""
    return override or (spec.spark.master if spec is not None else None) or os.environ.get("SPARK_MASTER") or "local[*]"


@contextlib.contextmanager
def spark_session(spec, master: Optional[str] = None) -> Iterator[object]:
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
    try:
        session = builder.getOrCreate()
    except Exception as exc:  # a bad master URL, no Java: PySparkRuntimeError and friends
        raise DbspecError(f"cannot start Spark on {master_url(spec, master)}: "
                          f"{str(exc).strip().splitlines()[0][:300]}") from None
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()
