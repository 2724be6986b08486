"""The inference table's layout, checked in one place: the columns a pass reads, their types,
and the rows ``dbspec serve`` cannot have written.

A table that does not match is refused with one located error (the table, the column, what was
found, what was expected) before any statistic, so a pass never alerts or rolls back on it.
Rows with a null feature or prediction, or dated in the future, are left out and counted; a
row without a timestamp or version cannot be placed and stops the pass.
"""

from __future__ import annotations

import re
from typing import Any, Iterator, NamedTuple

import numpy as np
import pyarrow as pa

from dbspec.errors import DbspecError

#: The inference table's own columns (features are renamed ``feature_<name>`` on a clash).
BASE_COLUMNS = ("request_id", "timestamp", "model_name", "model_version", "latency_ms")
#: The columns that mark a Databricks AI Gateway inference table (:mod:`.gateway`).
GATEWAY_COLUMNS = ("databricks_request_id", "request_time", "status_code", "request",
                   "response", "served_entity_id", "logging_error_codes",
                   "execution_duration_ms")
#: Rows later than now by more than this are left out (clocks differ by seconds, not minutes).
CLOCK_SKEW_S = 300
#: Why rows are left out (counted, reported).
NULL_VALUES = "with a null feature or prediction, which dbspec serve never writes"
FUTURE = f"dated after now (beyond {CLOCK_SKEW_S // 60} minutes of clock skew)"
_ZONED = "a timestamp with a time zone (dbspec serve writes timestamp[us, tz=UTC])"
_BASE_TYPES = dict(zip(BASE_COLUMNS, ("strings", _ZONED, "strings", "strings", "numbers")))


class InferenceRows(NamedTuple):
    """An opened inference table: where it is (for messages) and its rows."""

    path: str
    dataset: Any  # a pyarrow dataset


def check_base_columns(table: InferenceRows) -> None:
    """Raise a located DbspecError unless ``table`` has the base columns in the server's
    types."""
    schema = table.dataset.schema
    missing = [c for c in BASE_COLUMNS if c not in schema.names]
    if missing:
        gateway = [c for c in GATEWAY_COLUMNS if c not in schema.names]
        raise DbspecError(f"{table.path} is not an inference table: it has no "
                          f"{', '.join(missing)} column(s) (dbspec serve's), nor "
                          f"{', '.join(gateway)} (a Databricks AI Gateway table's)")
    for column, expected in _BASE_TYPES.items():
        _check_type(table, column, expected)


def version_columns(table: InferenceRows, name: str, version: str,
                    profile: dict[str, Any]) -> dict[str, str]:
    """Each profiled column of ``name`` v``version`` -> its table column; a located
    DbspecError for one the table lacks (the server writes each on every row) or holds in
    another type."""
    outputs = list(profile["outputs"])
    taken = {c.lower() for c in (*BASE_COLUMNS, *outputs)}
    renamed = any(f.lower() in taken for f in profile["features"])
    columns = {f: f"feature_{f}" if renamed else f for f in profile["features"]}
    columns.update({o: o for o in outputs})
    missing = [c for c, t in columns.items() if t not in table.dataset.schema.names]
    if missing:
        raise DbspecError(f"inference table {table.path} has no column {', '.join(missing)} "
                          f"of {name} v{version} (dbspec serve writes all {len(columns)} of "
                          "its features and predictions on every row): is it the table this "
                          "model's server writes?")
    for column, found in columns.items():
        profiled = profile["columns"][column]
        values = [] if profiled["kind"] == "numeric" else profiled["values"]
        if profiled["kind"] == "numeric" or values:
            _check_type(table, found, "strings" if any(isinstance(v, str) for v in values)
                        else "numbers", f" ({name} v{version} was trained on them)")
    return columns


def _check_type(table: InferenceRows, column: str, expected: str, why: str = "") -> None:
    kind = table.dataset.schema.field(column).type
    found = "strings" if pa.types.is_string(kind) or pa.types.is_large_string(kind) else \
        "numbers" if pa.types.is_integer(kind) or pa.types.is_floating(kind) or \
        pa.types.is_boolean(kind) or pa.types.is_decimal(kind) else \
        _ZONED if pa.types.is_timestamp(kind) and kind.tz is not None else str(kind)
    if found != expected:
        naive = " (no time zone: local or UTC?)" if pa.types.is_timestamp(kind) and \
            expected == _ZONED else ""
        raise DbspecError(f"inference table {table.path}: column '{column}' is {kind}{naive}, "
                          f"expected {expected}{why}: not a table dbspec serve wrote")


def read_batches(table: InferenceRows, columns: list[str], condition: Any,
                 batch_rows: int) -> Iterator[Any]:
    """The rows matching ``condition`` batch by batch: at most ``batch_rows`` rows decoded at
    a time, whatever the table's size or its row groups' (:func:`_parquet_batches`); a data
    file missing or damaged is a DbspecError naming the table and the file."""
    import pyarrow.dataset as ds

    dataset = table.dataset
    try:
        if isinstance(dataset, ds.FileSystemDataset) and \
                isinstance(dataset.format, ds.ParquetFileFormat):
            yield from _parquet_batches(dataset, columns, condition, batch_rows)
        else:
            yield from dataset.to_batches(columns=columns, filter=condition,
                                          batch_size=batch_rows, batch_readahead=2,
                                          fragment_readahead=1, use_threads=False)
    except (pa.ArrowException, OSError) as failed:
        where, exc = "", failed
        for fragment in table.dataset.get_fragments():  # which file: read each footer
            try:
                fragment.physical_schema  # noqa: B018
            except (pa.ArrowException, OSError) as damaged:
                where, exc = f", data file {fragment.path}", damaged
                break
        lines = (re.sub(r"\x1b\[[0-9;]*m|\u21b3", "", line).strip()  # deltalake's colours
                 for line in str(exc).splitlines())
        raise DbspecError(f"cannot read the inference table {table.path}{where}: "
                          f"{': '.join(line for line in lines if line)} (a data file its "
                          "Delta log lists is missing or damaged: restore it, or the table)") \
            from None


def _parquet_batches(dataset: Any, columns: list[str], condition: Any,
                     batch_rows: int) -> Iterator[Any]:
    """The Parquet files of ``dataset`` read page by page into ``batch_rows``-row batches of
    its schema: the dataset's scanner decodes a whole row group before slicing it (a 1M-row
    group of an optimized table: 100 MB); only row groups whose statistics may match
    ``condition`` are read, partition values and columns a file lacks are filled in."""
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    schema = pa.schema([dataset.schema.field(c) for c in columns])
    coerce = dataset.format.read_options.coerce_int96_timestamp_unit
    for fragment in dataset.get_fragments(filter=condition):
        groups = [g.id for g in fragment.subset(condition, dataset.schema).row_groups] \
            if condition is not None else None
        fixed = ds.get_partition_keys(fragment.partition_expression)
        stored = [c for c in columns if c in fragment.physical_schema.names]
        with pq.ParquetFile(fragment.open(), coerce_int96_timestamp_unit=coerce) as file:
            for batch in file.iter_batches(batch_rows, row_groups=groups, columns=stored,
                                           use_threads=True):
                arrays = [batch.column(f.name).cast(f.type) if f.name in stored else
                          pa.repeat(pa.scalar(fixed.get(f.name), f.type), batch.num_rows)
                          for f in schema]
                batch = pa.RecordBatch.from_arrays(arrays, schema=schema)
                yield batch if condition is None else batch.filter(condition)


def check_placed(table: InferenceRows, batch: Any) -> None:
    """Raise a located DbspecError for rows a pass cannot place: a null request id,
    timestamp, model name or version (the server writes each on every row)."""
    for column in BASE_COLUMNS[:4]:
        nulls = batch.column(column).null_count
        if nulls:
            raise DbspecError(f"inference table {table.path}: column '{column}' is null in at "
                              f"least {nulls:,} row(s): dbspec serve writes it on every row, so "
                              "the table holds rows of another writer or is damaged (the "
                              "table's fault, not the registry's): remove them")


def unusable_rows(batch: Any, columns: dict[str, str]) -> np.ndarray:
    """Whether each row of ``batch`` has a null in one of ``columns`` (table names)."""
    out = np.zeros(batch.num_rows, dtype=bool)
    for name in columns.values():
        if batch.column(name).null_count:
            out |= batch.column(name).is_null().to_numpy(zero_copy_only=False)
    return out


def left_out_text(counts: dict[str, int]) -> str:
    """``1,000 row(s) left out: 900 with ...; 100 dated ...``."""
    return f"{sum(counts.values()):,} row(s) left out: " + \
        "; ".join(f"{count:,} {why}" for why, count in counts.items())


def spark_error(exc: Exception) -> str:
    """The line of a Spark or Py4J error that says what went wrong (its error class)."""
    lines = [line.strip(" :") for line in str(exc).splitlines() if line.strip(" :")]
    found = next((line for line in lines if re.search(r"\[[A-Z][A-Z_]+\]", line)),
                 lines[0] if lines else type(exc).__name__)
    return re.sub(r"^[\w.$]+(Exception|Error): ", "", found)[:500]
