"""Read a spec's data source through Spark (the spark executor's data path).

Delta tables are read natively where the session has the ``delta`` format (Databricks, or a
cluster with the Delta connector). Elsewhere — delta-spark has no release for this pyspark, and
its JAR would come from Maven at session start — ``deltalake`` lists the Parquet files of the
requested table version and Spark reads exactly those.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Callable, Optional

from dbspec.data.sources import DataError, SourceData, _open_delta, _resolve, read_source
from dbspec.spec.sections.data import DataSpec


def has_delta_format(spark) -> bool:
    """Whether this session can read ``format("delta")`` itself."""
    extensions = spark.conf.get("spark.sql.extensions", "") or ""
    return "DeltaSparkSessionExtension" in extensions


def read_delta(spark, path: Path, open_table: Callable[[], Any], *, what: str,
               version: Optional[int] = None,
               timestamp: Optional[str] = None) -> tuple[Any, Optional[str]]:
    """A Spark DataFrame over one version of the Delta table at ``path``, and its version label.

    With the session's ``delta`` format Spark reads the table itself (and the label is None:
    the caller knows the version asked for); elsewhere ``open_table()`` (``deltalake``, opened
    at the wanted version by the caller, which words its errors) lists the version's Parquet
    files and Spark reads exactly those (label ``delta-vN``).

    Args:
        spark: The session.
        path: The table's directory.
        open_table: Opens the ``deltalake`` table at the version wanted.
        what: How errors name the table (``input x``, ``data.source: Delta table x``).
        version: The version to read natively (``versionAsOf``).
        timestamp: Or the time (``timestampAsOf``).

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
    from dbspec.data.sources import resolve_version

    source = data.source
    if source.kind != "spark_table":
        return resolve_version(data, base=base)
    try:
        files = sorted(spark.table(source.table).inputFiles())
    except Exception as exc:  # AnalysisException and friends
        raise DataError(f"data.source.table: cannot read table '{source.table}': "
                        f"{str(exc).splitlines()[0]}") from None
    digest = hashlib.sha256(json.dumps(files).encode()).hexdigest()[:16]
    return f"spark_table-{source.table}-v{source.version}" if source.version is not None \
        else f"spark_table-{source.table}-{digest}"


def read_source_spark(spark, data: DataSpec, *, base: Path) -> SourceData:
    """Read every row through Spark and collect them (through Arrow) for training.

    Raises:
        DataError: missing path or table, unreadable data, an unsupported time travel.
    """
    source = data.source
    if source.kind in ("sklearn", "synthetic"):
        return read_source(data, base=base)  # generated in the driver; nothing to distribute
    spark.conf.set("spark.sql.execution.arrow.pyspark.enabled", "true")
    try:
        frame, version, uri = _read(spark, data, base)
    except DataError:
        raise
    except Exception as exc:  # Spark reports bad input as AnalysisException, Py4JJavaError...
        raise DataError(f"data.source: Spark cannot read it: {str(exc).splitlines()[0]}") \
            from None
    return SourceData(frame.toPandas(), version, uri)


def _read(spark, data: DataSpec, base: Path) -> tuple[Any, str, str]:
    from dbspec.data.sources import check_csv_header, resolve_version

    source = data.source
    if source.kind == "csv":
        path = _resolve(source.path, base)
        if path.is_file():  # Spark, too, renames a repeated column (a0, a3) without a word
            check_csv_header(path, source.delimiter)
        frame = (spark.read.option("header", True).option("inferSchema", True)
                 .option("sep", source.delimiter).csv(str(path)))
        return frame, resolve_version(data, base=base), str(path)
    if source.kind == "parquet":
        path = _resolve(source.path, base)
        return spark.read.parquet(str(path)), resolve_version(data, base=base), str(path)
    if source.kind == "delta":
        path = _resolve(source.path, base)
        frame, label = read_delta(spark, path, lambda: _open_delta(source, base),
                                  what=f"data.source: Delta table {path}",
                                  version=source.version, timestamp=source.timestamp)
        return frame, label or resolve_version(data, base=base), str(path)
    frame = spark.table(source.table)
    if source.version is not None:
        if not has_delta_format(spark):
            raise DataError("data.source.version: time travel on a Spark table needs the "
                            "session's delta format (Databricks or the Delta connector)")
        frame = spark.sql(f"SELECT * FROM {source.table} VERSION AS OF {source.version}")
    return frame, spark_version(spark, data, base=base), f"spark_table:{source.table}"
