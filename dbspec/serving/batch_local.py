"""The local batch engine: Arrow record batches stream from the input through the model into
the writer, in this process, so inputs larger than memory work.

A Delta output is committed in one transaction at the end, so a failure leaves the table as it
was; a Parquet output is written to a hidden temporary file in the output directory and renamed
into place (a killed write leaves the old file, and the next run removes its leftover).
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import numpy as np
import pyarrow as pa

from dbspec.atomic import is_alive
from dbspec.data.sources import DataError
from dbspec.serving.app import LoadedModel
from dbspec.serving.batch import (BATCH_ROWS, OUT_OF_RANGE_COLUMN, BatchResult, RangeCheck,
                                  batch_matrix, check_model_columns, check_new_columns,
                                  check_paths, model_columns, open_input, score_matrix,
                                  unscorable_rows)

_PART = "part-dbspec-"  # the only Parquet files a rerun replaces


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
    card = loaded.model.card
    names = model_columns(card)
    types = {field.name: field.type for field in dataset.schema}
    check_model_columns(types, card, source,
                        lambda t: pat.is_integer(t) or pat.is_floating(t) or pat.is_decimal(t))
    empty = score_matrix(loaded.model, np.zeros((0, len(card.feature_names)), dtype=np.float32))
    check = RangeCheck(loaded.model.card, *out_of_range)
    added = list(empty) + ([OUT_OF_RANGE_COLUMN] if check.adds_column else [])
    check_new_columns(list(types), added, source)
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
            try:
                x = batch_matrix(card, [batch.column(name) for name in names], source, done[0])
            except DataError as refused:
                failure.append(refused)
                raise
            try:
                ranged, count = check.column(x, source, done[0])
            except DataError as refused:
                failure.append(refused)
                raise
            columns = score_matrix(loaded.model, x)
            problem = unscorable_rows(x, columns, card.feature_names)
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
