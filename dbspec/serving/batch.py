"""Batch inference: score a Parquet file or directory, CSV, a Delta table (any version) or a
Spark table, and write the rows with their predictions and the model's name and version.

Two engines share what is here (the result record, the input checks, the out-of-range check and
the scoring of one feature matrix):

- :func:`~dbspec.serving.batch_local.predict_local` streams Arrow record batches through the
  model in this process (:mod:`dbspec.serving.batch_local`);
- :func:`~dbspec.serving.batch_spark.predict_spark` scores with Spark, the model rebuilt once
  per Python worker (:mod:`dbspec.serving.batch_spark`).

Both are importable from here; this module imports neither engine (nor pyspark) until asked.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Any, Callable, NamedTuple, Optional, Sequence

import numpy as np
import pyarrow as pa

from dbspec.data.sources import DataError
from dbspec.models.card import takes_raw_columns

BATCH_ROWS = 65_536
# rows per forward pass (measured on the diabetes MLP, 1 thread: 16,384-row chunks cost half as
# much per row as 65,536-row ones, whose activations no longer fit the CPU's cache)
CHUNK_ROWS = 16_384
OUT_OF_RANGE_COLUMN = "out_of_range"


class BatchResult(NamedTuple):
    """What a batch scoring job did.

    Attributes:
        rows: Rows scored and written.
        output: Where they were written.
        format: ``delta`` or ``parquet``.
        input_version: The input's version label (``delta-vN``), None where it has none.
        output_version: The Delta version written, None for Parquet (or a native Delta write).
        seconds: Wall-clock seconds of the whole job.
        model_name: The registered model's name.
        model_version: Its version.
        out_of_range_rows: Rows flagged in the ``out_of_range`` column.
    """

    rows: int
    output: str
    format: str
    input_version: Optional[str]
    output_version: Optional[int]
    seconds: float
    model_name: str
    model_version: str
    out_of_range_rows: int = 0


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
        if not self._may_be_outside(x):
            return (pa.nulls(len(x), pa.string()) if self.adds_column else None), 0
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

    def _may_be_outside(self, x: np.ndarray) -> bool:
        """Whether any row can be out of range: checks each column's extremes (two rows), not
        every cell, which is what most batches need (measured: the full check was a fifth of
        the Python worker's time). NaN is never out of range, so the extremes skip it."""
        if len(x) == 0 or self.ranges is None:
            return False
        with np.errstate(invalid="ignore"):  # an all-NaN column warns; its extreme is NaN
            extremes = np.vstack([np.fmin.reduce(x, axis=0), np.fmax.reduce(x, axis=0)])
        return bool(self.ranges.outside(extremes))


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


def model_columns(card: Any) -> list[str]:
    """The input columns the model reads: its typed features' raw columns, else its numeric
    feature columns."""
    if takes_raw_columns(card):
        from dbspec.models.encoding import raw_columns

        return raw_columns(card.inputs)
    return list(card.feature_names)


def check_model_columns(schema_types: dict[str, Any], card: Any, source: str,
                        is_numeric: Callable[[Any], bool]) -> None:
    """:func:`check_features` for any model: a typed feature's column must be present; only
    numeric features must be numeric (its encoding checks the others' values).

    Raises:
        DataError: a missing column, or a numeric feature's column that is not numeric.
    """
    if not takes_raw_columns(card):
        check_features(schema_types, list(card.feature_names), source, is_numeric)
        return
    check_features(schema_types, model_columns(card), source, lambda _: True)
    numeric = [i["name"] for i in card.inputs if i["type"] == "numeric"]
    check_features(schema_types, numeric, source, is_numeric)


def batch_matrix(card: Any, columns: Sequence[Any], source: str,
                 first_row: Optional[int] = None) -> np.ndarray:
    """The model's feature matrix of one batch of its :func:`model_columns` (Arrow arrays);
    ``first_row``: the batch's first row in the table, when known (errors name the table's
    row; without it, the row within the batch).

    Raises:
        DataError: a value a typed feature cannot encode (its column and row named).
    """
    if not takes_raw_columns(card):
        return feature_matrix(columns)
    from dbspec.models.encoding import encode_columns
    from dbspec.models.inputs import InputError

    try:
        return encode_columns(card.inputs, dict(zip(model_columns(card), columns)))
    except InputError as exc:
        # the encoder counts rows within the batch; the table's row is the batch's start on
        message = re.sub(r"\brow (\d+)", lambda m: f"row {int(m.group(1)) + first_row}",
                         str(exc), count=1) if first_row is not None else str(exc)
        raise DataError(f"input {source}: {message}") from None


def check_new_columns(columns: list[str], predicted: list[str], source: str) -> None:
    """The columns scoring adds (``predicted``, the model's name and version) are not already
    among the input's ``columns``.

    Raises:
        DataError: naming the clashing columns.
    """
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


def feature_matrix(columns: Sequence[Any]) -> np.ndarray:
    """The float32 (rows, features) matrix of Arrow feature columns, in the given order; nulls
    become NaN."""
    x = np.empty((len(columns[0]) if columns else 0, len(columns)), dtype=np.float32)
    for j, column in enumerate(columns):
        x[:, j] = column.to_numpy(zero_copy_only=False)
    return x


def score_matrix(model, x: np.ndarray) -> dict[str, np.ndarray]:
    """The prediction columns of a float32 feature matrix in the model's column order.

    The rows go through the model ``CHUNK_ROWS`` at a time, whatever the batch's size.
    """
    import torch

    from dbspec.models.served import prediction_columns

    with torch.inference_mode():
        if len(x) <= CHUNK_ROWS:
            out = model(torch.from_numpy(x)).numpy()
        else:
            out = np.concatenate([model(torch.from_numpy(x[i:i + CHUNK_ROWS])).numpy()
                                  for i in range(0, len(x), CHUNK_ROWS)])
    return prediction_columns(model.card, out)


def unscorable_rows(x: np.ndarray, columns: dict[str, np.ndarray],
                    names: list[str]) -> Optional[str]:
    """Why some rows of ``x`` have no prediction (they scored NaN), or None when all do.

    Every float column counts: a classifier's label column is whole numbers, and a NaN row
    shows only in its probabilities (it used to be written as the first class)."""
    scored_nan = np.zeros(len(x), dtype=bool)
    for values in columns.values():
        if values.dtype.kind == "f":
            scored_nan |= np.isnan(values.reshape(len(values), -1)).any(axis=1)
    if not scored_nan.any():
        return None
    holes = [name for j, name in enumerate(names) if np.isnan(x[:, j]).any()]
    where = f" (missing values in {', '.join(holes)})" if holes else ""
    return f"{int(scored_nan.sum())} row(s) scored NaN{where}: the model has no impute " \
           "step for them; fill or filter them first"


# the engines, imported on first use: `from dbspec.serving.batch import predict_spark` keeps
# working without this module importing the engines (they import it)
_ENGINES = {"predict_local": "dbspec.serving.batch_local",
            "predict_spark": "dbspec.serving.batch_spark"}


def __getattr__(name: str) -> Any:
    if name in _ENGINES:
        return getattr(importlib.import_module(_ENGINES[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
