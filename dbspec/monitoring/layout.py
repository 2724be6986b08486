"""The inference table's layout, checked in one place: the columns a pass needs, their types,
and which rows ``dbspec serve`` cannot have written.

A table that does not match is refused with one located error (the table, the column, what was
found, what was expected) before any statistic is computed, so a pass never alerts, tags or rolls
back on it. Rows the server cannot have written but that can be told apart (a null feature or
prediction, dated in the future) are left out and counted; rows that cannot be placed (no
timestamp, no version) stop the pass.
"""

from __future__ import annotations

from typing import Any, Iterator, NamedTuple

import numpy as np

from dbspec.errors import DbspecError

#: The inference table's own columns (features are renamed ``feature_<name>`` on a clash).
BASE_COLUMNS = ("request_id", "timestamp", "model_name", "model_version", "latency_ms")
#: Rows later than now by more than this are left out: no server writes them (clocks differ by
#: seconds, not minutes).
CLOCK_SKEW_S = 300
#: What the server writes in each base column.
_BASE_TYPES = {"request_id": "string", "model_name": "string", "model_version": "string",
               "latency_ms": "numbers", "timestamp": "a timestamp with a time zone (dbspec "
                                                    "serve writes timestamp[us, tz=UTC])"}
#: Why rows are left out (counted, reported).
NULL_VALUES = "with a null feature or prediction, which dbspec serve never writes"
FUTURE = f"dated after now (beyond {CLOCK_SKEW_S // 60} minutes of clock skew)"


class InferenceRows(NamedTuple):
    """An opened inference table: where it is (for messages) and its rows."""

    path: str
    dataset: Any  # a pyarrow dataset


def check_base_columns(table: InferenceRows) -> None:
    """Raise a located DbspecError unless ``table`` has the base columns, of the server's
    types."""
    schema = table.dataset.schema
    missing = [c for c in BASE_COLUMNS if c not in schema.names]
    if missing:
        raise DbspecError(f"{table.path} is not an inference table: it has no "
                          f"{', '.join(missing)} column(s)")
    for column, expected in _BASE_TYPES.items():
        kind = schema.field(column).type
        fits = _is_zoned(kind) if column == "timestamp" else \
            _is_number(kind) if column == "latency_ms" else _is_text(kind)
        if not fits:
            zone = " (no time zone: local or UTC?)" if column == "timestamp" and \
                _is_timestamp(kind) else ""
            raise DbspecError(f"inference table {table.path}: column '{column}' is {kind}"
                              f"{zone}, expected {expected}: not a table dbspec serve wrote")


def version_columns(table: InferenceRows, name: str, version: str,
                    profile: dict[str, Any]) -> dict[str, str]:
    """Each profiled column of ``name`` v``version`` -> its table column.

    Raises:
        DbspecError: a profiled column the table lacks (the server writes every one on every
            row) or holds in another type, named with the table.
    """
    schema = table.dataset.schema
    outputs = list(profile["outputs"])
    taken = {c.lower() for c in (*BASE_COLUMNS, *outputs)}
    renamed = any(f.lower() in taken for f in profile["features"])
    columns = {f: f"feature_{f}" if renamed else f for f in profile["features"]}
    columns.update({o: o for o in outputs})
    missing = [c for c, t in columns.items() if t not in schema.names]
    if missing:
        raise DbspecError(f"inference table {table.path} has no column {', '.join(missing)} "
                          f"of {name} v{version} (dbspec serve writes all {len(columns)} of "
                          "its features and predictions on every row): is it the table this "
                          "model's server writes?")
    for column, found in columns.items():
        expected = _expected(profile["columns"][column])
        kind = schema.field(found).type
        if expected == "numbers" and not _is_number(kind) or \
                expected == "strings" and not _is_text(kind):
            raise DbspecError(f"inference table {table.path}: column '{found}' is {kind}, "
                              f"expected {expected} ({name} v{version} was trained on "
                              f"{expected}): not a table dbspec serve wrote")
    return columns


def read_batches(table: InferenceRows, columns: list[str], condition: Any,
                 batch_rows: int) -> Iterator[Any]:
    """The rows matching ``condition`` batch by batch, with little read-ahead (memory stays a
    few row groups whatever the table's size); a file the table lists that is missing or
    damaged is a DbspecError naming the table."""
    import pyarrow as pa

    try:
        yield from table.dataset.to_batches(columns=columns, filter=condition,
                                            batch_size=batch_rows, batch_readahead=2,
                                            fragment_readahead=1, use_threads=False)
    except (pa.ArrowException, OSError) as exc:
        where, exc = _damaged_file(table.dataset, exc)
        raise DbspecError(f"cannot read the inference table {table.path}{where}: "
                          f"{_reason(exc)} (a data file its Delta log lists is missing or "
                          "damaged: restore it, or the table)") from None


def _damaged_file(dataset: Any, failed: Exception) -> tuple[str, Exception]:
    """(``, data file F``, its error) for the first data file whose footer cannot be read;
    ("", ``failed``) when each can."""
    import pyarrow as pa

    for fragment in dataset.get_fragments():
        try:
            fragment.physical_schema  # noqa: B018 (reads the footer)
        except (pa.ArrowException, OSError) as exc:
            return f", data file {fragment.path}", exc
    return "", failed


def _reason(exc: Exception) -> str:
    """An exception's lines (deltalake's chained, coloured ones too) on one line."""
    import re

    lines = (re.sub(r"\x1b\[[0-9;]*m|\u21b3", "", line).strip() for line in str(exc).splitlines())
    return ": ".join(line for line in lines if line)


def check_placed(table: InferenceRows, batch: Any) -> None:
    """Raise a located DbspecError for rows a pass cannot place: a null request id,
    timestamp, model name or version (the server writes each on every row)."""
    for column in ("request_id", "timestamp", "model_name", "model_version"):
        nulls = batch.column(column).null_count
        if nulls:
            raise DbspecError(f"inference table {table.path}: column '{column}' is null in at "
                              f"least {nulls:,} row(s): dbspec serve writes it on every "
                              "row, so the table holds rows of another writer or is damaged "
                              "(the table's fault, not the registry's): remove them")


def timestamps_us(batch: Any) -> np.ndarray:
    """A batch's timestamps as UTC epoch microseconds (whatever unit and zone they have)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    stamps = pc.cast(batch.column("timestamp"), pa.timestamp("us", tz="UTC"), safe=False)
    return stamps.cast(pa.int64()).to_numpy()


def unusable_rows(batch: Any, columns: dict[str, str]) -> np.ndarray:
    """Whether each row of ``batch`` has a null in one of ``columns`` (table names)."""
    out = np.zeros(batch.num_rows, dtype=bool)
    for name in columns.values():
        values = batch.column(name)
        if values.null_count:
            out |= values.is_null().to_numpy(zero_copy_only=False)
    return out


def left_out_text(counts: dict[str, int]) -> str:
    """``1,000 row(s) left out: 900 with ..., 100 dated ...``."""
    return f"{sum(counts.values()):,} row(s) left out: " + \
        "; ".join(f"{count:,} {why}" for why, count in counts.items())


def _expected(column: dict[str, Any]) -> str:
    """What a profiled column's served values are: ``numbers``, ``strings`` or ``any``."""
    if column["kind"] == "numeric":
        return "numbers"
    values = column["values"]
    if not values:
        return "any"
    return "strings" if any(isinstance(v, str) for v in values) else "numbers"


def _is_text(kind: Any) -> bool:
    import pyarrow as pa

    return bool(pa.types.is_string(kind) or pa.types.is_large_string(kind))


def _is_number(kind: Any) -> bool:
    import pyarrow as pa

    return bool(pa.types.is_integer(kind) or pa.types.is_floating(kind)
                or pa.types.is_boolean(kind) or pa.types.is_decimal(kind))


def _is_timestamp(kind: Any) -> bool:
    import pyarrow as pa

    return bool(pa.types.is_timestamp(kind))


def _is_zoned(kind: Any) -> bool:
    return _is_timestamp(kind) and kind.tz is not None
