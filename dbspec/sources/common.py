"""What several data sources share: bases for sources generated in memory
(:class:`GeneratedSource`) and sources read from files (:class:`FileSource`). A kind overrides
only what differs; nothing here names a kind."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Iterable, Optional

from dbspec.seams.sources import Finding


class _Source:
    """Defaults every source shares: no checks beyond the section's types, nothing known
    before reading, the same version with a Spark session or without."""

    name: ClassVar[str]
    model: ClassVar[type]
    #: Read only through a Spark session (the executor ``spark``; in jobs, the task's Spark).
    spark_only: ClassVar[bool] = False

    def check(self, spec) -> Iterable[Finding]:
        return ()

    def known_width(self, source) -> Optional[int]:
        return None

    def known_classes(self, source) -> Optional[int]:
        return None

    def spark_version(self, spark, data, *, base: Path) -> str:
        return self.version(data, base=base)

    def version(self, data, *, base: Path) -> str:
        raise NotImplementedError


class GeneratedSource(_Source):
    """Rows made in memory on the driver (small by construction): Spark and shard conversion
    read what :meth:`read` makes."""

    uri: ClassVar[str]

    def frame(self, data) -> Any:
        """The generated rows (a pandas frame)."""
        raise NotImplementedError

    def read(self, data, *, base: Path):
        from dbspec.data.sources import SourceData

        return SourceData(self.frame(data), self.version(data, base=base), self.uri_of(data))

    def uri_of(self, data) -> str:
        """Where the rows came from, for the run's dataset record."""
        return self.uri

    def read_spark(self, spark, data, *, base: Path):
        return self.read(data, base=base)  # generated on the driver: nothing to distribute

    def open(self, data, *, base: Path, spark: Any = None):
        """An in-memory Arrow dataset over the generated rows."""
        import pyarrow as pa
        import pyarrow.dataset as ds

        from dbspec.data.convert import OpenedSource

        read = self.read(data, base=base)
        table = pa.Table.from_pandas(read.frame, preserve_index=False)
        return OpenedSource(ds.dataset(table), read.version, read.uri, spark_files=False)


class FileSource(_Source):
    """A file or a directory of files at ``source.path``."""

    def version(self, data, *, base: Path) -> str:
        """``<kind>-<digest of the file, or of the directory's names, sizes and times>``."""
        from dbspec.data.sources import path_digest, resolve_path

        return f"{self.name}-{path_digest(resolve_path(data.source.path, base))}"

    def spark_frame(self, spark, data, path: Path) -> Any:
        """The Spark DataFrame of the files at ``path``."""
        raise NotImplementedError

    def read_spark(self, spark, data, *, base: Path):
        from dbspec.data.sources import resolve_path
        from dbspec.data.spark_sources import collect_spark

        def read():
            path = resolve_path(data.source.path, base)
            return self.spark_frame(spark, data, path), self.version(data, base=base), str(path)

        return collect_spark(spark, read)

    def file_format(self, data, path: Path) -> Any:
        """The Arrow dataset format of the files."""
        raise NotImplementedError

    def open(self, data, *, base: Path, spark: Any = None):
        """An Arrow dataset over the files (hive-partitioned directories included)."""
        import pyarrow as pa
        import pyarrow.dataset as ds

        from dbspec.data.convert import OpenedSource
        from dbspec.data.sources import DataError, resolve_path

        path = resolve_path(data.source.path, base)
        file_format = self.file_format(data, path)
        try:
            dataset = ds.dataset(str(path), format=file_format, partitioning="hive")
        except (pa.ArrowInvalid, OSError) as exc:
            raise DataError(f"data.source.path: cannot read {path} as {self.name}: {exc}") \
                from None
        # a column from the directory names (bucket=1/...) is not in the files themselves:
        # such a directory converts here, not file by file in Spark tasks
        partitioned = any(str(fragment.partition_expression) != "true"
                          for fragment in dataset.get_fragments())
        return OpenedSource(dataset, self.version(data, base=base), str(path), file_format,
                            spark_files=not partitioned)
