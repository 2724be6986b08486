"""Batch inference: score a Parquet file or directory, a Delta table (any version) or a Spark
table, and write the rows with their predictions and the model's name and version.

- ``local``: Arrow record batches stream from the input through the model into the writer, so
  inputs larger than memory work. A Delta output is committed in one transaction at the end, so
  a failure leaves the table as it was; a Parquet output is written to a hidden temporary file
  in the output directory and renamed into place (a killed write leaves the old file, and the
  next run removes its leftover).
- ``spark``: an iterator Arrow UDF (``arrow_udf``) scores Arrow batches of the feature columns;
  the model (its card and weights, broadcast once) is rebuilt once per Python worker and run
  under ``torch.inference_mode``. Only the features travel to Python and only the predictions
  come back. A local Parquet output is written to a hidden staging directory beside it and
  swapped into place (:mod:`dbspec.atomic`): a failed or killed job leaves the old output as
  it was. A remote one (``dbfs:/``, ``s3://``...) is written by Spark in place, with the
  store's own commit protocol.
"""

from __future__ import annotations

import io
import os
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator, NamedTuple, Optional, Tuple

import numpy as np
import pyarrow as pa

from dbspec.atomic import is_alive
from dbspec.data.sources import DataError
from dbspec.serving.app import LoadedModel

BATCH_ROWS = 65_536
_PART = "part-dbspec-"  # the only Parquet files a rerun replaces


class BatchResult(NamedTuple):
    rows: int
    output: str
    format: str
    input_version: Optional[str]
    output_version: Optional[int]
    seconds: float
    model_name: str
    model_version: str
    out_of_range_rows: int = 0  # rows flagged in the out_of_range column


OUT_OF_RANGE_COLUMN = "out_of_range"


def out_of_range_line(result: BatchResult) -> str:
    """What to tell the user about a batch's flagged rows."""
    return (f"{result.out_of_range_rows:,} of {result.rows:,} row(s) have features far outside "
            f"the training range: their predictions are unreliable (the {OUT_OF_RANGE_COLUMN} "
            "column names them; serving.out_of_range sets the check). The model takes raw "
            "features, as it was trained on.")


class RangeCheck:
    """``serving.out_of_range`` for batch scoring: with ``warn`` an ``out_of_range`` column
    names each row's features far outside the training range (null when none), with
    ``reject`` the first such batch fails the job before anything is committed.
    """

    def __init__(self, card: Any, action: str = "warn", tolerance: float = 0.5):
        from dbspec.models.inputs import FeatureRanges

        self.action = action
        self.ranges = None if action == "off" else FeatureRanges.of_card(card, tolerance)

    @property
    def adds_column(self) -> bool:
        return self.ranges is not None and self.action == "warn"

    def column(self, x: np.ndarray, source: str,
               offset: Optional[int] = None) -> tuple[Optional[pa.Array], int]:
        """(the batch's ``out_of_range`` values or None, rows flagged); ``offset`` is the
        input row of the batch's first (None where it is not known: a Spark partition's).

        Raises:
            DataError: with ``reject``, the batch has out-of-range rows.
        """
        if self.ranges is None:
            return None, 0
        outside = self.ranges.outside(x)
        if self.action == "reject" and outside:
            from dbspec.models.inputs import RAW_FEATURES

            where = f"of a batch of {len(x)}" if offset is None else \
                f"of rows {offset}..{offset + len(x) - 1}"
            raise DataError(f"input {source}: {len(outside.rows)} row(s) {where} lie far "
                            "outside the model's training range (serving.out_of_range: reject; "
                            "nothing was written): "
                            + "; ".join(outside.messages(x, offset=offset or 0, limit=3))
                            + f". {RAW_FEATURES}")
        if not self.adds_column:
            return None, 0
        names = np.array(self.ranges.names + [""], dtype=object)
        values: list[Optional[str]] = [None] * len(x)
        for i in outside.rows:
            values[i] = ",".join(names[np.flatnonzero(outside.mask[i])])
        return pa.array(values, pa.string()), len(outside.rows)


def _is_delta(path: Path) -> bool:
    return (path / "_delta_log").is_dir()


def _is_csv(path: Path) -> bool:
    """A ``.csv`` (or ``.csv.gz``) file, or a directory of them and nothing else to score."""
    def csv(p: Path) -> bool:
        return p.name.lower().endswith((".csv", ".csv.gz"))

    if path.is_file():
        return csv(path)
    files = [p for p in path.iterdir() if p.is_file() and not p.name.startswith((".", "_"))] \
        if path.is_dir() else []
    return bool(files) and all(csv(p) for p in files)


def open_input(source: str, version: Optional[int]):
    """A pyarrow dataset over ``source`` and its version label (``delta-vN`` or None).

    CSV (a ``.csv`` file or a directory of them, with a header row) streams like Parquet; its
    column types are inferred from the first block of rows, as pyarrow does.

    Raises:
        DataError: the input does not exist, is not Parquet, CSV or Delta, or has no such
            version.
    """
    import pyarrow.dataset as ds

    path = Path(source).expanduser()
    if not path.exists():
        raise DataError(f"input {source} does not exist (a Spark table needs --engine spark)")
    if _is_delta(path):
        table = _open_delta(path, version, source)
        return table.to_pyarrow_dataset(), f"delta-v{table.version()}"
    if version is not None:
        raise DataError(f"input {source} is not a Delta table, so it has no version {version}")
    fmt = "csv" if _is_csv(path) else "parquet"
    try:
        dataset = ds.dataset(str(path), format=fmt)
        dataset.schema  # CSV: reads the header and infers the types now
        return dataset, None
    except Exception as exc:  # ArrowInvalid: not Parquet, or a CSV pyarrow cannot parse
        what = "a CSV file pyarrow can read" if fmt == "csv" else "a Delta table, Parquet or CSV"
        raise DataError(f"input {source} is not {what}: {str(exc).splitlines()[0]}") from None


def _open_delta(path: Path, version: Optional[int], source: str):
    from deltalake import DeltaTable

    try:
        return DeltaTable(str(path), version=version)
    except Exception as exc:  # delta-rs reports a missing version this way
        raise DataError(f"input {source}: cannot open Delta version {version}: "
                        f"{str(exc).splitlines()[0]}") from None


def check_features(schema_types: dict[str, Any], feature_names: list[str], source: str,
                   is_numeric: Callable[[Any], bool]) -> None:
    """Every feature column is present and numeric.

    Raises:
        DataError: a missing or non-numeric column.
    """
    missing = [name for name in feature_names if name not in schema_types]
    if missing:
        raise DataError(f"input {source} lacks the model's feature column(s) "
                        f"{', '.join(missing)}; it has {', '.join(schema_types) or 'none'}")
    bad = [f"{n} ({schema_types[n]})" for n in feature_names if not is_numeric(schema_types[n])]
    if bad:
        raise DataError(f"input {source}: feature column(s) {', '.join(bad)} are not numeric")


def _clashes(columns: list[str], predicted: list[str], source: str) -> None:
    present = {c.lower() for c in columns}  # Delta and Spark compare names case-insensitively
    taken = [c for c in predicted + ["model_name", "model_version"] if c.lower() in present]
    if taken:
        raise DataError(f"input {source} already has column(s) {', '.join(taken)}, which the "
                        "predictions would overwrite; rename or drop them first")


def check_paths(source: str, output: str) -> None:
    """The output must not be, contain, or sit inside the input (that deletes or re-reads it).

    Raises:
        DataError: the two overlap.
    """
    if "://" in output or "://" in source:
        return
    given, target = Path(source).expanduser().resolve(), Path(output).expanduser().resolve()
    if given == target or given in target.parents or target in given.parents:
        raise DataError(f"output {output} overlaps the input {source}: scoring would overwrite "
                        "or re-read its own results; write somewhere else")


def _score(model, x: np.ndarray) -> dict[str, np.ndarray]:
    import torch

    from dbspec.models.served import prediction_columns

    with torch.inference_mode():
        out = model(torch.from_numpy(x)).numpy()
    return prediction_columns(model.card, out)


def _unscorable(x: np.ndarray, columns: dict[str, np.ndarray], names: list[str]) -> Optional[str]:
    values = next(iter(columns.values()))
    if values.dtype.kind != "f" or not np.isnan(values).any():
        return None
    holes = [name for j, name in enumerate(names) if np.isnan(x[:, j]).any()]
    where = f" (missing values in {', '.join(holes)})" if holes else ""
    return f"{int(np.isnan(values).sum())} row(s) scored NaN{where}: the model has no impute " \
           "step for them; fill or filter them first"


def predict_local(loaded: LoadedModel, source: str, output: str, *, fmt: str = "delta",
                  input_version: Optional[int] = None, batch_rows: int = BATCH_ROWS,
                  progress: Callable[[int, float], None] = lambda rows, seconds: None,
                  out_of_range: tuple[str, float] = ("warn", 0.5)) -> BatchResult:
    """Stream ``source`` through the model into ``output`` (see the module docstring).

    ``out_of_range`` is ``serving.out_of_range``'s (action, tolerance): see :class:`RangeCheck`.

    Raises:
        DataError: bad input, rows the model cannot score, or (``reject``) rows out of range.
    """
    import pyarrow.types as pat

    started = time.perf_counter()
    check_paths(source, output)
    dataset, version = open_input(source, input_version)
    names = list(loaded.model.card.feature_names)
    types = {field.name: field.type for field in dataset.schema}
    check_features(types, names, source,
                   lambda t: pat.is_integer(t) or pat.is_floating(t) or pat.is_decimal(t))
    empty = _score(loaded.model, np.zeros((0, len(names)), dtype=np.float32))
    check = RangeCheck(loaded.model.card, *out_of_range)
    added = list(empty) + ([OUT_OF_RANGE_COLUMN] if check.adds_column else [])
    _clashes(list(types), added, source)
    schema = dataset.schema
    for name, values in empty.items():
        schema = schema.append(pa.field(name, pa.array(values).type))
    if check.adds_column:
        schema = schema.append(pa.field(OUT_OF_RANGE_COLUMN, pa.string()))
    schema = schema.append(pa.field("model_name", pa.string()))
    schema = schema.append(pa.field("model_version", pa.string()))
    done, flagged, failure = [0], [0], []

    def batches() -> Iterator[Any]:
        for batch in dataset.to_batches(batch_size=batch_rows):
            if batch.num_rows == 0:
                continue
            x = np.empty((batch.num_rows, len(names)), dtype=np.float32)
            for j, name in enumerate(names):
                x[:, j] = batch.column(name).to_numpy(zero_copy_only=False)
            try:
                ranged, count = check.column(x, source, done[0])
            except DataError as refused:
                failure.append(refused)
                raise
            columns = _score(loaded.model, x)
            problem = _unscorable(x, columns, names)
            if problem:
                failure.append(DataError(f"input {source}: {problem}"))
                raise failure[-1]
            flagged[0] += count
            arrays = batch.columns + [pa.array(v) for v in columns.values()] + (
                [ranged] if ranged is not None else []) + [
                pa.array([loaded.name] * batch.num_rows, pa.string()),
                pa.array([loaded.version] * batch.num_rows, pa.string())]
            done[0] += batch.num_rows
            progress(done[0], time.perf_counter() - started)
            yield pa.RecordBatch.from_arrays(arrays, schema=schema)

    reader = pa.RecordBatchReader.from_batches(schema, batches())
    try:
        output_version = _write(reader, output, fmt)
    except Exception:
        if failure:  # the writer wraps our error in its own; nothing was committed
            raise failure[0] from None
        raise
    return BatchResult(done[0], output, fmt, version, output_version,
                       time.perf_counter() - started, loaded.name, loaded.version, flagged[0])


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

    _remove_leftovers(target)
    final = target / _OUTPUT
    stale = sorted(p for p in target.glob(f"{_PART}*.parquet") if p != final) \
        if target.is_dir() else []
    others = [p.name for p in target.iterdir() if p.suffix == ".parquet" and p not in stale
              and p != final] if target.is_dir() else []
    if others:
        raise DataError(f"output {output} holds Parquet files dbspec did not write "
                        f"({', '.join(others[:3])}); give an empty or new directory")
    # a hidden name (readers skip '.' and '_' files), in the output directory (so the rename
    # is atomic), with this process's id (so the next run knows a dead writer's leftover)
    partial = target / f"{_HIDDEN}{os.getpid()}-{uuid.uuid4().hex[:8]}.parquet.partial"
    try:
        target.mkdir(parents=True, exist_ok=True)
        with pq.ParquetWriter(partial, reader.schema) as writer:
            for batch in reader:
                writer.write_batch(batch)
        partial.replace(final)  # the old predictions or the new ones, never half
    except BaseException as exc:
        partial.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise DataError(f"cannot write {output}: {exc.strerror or exc}") from None
        raise
    for old in stale:  # predictions of an earlier dbspec, under other names
        old.unlink(missing_ok=True)
    return None


_OUTPUT = f"{_PART}predictions.parquet"  # one name: a rerun replaces the file in one rename
_HIDDEN = f".{_PART}"


def _remove_leftovers(target: Path) -> None:
    """Delete what killed Parquet writes left in ``target``: hidden partial files of dead
    processes, and the visible ``.partial`` files of earlier dbspec versions (those made the
    directory unreadable to ``pyarrow.dataset``)."""
    if not target.is_dir():
        return
    for path in target.glob(f"{_PART}*.parquet.partial"):
        path.unlink(missing_ok=True)
    for path in target.glob(f"{_HIDDEN}*.parquet.partial"):
        pid = path.name[len(_HIDDEN):].split("-", 1)[0]
        if not pid.isdigit() or not is_alive(int(pid)):
            path.unlink(missing_ok=True)




# -- Spark ----------------------------------------------------------------------------------

_WORKER_MODELS: dict[str, Any] = {}


def _model_payload(loaded: LoadedModel) -> tuple[str, dict, bytes]:
    import dataclasses

    import torch

    buffer = io.BytesIO()
    torch.save(loaded.model.state_dict(), buffer)
    key = f"{loaded.name}/{loaded.version}/{uuid.uuid4().hex}"
    return key, dataclasses.asdict(loaded.model.card), buffer.getvalue()


def ship_custom_code(spark, model: dict) -> list[str]:
    """Send a ``model.custom`` class's module to the executors (``SparkContext.addPyFile``,
    which serves it from the driver, so executors on machines that cannot see the driver's
    disk get it too); returns what was shipped. Layer networks need nothing but dbspec.

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


def _worker_model(payload: tuple[str, dict, bytes]):
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


def read_spark_input(spark, source: str, version: Optional[int]):
    """A Spark DataFrame over a Parquet or CSV path, a Delta table (any version) or a table
    name."""
    from dbspec.data.spark_sources import has_delta_format

    path = Path(source).expanduser()
    try:
        if path.exists() and _is_delta(path):
            if has_delta_format(spark):
                reader = spark.read.format("delta")
                if version is not None:
                    reader = reader.option("versionAsOf", version)
                return reader.load(str(path)), None
            table = _open_delta(path, version, source)
            files = table.file_uris()  # the version's files, listed by deltalake
            if not files:
                raise DataError(f"input {source} has no data files at version "
                                f"{table.version()}")
            return spark.read.parquet(*files), f"delta-v{table.version()}"
        if path.exists():
            if version is not None:
                raise DataError(f"input {source} is not a Delta table, so it has no version "
                                f"{version}")
            if _is_csv(path):
                return spark.read.csv(str(path), header=True, inferSchema=True), None
            return spark.read.parquet(str(path)), None
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

    ``batch_rows`` overrides ``spark.sql.execution.arrow.maxRecordsPerBatch`` for this call
    (measured: Spark's default of 10,000 is as fast here, so it is left alone by default).
    """
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    started = time.perf_counter()
    check_paths(source, output)
    check_reachable(spark, source, output)
    frame, version = read_spark_input(spark, source, input_version)
    names = list(loaded.model.card.feature_names)
    types = dict(frame.dtypes)
    check_features(types, names, source, lambda t: t in _SPARK_NUMERIC or t.startswith("decimal"))
    empty = _score(loaded.model, np.zeros((0, len(names)), dtype=np.float32))
    adds_column = RangeCheck(loaded.model.card, *out_of_range).adds_column
    _clashes(list(types), list(empty) + ([OUT_OF_RANGE_COLUMN] if adds_column else []), source)
    fields = [T.StructField(name, _spark_type(values)) for name, values in empty.items()]
    if adds_column:
        fields.append(T.StructField(OUT_OF_RANGE_COLUMN, T.StringType()))
    result_type = T.StructType(fields)
    ship_custom_code(spark, loaded.model.card.model)
    payload = spark.sparkContext.broadcast(_model_payload(loaded))
    scored_rows = spark.sparkContext.accumulator(0)
    flagged_rows = spark.sparkContext.accumulator(0)

    def score(batches: Iterator[Tuple[pa.Array, ...]]) -> Iterator[pa.Array]:
        model = _worker_model(payload.value)
        check = RangeCheck(model.card, *out_of_range)
        for arrays in batches:
            scored_rows.add(len(arrays[0]) if arrays else 0)
            x = np.column_stack([np.asarray(a.to_numpy(zero_copy_only=False), dtype=np.float32)
                                 for a in arrays]) if arrays else None
            try:
                ranged, count = check.column(x, source)
            except DataError as refused:
                raise ValueError(_OUT_OF_RANGE + str(refused)) from None
            columns = _score(model, x)
            problem = _unscorable(x, columns, names)
            if problem:
                raise ValueError(_UNSCORABLE + problem)
            flagged_rows.add(count)
            values = [pa.array(v) for v in columns.values()]
            yield pa.StructArray.from_arrays(
                values + ([ranged] if ranged is not None else []),
                names=list(columns) + ([OUT_OF_RANGE_COLUMN] if ranged is not None else []))

    score = F.arrow_udf(score, result_type)  # an iterator Arrow UDF, from the type hints

    setting = "spark.sql.execution.arrow.maxRecordsPerBatch"
    previous = spark.conf.get(setting, None)
    if batch_rows is not None:
        spark.conf.set(setting, str(batch_rows))
    features = [F.col(f"`{n}`") if types[n] in ("float", "double") else
                F.col(f"`{n}`").cast("double") for n in names]  # the UDF makes float32 itself
    try:
        scored = frame.withColumn("__dbspec", score(*features))
        scored = scored.select(*[F.col(f"`{c}`") for c in frame.columns],
                               *[F.col(f"__dbspec.{f.name}").alias(f.name) for f in fields],
                               F.lit(loaded.name).alias("model_name"),
                               F.lit(loaded.version).alias("model_version"))
        rows, output_version = _write_spark(spark, scored, output, fmt)
        _check_written(frame, rows, scored_rows.value, output)
    except DataError:
        raise
    except Exception as exc:  # Py4J and PySpark errors: the first line says what happened
        text = str(exc)
        if _UNSCORABLE in text:  # the last mention is the message; earlier ones are source
            raise DataError(f"input {source}: "
                            + text.rsplit(_UNSCORABLE, 1)[1].splitlines()[0]) from None
        if _OUT_OF_RANGE in text:
            raise DataError(text.rsplit(_OUT_OF_RANGE, 1)[1].splitlines()[0]) from None
        raise DataError(f"Spark could not score {source} into {output}: "
                        f"{text.strip().splitlines()[0][:300] if text.strip() else exc!r}") \
            from exc
    finally:
        if batch_rows is not None:
            if previous is None:
                spark.conf.unset(setting)
            else:
                spark.conf.set(setting, previous)
        payload.unpersist()
    return BatchResult(rows, output, fmt, version, output_version,
                       time.perf_counter() - started, loaded.name, loaded.version,
                       flagged_rows.value)


def check_reachable(spark, source: str, output: str) -> None:
    """On a cluster, the executors must see the input and write where this machine reads the
    output back (measured: otherwise each writes to its own disk and the driver finds 0 rows).

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
    """What was written is what was scored; 0 rows for a non-empty input is never success.

    ``scored`` comes from an accumulator, which a retried task can count twice: a shortfall
    is confirmed against the input's own row count before it is called an error.
    """
    if rows >= scored and not (rows == 0 and scored > 0):
        return
    expected = frame.count()
    if rows < expected:
        raise DataError(f"output {output}: Spark scored {expected:,} rows but {rows:,} reached "
                        "it; the executors wrote somewhere this machine does not see (their own "
                        "disk?): write to a path every node shares")


_UNSCORABLE = "[dbspec: unscorable rows] "
_OUT_OF_RANGE = "[dbspec: out of range] "  # marks a reject's message inside Spark's error
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


def _write_spark(spark, scored, output: str, fmt: str) -> tuple[int, Optional[int]]:
    """Write with Spark; Delta natively where the session has it, else Parquet files that
    ``deltalake`` then commits as one new version of the table."""
    from dbspec.data.spark_sources import has_delta_format

    target = Path(output).expanduser()
    local = "://" not in output
    if local and target.is_dir() and any(target.iterdir()) and not (
            (target / "_SUCCESS").exists() or (target / "_delta_log").is_dir()):
        raise DataError(f"output {output} is a directory with other files in it; Spark would "
                        "replace all of them: give an empty or new directory")
    if fmt == "delta" and has_delta_format(spark):
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
        scored.write.parquet(str(staging))
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
