"""``data.source.kind: parquet``: a Parquet file or a directory of Parquet files."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from dbspec.sources.common import FileSource
from dbspec.spec.sections.base import SpecModel, d


class ParquetSource(SpecModel):
    """A Parquet file or a directory of Parquet files."""

    kind: Literal["parquet"] = d("Source kind: Parquet.")
    path: str = d("Path or URI of a Parquet file or directory.", min_length=1)


class ParquetKind(FileSource):
    """pyarrow reads it here, Spark on the Spark executor."""

    name = "parquet"
    model = ParquetSource

    def read(self, data, *, base: Path):
        """Every row through pyarrow."""
        import pyarrow.parquet as pq

        from dbspec.data.sources import DataError, SourceData, resolve_path

        path = resolve_path(data.source.path, base)
        try:
            frame = pq.read_table(path).to_pandas()
        except Exception as exc:  # pyarrow raises several types for bad files
            raise DataError(f"data.source.path: cannot read {path} as Parquet: {exc}") from None
        return SourceData(frame, self.version(data, base=base), str(path))

    def spark_frame(self, spark, data, path: Path) -> Any:
        """Spark's Parquet reader."""
        return spark.read.parquet(str(path))

    def file_format(self, data, path: Path) -> Any:
        """Arrow's Parquet format."""
        import pyarrow.dataset as ds

        return ds.ParquetFileFormat()


SOURCE = ParquetKind()
