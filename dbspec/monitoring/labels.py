"""Labels that arrive after the predictions: read whole (they are few next to served rows)
and indexed by the key that joins them to the inference table."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dbspec.errors import DbspecError


@dataclass
class Labels:
    """Labels by key, read whole (they are few next to served rows).

    Attributes:
        keys: The key of each label (``key`` or ``key#row`` when a row column is given).
        values: The labels, in the order of ``keys``.
        key: The inference-table column they join on.
        by_row: Whether a key names one row of a request (``row`` column).
    """

    keys: Any
    values: np.ndarray
    key: str
    by_row: bool
    pending: int = 0  # rows whose label is empty (not arrived yet): left out of the join


def read_labels(path: str, key: str, column: str) -> Labels:
    """The labels file (Delta directory, Parquet or CSV) as a :class:`Labels` index.

    Raises:
        DbspecError: no such file, an unknown format, or missing key/label columns.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    table = _read_table(path)
    for name in (key, column):
        if name not in table.column_names:
            raise DbspecError(f"labels {path}: no column '{name}' (it has "
                              f"{', '.join(table.column_names)}); set monitoring.labels.key "
                              "and .column")
    labelled = pc.is_valid(table.column(column))
    if pa.types.is_floating(table.column(column).type):
        labelled = pc.and_(labelled, pc.invert(pc.is_nan(table.column(column))))
    pending = len(table) - pc.sum(labelled.cast(pa.int64())).as_py() if len(table) else 0
    table = table.filter(labelled)
    keys = table.column(key).cast(pa.string())
    by_row = "row" in table.column_names
    if by_row:
        keys = pc.binary_join_element_wise(keys, table.column("row").cast(pa.string()), "#")
    keys = keys.combine_chunks()
    if len(pc.unique(keys)) != len(keys):
        raise DbspecError(f"labels {path}: a key appears more than once in '{key}'"
                          + (" and 'row'" if by_row else "") + "; give one label per row")
    values = table.column(column).to_numpy(zero_copy_only=False)
    return Labels(keys, values, key, by_row, int(pending))


def _read_table(path: str):
    """The labels' rows, read by the source kind of their shape (Delta, Parquet or CSV)."""
    from dbspec.data.sources import DataError
    from dbspec.serving.batch_input import is_csv_input, is_delta_table, open_table, reason_of

    location = Path(path)
    if not location.exists():
        raise DbspecError(f"labels {path} do not exist")
    if not (is_delta_table(location) or is_csv_input(location) or location.is_dir()
            or location.suffix in (".parquet", ".pq")):
        raise DbspecError(f"labels {path}: expected a Delta table, a Parquet file or "
                          "directory, or a .csv file")
    try:
        return open_table(location).to_table()
    except DataError as refused:
        raise DbspecError(f"cannot read the labels {path}: {reason_of(refused)}") from None
    except Exception as exc:  # pyarrow's errors reading the rows
        raise DbspecError(f"cannot read the labels {path}: {exc}") from None
