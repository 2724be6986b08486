"""Batch inference: score Parquet, CSV, a Delta table (any version) or a Spark table, and write
the rows with their predictions and the model's name and version.

What the two engines share: the result, the input checks, the out-of-range check and the
scoring of one feature matrix. The engines, :func:`predict_local` (Arrow batches in this
process) and :func:`predict_spark` (a Spark UDF), are importable from here, imported when asked.
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
    """What a batch scoring job did."""

    rows: int  #: scored and written
    output: str
    format: str  #: ``delta`` or ``parquet``
    input_version: Optional[str]  #: the input's version label (``delta-vN``), or None
    output_version: Optional[int]  #: the Delta version written; None: Parquet, a native write
    seconds: float  #: of the whole job
    model_name: str
    model_version: str
    out_of_range_rows: int = 0  #: rows flagged in the ``out_of_range`` column


def out_of_range_line(result: BatchResult) -> str:
    """What to tell the user about a batch's flagged rows."""
    return (f"{result.out_of_range_rows:,} of {result.rows:,} row(s) have features far outside "
            f"the training range: their predictions are unreliable (the {OUT_OF_RANGE_COLUMN} "
            "column names them; serving.out_of_range sets the check). The model takes raw "
            "features, as it was trained on.")


class RangeCheck:
    """``serving.out_of_range`` for batch scoring: ``warn`` adds an ``out_of_range`` column
    naming each row's features far outside the training range, ``reject`` fails the job at
    the first such batch, before anything is committed."""

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
        """Whether any row can be: each column's extremes (NaN skipped) are checked, not every
        cell (measured: the full check was a fifth of the Python worker's time)."""
        if len(x) == 0 or self.ranges is None:
            return False
        with np.errstate(invalid="ignore"):  # an all-NaN column warns; its extreme is NaN
            extremes = np.vstack([np.fmin.reduce(x, axis=0), np.fmax.reduce(x, axis=0)])
        return bool(self.ranges.outside(extremes))


def model_columns(card: Any) -> list[str]:
    """The input columns the model reads: its typed features' raw columns, else its numeric
    feature columns."""
    if takes_raw_columns(card):
        from dbspec.models.encoding import raw_columns

        return raw_columns(card.inputs)
    return list(card.feature_names)


def check_model_columns(schema_types: dict[str, Any], card: Any, source: str,
                        is_numeric: Callable[[Any], bool]) -> None:
    """Every column the model reads is present, and a numeric feature's column is numeric (a
    typed feature's encoding checks the values of the others).

    Raises:
        DataError: a missing or non-numeric column.
    """
    names = model_columns(card)
    missing = [name for name in names if name not in schema_types]
    if missing:
        raise DataError(f"input {source} lacks the model's feature column(s) "
                        f"{', '.join(missing)}; it has {', '.join(schema_types) or 'none'}")
    if takes_raw_columns(card):
        names = [i["name"] for i in card.inputs if i["type"] == "numeric"]
    bad = [f"{n} ({schema_types[n]})" for n in names if not is_numeric(schema_types[n])]
    if bad:
        raise DataError(f"input {source}: feature column(s) {', '.join(bad)} are not numeric")


def batch_matrix(card: Any, columns: Sequence[Any], source: str,
                 first_row: Optional[int] = None) -> np.ndarray:
    """The model's feature matrix of one batch of its :func:`model_columns` (Arrow arrays);
    errors name the table's row where ``first_row`` (the batch's) is known.

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
    """The columns scoring adds (``predicted``, the model's name and version) are not among the
    input's ``columns``.

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
    """The prediction columns of a float32 feature matrix, scored ``CHUNK_ROWS`` at a time."""
    import torch

    from dbspec.models.served import prediction_columns

    with torch.inference_mode():
        out = np.concatenate([model(torch.from_numpy(x[i:i + CHUNK_ROWS])).numpy()
                              for i in range(0, max(len(x), 1), CHUNK_ROWS)])
    return prediction_columns(model.card, out)


def unscorable_rows(x: np.ndarray, columns: dict[str, np.ndarray],
                    names: list[str]) -> Optional[str]:
    """Why some rows of ``x`` scored NaN, or None. Every float column counts: a classifier's NaN
    row shows only in its probabilities (its label is a whole number)."""
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


# the engines import this module: they are imported on first use
_ENGINES = {"predict_local": "dbspec.serving.batch_local",
            "predict_spark": "dbspec.serving.batch_spark"}


def __getattr__(name: str) -> Any:
    if name in _ENGINES:
        return getattr(importlib.import_module(_ENGINES[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
