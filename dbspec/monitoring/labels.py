"""Labels that arrive after the predictions: read whole (they are few next to served rows)
and indexed by the key that joins them to the inference table; and opening the tables."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dbspec.errors import DbspecError


@dataclass
class Labels:
    """Labels by key."""

    keys: Any  # each label's key: ``key``, or ``key#row`` with a row column
    values: np.ndarray  # in the order of ``keys``
    key: str  # the inference-table column they join on
    by_row: bool  # whether a key names one row of a request (a ``row`` column)
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
    from dbspec.serving.batch_input import is_csv_input, is_delta_table

    location = Path(path)
    if not location.exists():
        raise DbspecError(f"labels {path} do not exist")
    if not (is_delta_table(location) or is_csv_input(location) or location.is_dir()
            or location.suffix in (".parquet", ".pq")):
        raise DbspecError(f"labels {path}: expected a Delta table, a Parquet file or "
                          "directory, or a .csv file")
    return open_rows(path, "read the labels", whole=True)


def open_rows(path: str, action: str, *, whole: bool = False) -> Any:
    """The Arrow dataset at ``path`` opened by its source kind (a URI by ``deltalake``: the
    kinds read local paths only), or its rows as a table with ``whole``.

    Raises:
        DbspecError: ``cannot {action} {path}: why``.
    """
    from dbspec.data.sources import DataError
    from dbspec.serving.batch_input import open_table, reason_of

    try:
        if "://" in path:
            from deltalake import DeltaTable

            return DeltaTable(path).to_pyarrow_dataset()
        dataset = open_table(Path(path))
        return dataset.to_table() if whole else dataset
    except DataError as refused:
        raise DbspecError(f"cannot {action} {path}: {reason_of(refused)}") from None
    except Exception as exc:  # pyarrow's and deltalake's own families (a damaged log, rows)
        raise DbspecError(f"cannot {action} {path}: {exc}") from None
