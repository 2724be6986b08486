"""``data.source.kind: csv``: a CSV file (or a directory of them) with a header row."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from dbspec.sources.common import FileSource
from dbspec.spec.sections.base import SpecModel, d


class CsvSource(SpecModel):
    """A CSV file with a header row."""

    kind: Literal["csv"] = d("Source kind: a CSV file.")
    path: str = d("Path or URI of the CSV file.", min_length=1)
    delimiter: str = d("Field delimiter.", default=",", min_length=1, max_length=1)


class CsvKind(FileSource):
    """pandas reads it here, Spark on the Spark executor, Arrow when streamed."""

    name = "csv"
    model = CsvSource

    def read(self, data, *, base: Path):
        """Every row through pandas; a repeated column name is refused."""
        import pandas as pd

        from dbspec.data.sources import DataError, SourceData, check_csv_header, resolve_path

        path = resolve_path(data.source.path, base)
        try:
            frame = pd.read_csv(path, sep=data.source.delimiter)
        except (ValueError, UnicodeDecodeError) as exc:
            raise DataError(f"data.source.path: cannot read {path} as CSV: {exc}") from None
        check_csv_header(path, data.source.delimiter)
        return SourceData(frame, self.version(data, base=base), str(path))

    def spark_frame(self, spark, data, path: Path) -> Any:
        """Spark's CSV reader with the header and inferred types."""
        from dbspec.data.sources import check_csv_header

        if path.is_file():  # Spark, too, renames a repeated column (a0, a3) without a word
            check_csv_header(path, data.source.delimiter)
        return (spark.read.option("header", True).option("inferSchema", True)
                .option("sep", data.source.delimiter).csv(str(path)))

    def file_format(self, data, path: Path) -> Any:
        """Arrow's CSV format, feature columns as float64; every file's header checked."""
        from dbspec.data.convert import csv_format
        from dbspec.data.sources import check_csv_header

        for file in ([path] if path.is_file() else sorted(path.rglob("*.csv"))):
            check_csv_header(file, data.source.delimiter)
        return csv_format(data, path)


SOURCE = CsvKind()
