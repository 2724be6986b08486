"""``data.source.kind: csv``: a CSV file (or a directory of them) with a header row."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any, Iterable, Literal

from dbspec.seams.sources import Finding
from dbspec.sources.common import FileSource
from dbspec.spec.sections.base import SpecModel, d


class CsvSource(SpecModel):
    """A CSV file with a header row."""

    kind: Literal["csv"] = d("Source kind: a CSV file.")
    path: str = d("Path or URI of the CSV file.", min_length=1)
    delimiter: str = d("Field delimiter.", default=",", min_length=1, max_length=1)


def csv_header(path: Path, delimiter: str) -> list[str]:
    """The header row of a CSV file.

    Raises:
        DataError: a repeated column name: pandas and Spark rename one (``a.1``, ``a3``)
            without a word, and a feature list would then silently pick one of them.
    """
    import csv

    from dbspec.data.sources import DataError

    with open(path, newline="", encoding="utf-8", errors="replace") as handle:
        header = next(csv.reader(handle, delimiter=delimiter), [])
    repeated = sorted(name for name, count in Counter(header).items() if count > 1)  # linear
    if repeated:
        raise DataError(f"data.source.path: {path}:1: repeated column name(s) "
                        f"{', '.join(repr(name) for name in repeated)}: give every column its "
                        "own name")
    return header


class CsvKind(FileSource):
    """pandas reads it here, Spark on the Spark executor, Arrow when streamed."""

    name = "csv"
    model = CsvSource

    def check(self, spec) -> Iterable[Finding]:
        """The columns the spec names against a local file's header: its first line, read
        with the csv module (a directory, a URI or a file not here yet is left to the run)."""
        from dbspec.data.sources import DataError
        from dbspec.errors import did_you_mean

        data, path = spec.data, Path(spec.data.source.path).expanduser()
        try:
            header = csv_header(path, data.source.delimiter) if path.is_file() else []
        except DataError as exc:
            return [Finding(("data", "source", "path"), str(exc).split(": ", 1)[1], False)]
        except OSError:
            header = []
        if not header:  # an empty file fails the run's read with its own message
            return ()
        columns, shown = set(header), ", ".join(header[:12]) + (
            f" ... ({len(header):,} columns)" if len(header) > 12 else "")
        key = data.streaming.key if data.streaming is not None else None
        named = [(("data", "target"), data.target), (("data", "streaming", "key"), key)] + [
            (("data", "features", i), name) for i, name in enumerate(data.feature_names or ())]
        return [Finding(where, f"no column '{name}' in {path}{did_you_mean(name, header)}; its "
                        f"header has: {shown}", False) for where, name in named
                if name is not None and name not in columns]

    def read(self, data, *, base: Path):
        """Every row through pandas."""
        import pandas as pd

        from dbspec.data.sources import DataError, SourceData, resolve_path

        path = resolve_path(data.source.path, base)
        try:
            frame = pd.read_csv(path, sep=data.source.delimiter)
        except (ValueError, UnicodeDecodeError) as exc:
            raise DataError(f"data.source.path: cannot read {path} as CSV: {exc}") from None
        csv_header(path, data.source.delimiter)
        return SourceData(frame, self.version(data, base=base), str(path))

    def spark_frame(self, spark, data, path: Path) -> Any:
        """Spark's CSV reader with the header and inferred types."""
        if path.is_file():
            csv_header(path, data.source.delimiter)
        return (spark.read.option("header", True).option("inferSchema", True)
                .option("sep", data.source.delimiter).csv(str(path)))

    def file_format(self, data, path: Path) -> Any:
        """Arrow's CSV format, every file's header checked. Feature (and a regression
        target's) columns are read as float64: Arrow infers a type from the first block, and
        a column of integers that later holds 0.5 would fail."""
        import pyarrow as pa
        import pyarrow.csv as pacsv
        import pyarrow.dataset as ds

        files = [path] if path.is_file() else sorted(path.rglob("*.csv"))
        headers = [csv_header(file, data.source.delimiter) for file in files]
        header = headers[0] if headers else []
        key = data.streaming.key if data.streaming is not None else None
        numeric = list(data.feature_names or [c for c in header if c not in (data.target, key)])
        present = set(header)
        if data.task == "regression":
            numeric.append(data.target)
        return ds.CsvFileFormat(
            parse_options=pacsv.ParseOptions(delimiter=data.source.delimiter),
            convert_options=pacsv.ConvertOptions(
                column_types={name: pa.float64() for name in numeric if name in present}))


SOURCE = CsvKind()
