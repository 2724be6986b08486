"""``data.source.kind: spark_table``: a table of the Spark catalog (Unity Catalog
``catalog.schema.table`` on Databricks), read through a Spark session only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal, Optional

from dbspec.sources.common import _Source
from dbspec.spec.sections.base import SpecModel, d


class SparkTableSource(SpecModel):
    """A table of the Spark catalog (Unity Catalog ``catalog.schema.table`` on Databricks)."""

    kind: Literal["spark_table"] = d("Source kind: a Spark catalog table.")
    table: str = d("Table name, e.g. main.ml.features.", pattern=r"^[A-Za-z0-9_`][\w`\-]*(\.[\w`\-]+){0,2}$")
    version: Optional[int] = d("Delta version of the table to read.", default=None, ge=0)


def _spark_only():
    from dbspec.data.sources import DataError

    return DataError("data.source.kind 'spark_table' is read through a Spark session: run with "
                     "--executor spark (or executor: spark in the spec)")


class SparkTableKind(_Source):
    """Read by Spark on the Spark executor; streamed from the table's mounted data files."""

    name = "spark_table"
    model = SparkTableSource
    spark_only = True

    def version(self, data, *, base: Path) -> str:
        """Only a Spark session can tell."""
        raise _spark_only()

    def read(self, data, *, base: Path):
        """Only a Spark session can read it."""
        raise _spark_only()

    def spark_version(self, spark, data, *, base: Path) -> str:
        """The asked version, else a digest of the table's current data files."""
        from dbspec.data.sources import digest

        source = data.source
        files = json.dumps(sorted(_input_files(spark, source)))
        return f"spark_table-{source.table}-v{source.version}" if source.version is not None \
            else f"spark_table-{source.table}-{digest(files.encode())}"

    def read_spark(self, spark, data, *, base: Path):
        """The table (at ``version`` through Delta's time travel), collected through Arrow."""
        from dbspec.data.sources import DataError
        from dbspec.data.spark_sources import collect_spark, has_delta_format

        source = data.source

        def read() -> tuple[Any, str, str]:
            frame = spark.table(source.table)
            if source.version is not None:
                if not has_delta_format(spark):
                    raise DataError("data.source.version: time travel on a Spark table needs "
                                    "the session's delta format (Databricks or the Delta "
                                    "connector)")
                frame = spark.sql(f"SELECT * FROM {source.table} VERSION AS OF {source.version}")
            return frame, self.spark_version(spark, data, base=base), \
                f"spark_table:{source.table}"

        return collect_spark(spark, read)

    def open(self, data, *, base: Path, spark: Any = None):
        """The table's current data files, where this process can open them.

        Raises:
            DataError: no session; a version is asked for (its files are not what
                ``inputFiles`` lists); the files lie in object storage, not on a mounted path.
        """
        import pyarrow.dataset as ds

        from dbspec.data.convert import OpenedSource
        from dbspec.data.sources import DataError

        if spark is None:
            raise _spark_only()
        version, source = self.spark_version(spark, data, base=base), data.source
        if source.version is not None:
            raise DataError("data.source.version: a Spark table streams at its current version; "
                            "to stream an earlier one, give the Delta table's path instead "
                            "(kind: delta, path: ..., version: N)")
        files = _input_files(spark, source)
        if not files:
            raise DataError(f"data.source.table: '{source.table}' has no data files to stream")
        local = [_mounted(uri) for uri in files]
        if None in local:
            raise DataError(f"data.source.table: '{source.table}' keeps its files in object "
                            f"storage ({files[0].split('://')[0]}://...), which streaming reads "
                            "through a mounted path: give the table's path as kind: delta (a "
                            "/Volumes or /dbfs path) instead")
        return OpenedSource(ds.dataset(local, format="parquet"), version,
                            f"spark_table:{source.table}", ds.ParquetFileFormat())


def _input_files(spark, source) -> list[str]:
    """The table's current data files; a located error when Spark cannot read the table."""
    from dbspec.data.sources import DataError

    try:
        return spark.table(source.table).inputFiles()
    except Exception as exc:  # AnalysisException and friends
        raise DataError(f"data.source.table: cannot read table '{source.table}': "
                        f"{str(exc).splitlines()[0]}") from None


def _mounted(uri: str) -> Optional[str]:
    """A data file's path on this machine: ``file:`` as is, ``dbfs:`` through the /dbfs
    mount; None for object storage (s3, abfss, gs...)."""
    if uri.startswith("file:"):
        return uri[len("file:"):].replace("///", "/", 1) if uri.startswith("file:///") \
            else uri[len("file:"):]
    if uri.startswith("dbfs:/"):
        return "/dbfs/" + uri[len("dbfs:/"):].lstrip("/")
    return uri if uri.startswith("/") else None


SOURCE = SparkTableKind()
