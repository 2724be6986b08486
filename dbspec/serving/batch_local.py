"""The local batch engine: Arrow record batches stream from the input through the model into
the writer, in this process, so inputs larger than memory work.

A Delta output is one transaction at the end; a Parquet output a hidden temporary file renamed
into place. Either way a failed or killed job leaves the old output as it was.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import numpy as np
import pyarrow as pa

from dbspec.atomic import atomic_file, remove_partial_files
from dbspec.data.sources import DataError
from dbspec.serving.app import LoadedModel
from dbspec.serving.batch import (BATCH_ROWS, OUT_OF_RANGE_COLUMN, BatchResult, RangeCheck,
                                  batch_matrix, check_model_columns, check_new_columns,
                                  check_paths, model_columns, score_matrix, unscorable_rows)
from dbspec.serving.batch_input import open_input

_PART = "part-dbspec-"  # the only Parquet files a rerun replaces


def predict_local(loaded: LoadedModel, source: str, output: str, *, fmt: str = "delta",
                  input_version: Optional[int] = None, batch_rows: int = BATCH_ROWS,
                  progress: Callable[[int, float], None] = lambda rows, seconds: None,
                  out_of_range: tuple[str, float] = ("warn", 0.5)) -> BatchResult:
    """Stream ``source`` through the model into ``output``; ``out_of_range``: (action,
    tolerance), see :class:`RangeCheck`.

    Raises:
        DataError: bad input, rows the model cannot score, or (``reject``) rows out of range.
    """
    started = time.perf_counter()
    check_paths(source, output)
    dataset, version = open_input(source, input_version)
    scoring = Scoring(loaded, RangeCheck(loaded.model.card, *out_of_range), source,
                       lambda rows: progress(rows, time.perf_counter() - started))
    schema = scoring.output_schema(dataset.schema)
    reader = pa.RecordBatchReader.from_batches(
        schema, scoring.batches(dataset.to_batches(batch_size=batch_rows), schema))
    try:
        output_version = _write(reader, output, fmt)
    except Exception:
        if scoring.failure:  # the writer wraps our error in its own; nothing was committed
            raise scoring.failure[0] from None
        raise
    return BatchResult(scoring.done, output, fmt, version, output_version,
                       time.perf_counter() - started, loaded.name, loaded.version,
                       scoring.flagged)


class Scoring:
    """The input's batches with their predictions, and what scoring them found."""

    def __init__(self, loaded: LoadedModel, check: RangeCheck, source: str,
                 progress: Callable[[int], None], first_row: int = 0):
        self.loaded, self.check, self.source, self.progress = loaded, check, source, progress
        self.names = model_columns(loaded.model.card)
        self.done = self.flagged = 0
        self.first_row = first_row  # the input's row of the first batch (a Spark task's slice)
        self.failure: list[DataError] = []  # what stopped the stream, as the user's error

    def output_schema(self, schema: Any) -> Any:
        """The input's columns, then the predictions', ``out_of_range``, model name and version.

        Raises:
            DataError: the input lacks a feature column or already has an added one.
        """
        import pyarrow.types as pat

        card = self.loaded.model.card
        types = {field.name: field.type for field in schema}
        check_model_columns(types, card, self.source,
                            lambda t: pat.is_integer(t) or pat.is_floating(t) or pat.is_decimal(t))
        empty = score_matrix(self.loaded.model,
                             np.zeros((0, len(card.feature_names)), dtype=np.float32))
        adds = [OUT_OF_RANGE_COLUMN] if self.check.adds_column else []
        check_new_columns(list(types), list(empty) + adds, self.source)
        for name, values in empty.items():
            schema = schema.append(pa.field(name, pa.array(values).type))
        if adds:
            schema = schema.append(pa.field(OUT_OF_RANGE_COLUMN, pa.string()))
        schema = schema.append(pa.field("model_name", pa.string()))
        return schema.append(pa.field("model_version", pa.string()))

    def batches(self, batches: Iterator[Any], schema: Any) -> Iterator[Any]:
        """Each non-empty input batch with the columns :meth:`output_schema` adds."""
        for batch in batches:
            if batch.num_rows == 0:
                continue
            try:
                arrays = self._score(batch)
            except DataError as refused:
                self.failure.append(refused)
                raise
            self.done += batch.num_rows
            self.progress(self.done)
            yield pa.RecordBatch.from_arrays(arrays, schema=schema)

    def _score(self, batch: Any) -> list[Any]:
        card, loaded = self.loaded.model.card, self.loaded
        x = batch_matrix(card, [batch.column(name) for name in self.names],
                         self.source, self.first_row + self.done)
        ranged, count = self.check.column(x, self.source, self.first_row + self.done)
        columns = score_matrix(loaded.model, x)
        problem = unscorable_rows(x, columns, card.feature_names)
        if problem:
            raise DataError(f"input {self.source}: {problem}")
        self.flagged += count
        return batch.columns + [pa.array(v) for v in columns.values()] + (
            [ranged] if ranged is not None else []) + [
            pa.array([loaded.name] * batch.num_rows, pa.string()),
            pa.array([loaded.version] * batch.num_rows, pa.string())]


def _write(reader, output: str, fmt: str) -> Optional[int]:
    """Write a stream of batches; the Delta table version written, for Delta."""
    target = Path(output).expanduser()
    if target.exists() and not target.is_dir():
        raise DataError(f"output {output} exists and is not a directory")
    if fmt == "delta":
        from deltalake import DeltaTable, write_deltalake

        try:
            write_deltalake(str(target), reader, mode="overwrite", schema_mode="overwrite")
            return DeltaTable(str(target)).version()
        except DataError:
            raise
        except Exception as exc:  # DeltaError, TableNotFoundError, OSError, ArrowInvalid...
            raise DataError(f"cannot write Delta table {output}: "
                            f"{str(exc).splitlines()[0][:300]}") from exc
    import pyarrow.parquet as pq

    final = target / _OUTPUT
    others = [p.name for p in target.iterdir() if p.suffix == ".parquet" and p != final] \
        if target.is_dir() else []
    if others:
        raise DataError(f"output {output} holds Parquet files dbspec did not write "
                        f"({', '.join(others[:3])}); give an empty or new directory")
    try:
        target.mkdir(parents=True, exist_ok=True)
        remove_partial_files(final)  # what killed writes left
        # a hidden temporary name beside it: the old predictions or the new ones, never half
        with atomic_file(final, durable=False) as sink, \
                pq.ParquetWriter(sink, reader.schema) as writer:
            for batch in reader:
                writer.write_batch(batch)
    except OSError as exc:
        raise DataError(f"cannot write {output}: {exc.strerror or exc}") from None
    return None


_OUTPUT = f"{_PART}predictions.parquet"  # one name: a rerun replaces the file in one rename
