"""Read a spec's data source through Spark (the spark executor's data path)."""

from __future__ import annotations

from typing import Any, Callable

from dbspec.data.sources import DataError, SourceData


def has_delta_format(spark) -> bool:
    """Whether this session can read ``format("delta")`` itself."""
    extensions = spark.conf.get("spark.sql.extensions", "") or ""
    return "DeltaSparkSessionExtension" in extensions


def collect_spark(spark, read: Callable[[], tuple[Any, str, str]]) -> SourceData:
    """Collect what ``read`` returns (a Spark frame, its version, its URI) through Arrow; what
    Spark reports about bad input becomes a :class:`DataError`."""
    spark.conf.set("spark.sql.execution.arrow.pyspark.enabled", "true")
    try:
        frame, version, uri = read()
    except DataError:
        raise
    except Exception as exc:  # Spark reports bad input as AnalysisException, Py4JJavaError...
        raise DataError(f"data.source: Spark cannot read it: {str(exc).splitlines()[0]}") \
            from None
    return SourceData(frame.toPandas(), version, uri)
