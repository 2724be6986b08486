"""What a model accepts: its feature columns by name or by position, within its training range.

:func:`feature_matrix` takes a DataFrame holding every feature by name (any order, other columns
ignored), or positional input of exactly the model's width (an array, rows, or columns 0..n-1 as
``pd.DataFrame(X)`` or a Spark struct of one makes).

A value is *out of range* (:class:`FeatureRanges`) beyond ``tolerance`` times the feature's
training span (``feature_ranges`` in the model card) below its minimum or above its maximum:
input in the wrong units gets a confident, wrong answer; drift inside the band is for
monitoring. A feature constant in training is flagged beyond ``tolerance`` times its magnitude
(at least 1); NaN is never flagged (imputation's job). NumPy only, for ``dbspec serve``.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np

from dbspec.errors import DbspecError

DEFAULT_TOLERANCE = 0.5
#: What to tell a user whose rows are out of range: the usual cause
RAW_FEATURES = ("The model takes raw features, in the units it was trained on: it scales them "
                "itself, so features scaled before sending are scaled twice.")
_SHOWN = 5  # rows named in one message; the rest are counted


class InputError(DbspecError, ValueError):
    """Input a model cannot score: wrong columns or wrong width."""


def feature_matrix(names: Sequence[str], features: Any) -> np.ndarray:
    """``features`` as a writable float32 matrix with the model's columns in training order.

    Raises:
        InputError: named columns that miss a feature, or positional input of another width.
    """
    names = list(names)
    try:
        import pandas as pd
    except ImportError:  # the serve extra (dbspec serve) has no pandas
        pd = None
    frame = pd is not None and isinstance(features, pd.DataFrame)
    if frame:
        features = _columns_in_order(names, features)
    try:
        if frame:
            # to_numpy, not np.array(frame): that probes the frame for array attributes through
            # pandas' __getattr__, several times the cost of the copy (MLflow's scoring server
            # hands every request over as a frame); copy=True: pandas 3 views are read-only
            x = features.to_numpy(dtype=np.float32, copy=True)
        else:
            x = np.array(features, dtype=np.float32)  # a copy, writable
    except (TypeError, ValueError) as exc:
        raise InputError(f"the input is not a table of numbers: {exc}") from None
    if x.ndim == 1 and len(names) == 1:
        x = x.reshape(-1, 1)
    if x.ndim != 2 or x.shape[1] != len(names):
        got = x.shape[1] if x.ndim == 2 else f"an array of shape {x.shape} instead of"
        raise InputError(f"the input has {got} columns; the model takes {len(names)} "
                         f"({_listing(names)}), by name or in that order")
    return x


def _columns_in_order(names: list[str], frame: Any) -> Any:
    """``frame`` with the model's columns in training order, or as it is when it is positional.

    Raises:
        InputError: neither every feature by name nor unnamed columns.
    """
    columns = list(frame.columns)
    if columns == names:
        return frame
    present = set(columns)
    if all(name in present for name in names):
        return frame[names]
    if all(str(column) == str(i) for i, column in enumerate(columns)):
        return frame  # the labels of unnamed data: 0..n-1, as int or str
    missing = [name for name in names if name not in present]
    unknown = [str(c) for c in columns if c not in set(names)]
    raise InputError(
        f"the input has no column {_listing(missing)}"
        + (f" and has columns the model does not know ({_listing(unknown)})" if unknown else "")
        + f": send the {len(names)} columns {_listing(names)} by name, or "
          f"{len(names)} unnamed values per row in that order")


def _listing(names: Sequence[str], most: int = 12) -> str:
    shown = ", ".join(str(n) for n in names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def training_ranges(features: np.ndarray) -> dict[str, list[float]]:
    """``{"low": [...], "high": [...]}``, per column of the training rows (NaN ignored)."""
    x = np.asarray(features, dtype=np.float64)
    if x.size == 0:
        return {"low": [], "high": []}
    with warnings.catch_warnings():  # an all-NaN column has no range: it is never flagged
        warnings.simplefilter("ignore", RuntimeWarning)
        low, high = np.nanmin(x, axis=0), np.nanmax(x, axis=0)
    return {"low": [_plain(v) for v in low], "high": [_plain(v) for v in high]}


def _plain(value: float) -> Optional[float]:
    return None if not np.isfinite(value) else float(value)


@dataclass(frozen=True)
class Outside:
    """The out-of-range cells of one batch of rows."""

    mask: np.ndarray  # bool, (rows, features)
    names: Sequence[str]
    ranges: "FeatureRanges"

    @property
    def rows(self) -> np.ndarray:
        """Indices of the rows with at least one out-of-range value."""
        return np.flatnonzero(self.mask.any(axis=1))

    def __bool__(self) -> bool:
        return bool(self.mask.any())

    def counts(self) -> dict[str, int]:
        """Out-of-range rows per feature, for features with any."""
        per = self.mask.sum(axis=0)
        return {self.names[j]: int(per[j]) for j in np.flatnonzero(per)}

    def messages(self, x: np.ndarray, *, offset: int = 0, limit: int = _SHOWN) -> list[str]:
        """One line per flagged row (the first ``limit``), then a count of the rest."""
        rows = self.rows
        lines = []
        for i in rows[:limit]:
            parts = []
            for j in np.flatnonzero(self.mask[i]):
                low, high = self.ranges.low[j], self.ranges.high[j]
                parts.append(f"{self.names[j]}={_short(x[i, j])} (trained on "
                             f"{_short(low)}..{_short(high)})")
            lines.append(f"row {offset + int(i)}: " + ", ".join(parts))
        if len(rows) > limit:
            lines.append(f"and {len(rows) - limit} more row(s)")
        return lines


def _short(value: float) -> str:
    return f"{float(value):.4g}"


class FeatureRanges:
    """The training ranges of a model's features; :meth:`outside` flags a batch of rows."""

    def __init__(self, names: Sequence[str], low: Sequence[Optional[float]],
                 high: Sequence[Optional[float]], tolerance: float = DEFAULT_TOLERANCE):
        if not (len(names) == len(low) == len(high)):
            raise ValueError(f"feature ranges for {len(low)}/{len(high)} features, the model has "
                             f"{len(names)}")
        if not tolerance >= 0:
            raise ValueError(f"tolerance must be 0 or more, not {tolerance}")
        self.names = list(names)
        self.low = np.array([np.nan if v is None else v for v in low], dtype=np.float64)
        self.high = np.array([np.nan if v is None else v for v in high], dtype=np.float64)
        self.tolerance = float(tolerance)
        span = self.high - self.low
        flat = np.maximum(np.abs(self.low), 1.0)
        margin = self.tolerance * np.where(span > 0, span, flat)
        # NaN bounds (a feature with no finite training value) compare False: never flagged
        self._below = self.low - margin
        self._above = self.high + margin

    @classmethod
    def of_card(cls, card: Any, tolerance: float = DEFAULT_TOLERANCE) -> Optional["FeatureRanges"]:
        """The ranges recorded in a model card; ``None`` for a model logged before they were."""
        recorded = getattr(card, "feature_ranges", None)
        if not recorded:
            return None
        return cls(card.feature_names, recorded["low"], recorded["high"], tolerance)

    def outside(self, x: np.ndarray) -> Outside:
        """Which cells of ``x`` (rows, features) lie beyond the tolerated range."""
        with np.errstate(invalid="ignore"):
            mask = (x < self._below) | (x > self._above)
        return Outside(mask, self.names, self)
