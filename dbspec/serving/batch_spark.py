"""The Spark batch engine.

An iterator Arrow UDF scores Arrow batches of the feature columns with the model (broadcast
once, rebuilt once per Python worker); only features go to Python and only predictions come
back, in batches of up to 65,536 rows (:func:`arrow_batch_rows`; Spark's 4,096 made the
workers' per-batch work most of their time). A local Parquet output is written beside the old
one and swapped in (:mod:`dbspec.atomic`); a remote one is written in place by Spark, with the
store's own commit protocol.
"""

from __future__ import annotations

import contextlib
import io
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator, NamedTuple, Optional, Tuple

import numpy as np
import pyarrow as pa

from dbspec.data.sources import DataError
from dbspec.serving.app import LoadedModel
from dbspec.serving.batch import (BATCH_ROWS, OUT_OF_RANGE_COLUMN, BatchResult, RangeCheck,
                                  batch_matrix, check_model_columns, check_new_columns,
                                  check_paths, model_columns, score_matrix, unscorable_rows)
from dbspec.serving.batch_input import spark_input
from dbspec.serving.batch_spark_files import (AS_IS, dictionary_columns, output_schema,
                                              parquet_slices, score_slices, worker_model)

def _model_payload(loaded: LoadedModel) -> tuple[str, dict, bytes]:
    import dataclasses

    import torch

    buffer = io.BytesIO()
    torch.save(loaded.model.state_dict(), buffer)
    key = f"{loaded.name}/{loaded.version}/{uuid.uuid4().hex}"
    return key, dataclasses.asdict(loaded.model.card), buffer.getvalue()


def ship_custom_code(spark, model: dict) -> list[str]:
    """Send a ``model.custom`` class's module to the executors (``addPyFile`` serves it from the
    driver, whose disk they may not see); returns what was shipped.

    Raises:
        PortabilityError: the class lives where it cannot travel.
    """
    import tempfile
    import zipfile

    from dbspec.models.portable import custom_code

    shipped = []
    for path in map(Path, custom_code(model).code_paths):
        if path.is_file():
            spark.sparkContext.addPyFile(str(path))
        else:  # a package directory travels as a zip with the package at its root
            archive = Path(tempfile.mkdtemp(prefix="dbspec-code-")) / f"{path.name}.zip"
            with zipfile.ZipFile(archive, "w") as zipped:
                for file in sorted(path.rglob("*.py")):
                    zipped.write(file, file.relative_to(path.parent).as_posix())
            spark.sparkContext.addPyFile(str(archive))
        shipped.append(str(path))
    return shipped


def read_spark_input(spark, source: str, version: Optional[int]):
    """(a Spark DataFrame, its version label) of a path (see
    :func:`~dbspec.serving.batch_input.spark_input`) or a table name."""
    try:
        found = spark_input(spark, source, version)
        if found is not None:
            return found
        if "/" in source or source.startswith("."):
            raise DataError(f"input {source} does not exist")
        frame = spark.table(source)
        if version is not None:
            frame = spark.sql(f"SELECT * FROM {source} VERSION AS OF {int(version)}")
        return frame, None
    except DataError:
        raise
    except Exception as exc:  # AnalysisException: no such table, unreadable files
        raise DataError(f"input {source}: Spark cannot read it: {str(exc).splitlines()[0]}") \
            from None


def predict_spark(spark, loaded: LoadedModel, source: str, output: str, *, fmt: str = "delta",
                  input_version: Optional[int] = None, batch_rows: Optional[int] = None,
                  out_of_range: tuple[str, float] = ("warn", 0.5)) -> BatchResult:
    """Score with Spark (see the module docstring); the output as ``predict_local``'s.
    ``batch_rows``: per Arrow batch; by default :func:`arrow_batch_rows` of the input's schema.

    Raises:
        DataError: bad input, rows the model cannot score, (``reject``) rows out of range, or
            a failed Spark job (its first line).
    """
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    started = time.perf_counter()
    check_paths(source, output)
    check_reachable(spark, source, output)
    frame, version = read_spark_input(spark, source, input_version)
    names, types, fields = _checked_columns(frame, loaded, source, out_of_range)
    ship_custom_code(spark, loaded.model.card.model)
    payload = spark.sparkContext.broadcast(_model_payload(loaded))
    counts = _Counts(spark.sparkContext.accumulator(0), spark.sparkContext.accumulator(0))
    score = F.arrow_udf(_scorer(payload, counts, source, out_of_range), T.StructType(fields))
    # the UDF makes float32 itself; a typed feature's column (text, image bytes) goes as it is
    features = [F.col(f"`{n}`") if types[n] in ("float", "double") or not _numeric(types[n])
                else F.col(f"`{n}`").cast("double") for n in names]
    try:
        with batch_settings(spark, batch_rows or arrow_batch_rows(frame.schema)):
            scored = frame.withColumn("__dbspec", score(*features))
            scored = scored.select(*[F.col(f"`{c}`") for c in frame.columns],
                                   *[F.col(f"__dbspec.{f.name}").alias(f.name) for f in fields],
                                   F.lit(loaded.name).alias("model_name"),
                                   F.lit(loaded.version).alias("model_version"))
            slices = _file_slices(spark, source, output, fmt, input_version)
            if slices:  # the same table, with no row through the JVM
                schema = output_schema(scored.schema)
                job = {"payload": payload, "name": loaded.name, "version": loaded.version,
                       "source": source, "out_of_range": out_of_range, "schema": schema,
                       "dictionary": dictionary_columns(schema),
                       "batch_rows": batch_rows or BATCH_ROWS}
                tally: list[int] = []
                written, output_version = _write_spark(
                    spark, scored, output, fmt,
                    lambda staging: tally.extend(score_slices(spark, slices, staging, job)))
                rows_scored, flagged = tally
            else:
                written, output_version = _write_spark(spark, scored, output, fmt)
                rows_scored, flagged = counts.scored.value, counts.flagged.value
        _check_written(frame, written, rows_scored, output)
    except DataError:
        raise
    except Exception as exc:  # Py4J and PySpark errors: the first line says what happened
        raise _job_error(exc, source, output) from exc
    finally:
        payload.unpersist()
    return BatchResult(written, output, fmt, version, output_version,
                       time.perf_counter() - started, loaded.name, loaded.version, flagged)


def _checked_columns(frame, loaded: LoadedModel, source: str, out_of_range: tuple[str, float]):
    """(the model's columns, the input's Spark types by name, the Spark fields scoring adds).

    Raises:
        DataError: a feature column is missing or not numeric, or an added column exists.
    """
    from pyspark.sql import types as T

    card = loaded.model.card
    names = model_columns(card)
    types = dict(frame.dtypes)
    check_model_columns(types, card, source, _numeric)
    empty = score_matrix(loaded.model, np.zeros((0, len(card.feature_names)), dtype=np.float32))
    adds_column = RangeCheck(card, *out_of_range).adds_column
    check_new_columns(list(types), list(empty) + ([OUT_OF_RANGE_COLUMN] if adds_column else []),
                      source)
    fields = [T.StructField(name, _spark_type(values)) for name, values in empty.items()]
    if adds_column:
        fields.append(T.StructField(OUT_OF_RANGE_COLUMN, T.StringType()))
    return names, types, fields


def _numeric(spark_type: str) -> bool:
    return spark_type in _SPARK_NUMERIC or spark_type.startswith("decimal")


def _file_slices(spark, source: str, output: str, fmt: str, input_version: Optional[int]):
    """The input's slices for :mod:`~dbspec.serving.batch_spark_files`, or None: Spark reads
    it (see there), the output is not a local path, or Spark writes the Delta table itself."""
    from dbspec.data.spark_sources import has_delta_format

    if input_version is not None or "://" in output or (fmt == "delta"
                                                        and has_delta_format(spark)):
        return None
    return parquet_slices(source, spark.sparkContext.defaultParallelism)


class _Counts(NamedTuple):
    scored: Any  # accumulators: rows scored, rows flagged out of range
    flagged: Any


def _scorer(payload, counts: _Counts, source: str, out_of_range: tuple[str, float]):
    """The Arrow UDF's function, run in the Python workers: batches of feature columns in, a
    struct of the prediction columns (and ``out_of_range``) out."""

    def score(batches: Iterator[Tuple[pa.Array, ...]]) -> Iterator[pa.Array]:
        model = worker_model(payload.value)
        names = list(model.card.feature_names)
        check = RangeCheck(model.card, *out_of_range)
        for arrays in batches:
            try:
                x = batch_matrix(model.card, arrays, source)
            except DataError as refused:  # the message after the marker is the user's error
                raise ValueError(_UNSCORABLE + str(refused).split(": ", 1)[1]
                                 + " (the row within a batch of a Spark task: find it with "
                                   "the local engine, --engine local)") from None
            counts.scored.add(len(x))
            try:
                ranged, flagged = check.column(x, source)
            except DataError as refused:
                raise ValueError(AS_IS + str(refused)) from None
            columns = score_matrix(model, x)
            problem = unscorable_rows(x, columns, names)
            if problem:
                raise ValueError(_UNSCORABLE + problem)
            counts.flagged.add(flagged)
            values = [pa.array(v) for v in columns.values()]
            yield pa.StructArray.from_arrays(
                values + ([ranged] if ranged is not None else []),
                names=list(columns) + ([OUT_OF_RANGE_COLUMN] if ranged is not None else []))

    return score


_ARROW_BATCH = "spark.sql.execution.arrow.maxRecordsPerBatch"
# Parquet (and Delta) inputs reach a Python UDF in the vectorized reader's batches, whatever
# maxRecordsPerBatch says (measured on pyspark 4.3: 4,096-row batches, its default)
_READER_BATCH = "spark.sql.parquet.columnarReaderBatchSize"
_BATCH_BYTES = 8 << 20  # an input batch's rough size in memory, per task
_MIN_BATCH, _MAX_BATCH = 4_096, 65_536


def arrow_batch_rows(schema) -> int:
    """Rows per batch for this Spark schema: as many as fit ``_BATCH_BYTES``, from 4,096 to
    65,536 (1M x 10 features, local[2]: the workers' CPU time fell from 0.54 s to 0.31 s)."""
    from pyspark.sql import types as T

    def size(kind) -> int:
        if isinstance(kind, (T.StringType, T.BinaryType)):
            return 32
        if isinstance(kind, (T.ArrayType, T.MapType, T.StructType)):
            return 256
        return 8

    width = sum(size(field.dataType) for field in schema.fields)
    return max(_MIN_BATCH, min(_MAX_BATCH, _BATCH_BYTES // max(width, 1)))


@contextlib.contextmanager
def batch_settings(spark, rows: int) -> Iterator[None]:
    """Arrow and Parquet reader batches of ``rows`` inside; the session's settings after."""
    previous = {key: spark.conf.get(key, None) for key in (_ARROW_BATCH, _READER_BATCH)}
    for key in previous:
        spark.conf.set(key, str(rows))
    try:
        yield
    finally:
        for key, value in previous.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)


def _job_error(exc: Exception, source: str, output: str) -> DataError:
    """A failed Spark job as the user's error: our UDF's message where it raised one (its last
    mention; earlier ones are source lines), else Spark's first line."""
    text = str(exc)
    if _UNSCORABLE in text:
        return DataError(f"input {source}: " + text.rsplit(_UNSCORABLE, 1)[1].splitlines()[0])
    if AS_IS in text:
        return DataError(text.rsplit(AS_IS, 1)[1].splitlines()[0])
    return DataError(f"Spark could not score {source} into {output}: "
                     f"{text.strip().splitlines()[0][:300] if text.strip() else exc!r}")


def check_reachable(spark, source: str, output: str) -> None:
    """On a cluster, the executors must see the input and write where this machine reads the
    output (else each writes to its own disk and the driver finds 0 rows).

    Raises:
        ExecutorCheckFailed: naming the path and the executor.
    """
    from dbspec.spark.placement import is_local_master
    from dbspec.spark.probe import probe_executors

    if is_local_master(spark.sparkContext.master):
        return
    read = [str(Path(source).expanduser().resolve())] \
        if "://" not in source and Path(source).expanduser().exists() else []
    shared = [str(Path(output).expanduser().resolve().parent)] if "://" not in output else []
    if read or shared:
        probe_executors(spark, read=read, shared=shared)


def _check_written(frame, rows: int, scored: int, output: str) -> None:
    """What was written is what was scored. ``scored`` is an accumulator, which a retried task
    counts twice: a shortfall is confirmed against the input's row count."""
    if rows >= scored and not (rows == 0 and scored > 0):
        return
    expected = frame.count()
    if rows < expected:
        raise DataError(f"output {output}: Spark scored {expected:,} rows but {rows:,} reached "
                        "it; the executors wrote somewhere this machine does not see (their own "
                        "disk?): write to a path every node shares")


_UNSCORABLE = "[dbspec: unscorable rows] "
_SPARK_NUMERIC = {"tinyint", "smallint", "int", "bigint", "float", "double"}


def _spark_type(values: np.ndarray):
    from pyspark.sql import types as T

    kind = values.dtype.kind
    if kind == "f":
        return T.DoubleType()
    if kind in "iu":
        return T.LongType()
    if kind == "b":
        return T.BooleanType()
    return T.StringType()


def _write_spark(spark, scored, output: str, fmt: str,
                 write_parts: Optional[Callable[[Path], None]] = None) -> tuple[int, Optional[int]]:
    """Write with Spark: Delta natively where the session has it, else Parquet files that
    ``deltalake`` commits as one version. ``write_parts``: writes the Parquet files of a local
    output into the staging directory in Spark's stead."""
    from dbspec.data.spark_sources import has_delta_format

    target = Path(output).expanduser()
    local = "://" not in output
    if local and target.is_dir() and any(target.iterdir()) and not (
            (target / "_SUCCESS").exists() or (target / "_delta_log").is_dir()):
        raise DataError(f"output {output} is a directory with other files in it; Spark would "
                        "replace all of them: give an empty or new directory")
    if fmt == "delta" and has_delta_format(spark) and write_parts is None:
        scored.write.format("delta").mode("overwrite").option("overwriteSchema", "true") \
            .save(output)
        return spark.read.format("delta").load(output).count(), None
    if fmt == "parquet" and not local:  # the store's own commit protocol decides
        scored.write.mode("overwrite").parquet(output)
        return spark.read.parquet(output).count(), None
    if not local:
        raise DataError(f"output {output}: writing Delta to a remote path needs a Spark session "
                        "with the Delta format (Databricks, or the Delta connector)")
    import shutil

    import pyarrow.dataset as ds

    from dbspec.atomic import remove_leftovers, replace_directory, staging_for

    remove_leftovers(target)
    staging = staging_for(target)
    try:
        if write_parts is None:
            scored.write.parquet(str(staging))
        else:
            write_parts(staging)
            (staging / "_SUCCESS").touch()  # what a rerun takes for a directory Spark wrote
        dataset = ds.dataset(str(staging), format="parquet")
        rows = dataset.count_rows()  # the files' footers know; a Spark count is another job
        if fmt == "parquet":  # all or nothing: the old directory until the new one is whole
            replace_directory(staging, target)
            return rows, None
        from deltalake import DeltaTable, write_deltalake

        write_deltalake(str(target), dataset.scanner(batch_size=BATCH_ROWS).to_reader(),
                        mode="overwrite", schema_mode="overwrite")
        return rows, DeltaTable(str(target)).version()
    finally:
        shutil.rmtree(staging, ignore_errors=True)
