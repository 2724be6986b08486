"""Spark batch scoring of plain Parquet files with no row through the JVM: Spark runs one task per
slice of the input's row groups, and each task reads its slice with pyarrow, scores it and
writes its own Parquet part into the staging directory, as the local engine does in one process.

Through Spark's reader, an Arrow UDF and Spark's writer, the JVM turned every row into Arrow
and back and held it until its prediction returned: 2.0x the CPU of a plain Spark copy (1M rows
x 10 features, ``local[2]``; see ``benchmarks/batch_vs_spark_udf.py``). Inputs Spark must read
itself (a table, Delta, CSV, partitioned directories, a column type Spark's round trip
changes) keep that path.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any, Iterator, NamedTuple, Optional

import pyarrow as pa
import pyarrow.types as pat

from dbspec.serving.app import LoadedModel
from dbspec.serving.batch import RangeCheck


AS_IS = "[dbspec: error] "  # marks the user's message (a reject's) inside Spark's error
_WORKER_MODELS: dict[str, Any] = {}


def worker_model(payload: tuple[str, dict, bytes]):
    """The payload's model, rebuilt once per Python worker process."""
    key, card, weights = payload
    model = _WORKER_MODELS.get(key)
    if model is None:
        import torch

        from dbspec.models.served import ModelCard, ServedModel

        torch.set_num_threads(1)  # one Spark task per core already
        model = ServedModel(ModelCard(**card))
        model.load_state_dict(torch.load(io.BytesIO(weights), weights_only=True))
        model.eval()
        _WORKER_MODELS.clear()
        _WORKER_MODELS[key] = model
    return model


class Slice(NamedTuple):
    """One task's rows: ``(file, row groups)`` pieces, and the input's row they start at."""

    first_row: int
    pieces: list[tuple[str, list[int]]]


def _same_in_spark(kind: pa.DataType) -> bool:
    """A column type Spark reads from Parquet and writes back as it was."""
    return (pat.is_signed_integer(kind) or pat.is_floating(kind) or pat.is_boolean(kind)
            or pat.is_string(kind) or pat.is_binary(kind) or pat.is_date32(kind))


def parquet_slices(source: str, tasks: int) -> Optional[list[Slice]]:
    """The input's row groups in up to ``tasks`` slices of about equal rows; None where Spark's
    reader must read the input (see the module) or cannot (it words the error)."""
    import pyarrow.parquet as pq

    from dbspec.serving.batch_input import input_kind

    path = Path(source).expanduser()
    files = [path] if path.is_file() else sorted(
        p for p in path.iterdir() if not p.name.startswith((".", "_"))) if path.is_dir() else []
    if not files or not all(p.is_file() for p in files) or input_kind(path) != "parquet":
        return None
    try:
        opened = [pq.ParquetFile(p) for p in files]
    except Exception:  # ArrowInvalid, OSError: not Parquet
        return None
    schema = opened[0].schema_arrow
    if any(not f.schema_arrow.equals(schema) for f in opened) or \
            not all(_same_in_spark(field.type) for field in schema):
        return None
    groups = [(str(p), i, f.metadata.row_group(i).num_rows)
              for p, f in zip(files, opened) for i in range(f.metadata.num_row_groups)]
    share = max(1, -(-sum(rows for _, _, rows in groups) // max(tasks, 1)))
    slices: list[Slice] = []
    row = 0
    for file, index, rows in groups:
        if not slices or row - slices[-1].first_row >= share:
            slices.append(Slice(row, []))
        pieces = slices[-1].pieces
        if pieces and pieces[-1][0] == file:
            pieces[-1][1].append(index)
        else:
            pieces.append((file, [index]))
        row += rows
    return slices


def score_slices(spark, slices: list[Slice], staging: Path, job: dict[str, Any]) -> tuple[int, int]:
    """Score each slice into its own part of ``staging`` in a Spark task; (rows, flagged).
    ``job``: ``payload`` (the broadcast model), ``name``, ``version``, ``source``,
    ``out_of_range``, ``schema`` (the output's), ``dictionary`` (its columns to encode so),
    ``batch_rows``.

    Raises:
        Exception: Spark's, holding the user's message after ``batch_spark``'s marker.
    """
    staging.mkdir(parents=True)
    tasks = spark.sparkContext.parallelize(list(enumerate(slices)), len(slices))
    counts = tasks.mapPartitions(lambda part: _score_part(part, staging, job)).collect()
    return sum(rows for rows, _ in counts), sum(flagged for _, flagged in counts)


def _score_part(part: Iterator[tuple[int, Slice]], staging: Path,
                job: dict[str, Any]) -> Iterator[tuple[int, int]]:
    """In a Python worker: each slice read, scored and written as ``part-NNNNN-dbspec.parquet``."""
    import pyarrow.parquet as pq

    from dbspec.data.sources import DataError
    from dbspec.serving.batch_local import Scoring

    model = worker_model(job["payload"].value)
    loaded = LoadedModel(model, job["name"], job["version"], "")
    schema = job["schema"]
    for index, (first_row, pieces) in part:
        scoring = Scoring(loaded, RangeCheck(model.card, *job["out_of_range"]), job["source"],
                          lambda rows: None, first_row=first_row)
        files = [(pq.ParquetFile(file), groups) for file, groups in pieces]
        inputs = (batch for file, groups in files
                  for batch in file.iter_batches(job["batch_rows"], row_groups=groups))
        try:
            scored = scoring.output_schema(files[0][0].schema_arrow)
            with pq.ParquetWriter(staging / f"part-{index:05d}-dbspec.parquet", schema,
                                  use_dictionary=job["dictionary"]) as out:
                for batch in scoring.batches(inputs, scored):
                    out.write_batch(batch.cast(schema))
        except DataError as refused:  # the user's error, whole, through Spark's
            raise ValueError(AS_IS + str(refused)) from None
        yield scoring.done, scoring.flagged


def dictionary_columns(schema: pa.Schema) -> list[str]:
    """The columns worth a Parquet dictionary: text (the model's name and version, repeated on
    every row). pyarrow tries one on every column by default, and gives it up on numbers only
    after the cost: 5x the write time of 500,000 rows of 10 features."""
    return [field.name for field in schema if pat.is_string(field.type)]


def output_schema(spark_schema) -> pa.Schema:
    """The Arrow schema Spark writes for ``spark_schema`` (of the types above, the scores')."""
    from pyspark.sql import types as T

    kinds = {T.LongType: pa.int64(), T.IntegerType: pa.int32(), T.ShortType: pa.int16(),
             T.ByteType: pa.int8(), T.DoubleType: pa.float64(), T.FloatType: pa.float32(),
             T.BooleanType: pa.bool_(), T.StringType: pa.string(), T.BinaryType: pa.binary(),
             T.DateType: pa.date32()}
    return pa.schema([pa.field(f.name, kinds[type(f.dataType)], nullable=f.nullable)
                      for f in spark_schema.fields])
