"""Read a spec's data source through Spark (the spark executor's data path).

Delta tables are read natively where the session has the ``delta`` format (Databricks, or a
cluster with the Delta connector). Elsewhere — delta-spark has no release for this pyspark, and
its JAR would come from Maven at session start — ``deltalake`` lists the Parquet files of the
requested table version and Spark reads exactly those.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional

from dbspec.data.sources import DataError, SourceData
from dbspec.spec.sections.data import DataSpec


def has_delta_format(spark) -> bool:
    """Whether this session can read ``format("delta")`` itself."""
    extensions = spark.conf.get("spark.sql.extensions", "") or ""
    return "DeltaSparkSessionExtension" in extensions


def read_delta(spark, path: Path, open_table: Callable[[], Any], *, what: str,
               version: Optional[int] = None,
               timestamp: Optional[str] = None) -> tuple[Any, Optional[str]]:
    """A Spark DataFrame over one version of the Delta table at ``path``, and its version label.

    With the session's ``delta`` format Spark reads the table itself, at ``version`` or
    ``timestamp`` (and the label is None: the caller knows the version asked for); elsewhere
    ``open_table()`` (``deltalake``, opened at the wanted version by the caller, which words its
    errors) lists the version's Parquet files and Spark reads exactly those (label ``delta-vN``).
    ``what`` names the table in errors.

    Raises:
        DataError: the version has no data files.
    """
    if has_delta_format(spark):
        reader = spark.read.format("delta")
        if version is not None:
            reader = reader.option("versionAsOf", version)
        elif timestamp is not None:
            reader = reader.option("timestampAsOf", timestamp)
        return reader.load(str(path)), None
    table = open_table()
    files = table.file_uris()
    if not files:
        raise DataError(f"{what} has no data files at version {table.version()}")
    return spark.read.parquet(*files), f"delta-v{table.version()}"


def spark_version(spark, data: DataSpec, *, base: Path) -> str:
    """The data version, as :func:`dbspec.data.sources.resolve_version`, for Spark tables too."""
    from dbspec.seams.sources import source_kind

    return source_kind(data).spark_version(spark, data, base=base)


def read_source_spark(spark, data: DataSpec, *, base: Path) -> SourceData:
    """Every row read through Spark, collected through Arrow
    (:meth:`dbspec.seams.sources.DataSource.read_spark`)."""
    from dbspec.seams.sources import source_kind

    return source_kind(data).read_spark(spark, data, base=base)


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
