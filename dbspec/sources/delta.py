"""``data.source.kind: delta``: a Delta Lake table, at its latest version or an earlier one."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, Optional

from pydantic import AfterValidator

from dbspec.seams.sources import Finding
from dbspec.sources.common import FileSource
from dbspec.spec.sections.base import SpecModel, d


def _iso_timestamp(value: str) -> str:
    from datetime import datetime

    try:
        datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{value!r} is not an ISO-8601 timestamp, e.g. 2024-05-01T12:00:00Z") \
            from None
    return value


class DeltaSource(SpecModel):
    """A Delta Lake table, optionally at an earlier version (time travel)."""

    kind: Literal["delta"] = d("Source kind: a Delta Lake table.")
    path: str = d("Path or URI of the Delta table.", min_length=1)
    version: Optional[int] = d("Table version to read; the latest when neither version nor "
                               "timestamp is set. The resolved version is recorded in the run.",
                               default=None, ge=0)
    timestamp: Optional[Annotated[str, AfterValidator(_iso_timestamp)]] = d("Read the table as of this ISO-8601 timestamp "
                                 "(e.g. 2024-05-01T12:00:00Z). Exclusive with version.",
                                 default=None, min_length=1)


class DeltaKind(FileSource):
    """delta-rs (``deltalake``) reads it here; Spark reads the version's Parquet files."""

    name = "delta"
    model = DeltaSource

    def check(self, spec):
        """A version and a timestamp at once."""
        source = spec.data.source
        if source.version is not None and source.timestamp is not None:
            yield Finding(("data", "source", "timestamp"), "give version or timestamp, not both")

    def version(self, data, *, base: Path) -> str:
        """``delta-v<N>``: the table version read (resolved from a timestamp too)."""
        from dbspec.data.sources import open_delta

        return f"delta-v{open_delta(data.source, base).version()}"

    def read(self, data, *, base: Path):
        """Every row of the table version, through Arrow."""
        from dbspec.data.sources import SourceData, open_delta, resolve_path

        table = open_delta(data.source, base)
        frame = table.to_pyarrow_table().to_pandas()
        return SourceData(frame, f"delta-v{table.version()}",
                          str(resolve_path(data.source.path, base)))

    def read_spark(self, spark, data, *, base: Path):
        """The version's data files through Spark (Delta's format where the session has it)."""
        from dbspec.data.sources import open_delta, resolve_path
        from dbspec.data.spark_sources import collect_spark, read_delta

        source = data.source

        def read():
            path = resolve_path(source.path, base)
            frame, label = read_delta(spark, path, lambda: open_delta(source, base),
                                      what=f"data.source: Delta table {path}",
                                      version=source.version, timestamp=source.timestamp)
            return frame, label or self.version(data, base=base), str(path)

        return collect_spark(spark, read)

    def spark_frame(self, spark, data, path: Path) -> Any:
        """The version's rows as a Spark DataFrame, not collected (batch scoring reads it)."""
        from dbspec.data.sources import open_delta
        from dbspec.data.spark_sources import read_delta

        source = data.source.model_copy(update={"path": str(path)})
        frame, _ = read_delta(spark, path, lambda: open_delta(source, path),
                              what=f"data.source: Delta table {path}",
                              version=source.version, timestamp=source.timestamp)
        return frame

    def open(self, data, *, base: Path, spark: Any = None):
        """The version's Parquet files as an Arrow dataset (Spark tasks may open them)."""
        import pyarrow.dataset as ds

        from dbspec.data.convert import OpenedSource
        from dbspec.data.sources import DataError, open_delta, resolve_path

        table = open_delta(data.source, base)
        path = resolve_path(data.source.path, base)
        partitioned = bool(table.metadata().partition_columns)
        try:
            dataset = table.to_pyarrow_dataset()
        except Exception as exc:  # delta-rs refuses table features it cannot read
            raise DataError(f"data.source: cannot read Delta table {path}: {exc}") from None
        return OpenedSource(dataset, f"delta-v{table.version()}", str(path),
                            ds.ParquetFileFormat(), spark_files=not partitioned, root=str(path),
                            pins=str(table.metadata().id))


SOURCE = DeltaKind()
