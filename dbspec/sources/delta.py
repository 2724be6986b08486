"""``data.source.kind: delta``: a Delta Lake table, at its latest version or an earlier one."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, Optional

from pydantic import AfterValidator

from dbspec.seams.sources import Finding
from dbspec.sources.common import FileSource
from dbspec.spec.sections.base import SpecModel, d


def _as_of(timestamp: str):
    """An ISO-8601 timestamp as an aware datetime; one without a zone is taken as UTC."""
    from datetime import datetime, timezone

    when = datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    return when if when.tzinfo is not None else when.replace(tzinfo=timezone.utc)


def _iso_timestamp(value: str) -> str:
    try:
        _as_of(value)
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


def open_delta(source, base: Path):
    """The Delta table of a ``delta`` source at its version or timestamp."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    from dbspec.data.sources import DataError, resolve_path

    path = resolve_path(source.path, base)
    try:
        table = DeltaTable(str(path), version=source.version)
        if source.timestamp is not None:
            when = _as_of(source.timestamp)
            _check_after_first_commit(table, when, path)
            table.load_as_version(when)
    except DataError:
        raise
    except TableNotFoundError:
        raise DataError(f"data.source.path: {path} is not a Delta table (no _delta_log)") from None
    except Exception as exc:  # delta-rs reports a missing version or bad timestamp this way
        point = f"version {source.version}" if source.version is not None else \
            f"timestamp {source.timestamp}" if source.timestamp else "its latest version"
        raise DataError(f"data.source: cannot open Delta table {path} at {point}: {exc}") \
            from None
    return table


def _check_after_first_commit(table, when, path: Path) -> None:
    """delta-rs reads version 0 for a timestamp before the table existed; Spark refuses it.
    dbspec refuses it too, since those rows were not there at that time."""
    from datetime import datetime, timezone

    from dbspec.data.sources import DataError

    commits = [entry["timestamp"] for entry in table.history() if "timestamp" in entry]
    if not commits:
        return
    first = datetime.fromtimestamp(min(commits) / 1000, tz=timezone.utc)
    if when < first:
        raise DataError(f"data.source.timestamp: {when.isoformat()} is before the first commit "
                        f"of the Delta table {path} (its earliest version is from "
                        f"{first.isoformat(timespec='seconds')})")


def _spark_frame(spark, source, base: Path) -> tuple[Any, Optional[str]]:
    """A Spark DataFrame over the source's table version, and its version label.

    With the session's ``delta`` format Spark reads the table itself (no label: the version
    asked for is the one read). Elsewhere (delta-spark has no release for this pyspark, and its
    JAR would come from Maven at session start) ``deltalake`` lists the version's Parquet files
    and Spark reads exactly those (label ``delta-vN``).

    Raises:
        DataError: the version has no data files.
    """
    from dbspec.data.sources import DataError, resolve_path
    from dbspec.data.spark_sources import has_delta_format

    path = resolve_path(source.path, base)
    if has_delta_format(spark):
        reader = spark.read.format("delta")
        if source.version is not None:
            reader = reader.option("versionAsOf", source.version)
        elif source.timestamp is not None:
            reader = reader.option("timestampAsOf", source.timestamp)
        return reader.load(str(path)), None
    table = open_delta(source, base)
    files = table.file_uris()
    if not files:
        raise DataError(f"data.source: Delta table {path} has no data files at version "
                        f"{table.version()}")
    return spark.read.parquet(*files), f"delta-v{table.version()}"


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
        return f"delta-v{open_delta(data.source, base).version()}"

    def read(self, data, *, base: Path):
        """Every row of the table version, through Arrow."""
        from dbspec.data.sources import SourceData, resolve_path

        table = open_delta(data.source, base)
        frame = table.to_pyarrow_table().to_pandas()
        return SourceData(frame, f"delta-v{table.version()}",
                          str(resolve_path(data.source.path, base)))

    def read_spark(self, spark, data, *, base: Path):
        """The version's rows through Spark, collected through Arrow."""
        from dbspec.data.sources import resolve_path
        from dbspec.data.spark_sources import collect_spark

        def read():
            frame, label = _spark_frame(spark, data.source, base)
            return frame, label or self.version(data, base=base), \
                str(resolve_path(data.source.path, base))

        return collect_spark(spark, read)

    def spark_frame(self, spark, data, path: Path) -> Any:
        """The version's rows as a Spark DataFrame, not collected (batch scoring reads it)."""
        return _spark_frame(spark, data.source.model_copy(update={"path": str(path)}), path)[0]

    def open(self, data, *, base: Path, spark: Any = None):
        """The version's Parquet files as an Arrow dataset (Spark tasks may open them)."""
        import pyarrow.dataset as ds

        from dbspec.data.convert import OpenedSource
        from dbspec.data.sources import DataError, resolve_path

        table = open_delta(data.source, base)
        path = resolve_path(data.source.path, base)
        try:
            dataset = table.to_pyarrow_dataset()
        except Exception as exc:  # delta-rs refuses table features it cannot read
            raise DataError(f"data.source: cannot read Delta table {path}: {exc}") from None
        return OpenedSource(dataset, f"delta-v{table.version()}", str(path),
                            ds.ParquetFileFormat(),
                            spark_files=not table.metadata().partition_columns, root=str(path),
                            pins=str(table.metadata().id))


SOURCE = DeltaKind()
