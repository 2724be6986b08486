"""From a source frame to checked, split, numeric arrays and fitted preprocessing.

Features and target are checked here (columns exist, numeric, finite), class labels are encoded,
rows are split reproducibly (stratified for classification) and preprocessing statistics are
fitted on the training split only. Applying them is the model's job (``dbspec.models``), so
the logged model takes raw rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from dbspec.data.sources import DataError
from dbspec.errors import did_you_mean
from dbspec.spec.sections.data import DataSpec


@dataclass
class Table:
    """Feature matrix and target of the usable rows, before splitting."""

    features: np.ndarray  # float32, (rows, features)
    target: np.ndarray  # float32 for regression, int64 class index otherwise
    feature_names: list[str]
    classes: Optional[list[Any]] = None  # original labels, index = encoded class
    #: With typed features: the fitted inputs (``dbspec.models.encoding``) that encoded
    #: ``features``, whose columns ``feature_names`` then names; None when all are numeric
    inputs: Optional[list[dict[str, Any]]] = None


@dataclass
class Splits:
    """Row indices of each split into the :class:`Table`."""

    train: np.ndarray
    validation: np.ndarray
    test: np.ndarray


@dataclass
class FittedStep:
    """One preprocessing step with the statistics fitted on the training split."""

    kind: str  # impute | clip | scale
    columns: list[int]
    params: dict[str, list[float]] = field(default_factory=dict)


def build_table(frame, data: DataSpec) -> Table:
    """Select and check features and target; encode class labels.

    Raises:
        DataError: a missing column, non-numeric features, infinite values, missing targets,
            or a class count that does not fit.
    """
    columns = [str(c) for c in frame.columns]
    frame = frame.rename(columns={c: str(c) for c in frame.columns})
    require_target(columns, data)
    features = data.feature_names or [c for c in columns if c != data.target]
    require_features(features, columns)
    non_numeric = [f"{c} ({dtype})" for c, dtype in frame[features].dtypes.items()
                   if not _is_numeric(dtype)]
    if non_numeric:
        raise DataError(f"data.features: non-numeric columns {', '.join(non_numeric[:8])}; "
                        "declare their type in data.features (e.g. '- {name: city, type: "
                        "categorical}', or text, sequence, image) or leave them out")
    x = frame[features].to_numpy(dtype=np.float32, na_value=np.nan)
    _check_finite(x, features)
    y, classes = _target(frame, data)
    return Table(x, y, list(features), classes)


def build_typed_table(frame, data: DataSpec, features: list) -> tuple[Table, Any]:
    """A :class:`Table` with the target and feature names of a spec with typed features, but
    no feature matrix (``preprocess`` encodes the features once their vocabularies are fitted
    on the training split); and the raw feature columns as a frame.

    Raises:
        DataError: as :func:`build_table`, for the target and infinite numeric values.
    """
    frame = frame.rename(columns={c: str(c) for c in frame.columns})
    require_target(list(frame.columns), data)
    names = [f.name for f in features]
    numeric = [f.name for f in features if f.type == "numeric"]
    if numeric:
        _check_finite(frame[numeric].to_numpy(dtype=np.float32, na_value=np.nan), numeric)
    y, classes = _target(frame, data)
    table = Table(np.zeros((len(frame), 0), dtype=np.float32), y, names, classes)
    return table, frame[names].reset_index(drop=True)


def require_target(columns: list[str], data: DataSpec) -> None:
    if data.target not in columns:
        raise DataError(f"data.target: no column '{data.target}'{did_you_mean(data.target, columns)}"
                        f"; the data has: {_listing(columns)}")


def _check_finite(x: np.ndarray, features: list[str]) -> None:
    inf_columns = [features[j] for j in np.flatnonzero(np.isinf(x).any(axis=0))]
    if inf_columns:
        raise DataError(f"data: infinite values in {', '.join(inf_columns[:8])}")


def _target(frame, data: DataSpec) -> tuple[np.ndarray, Optional[list[Any]]]:
    """The target column, checked: floats for regression, class indices and labels else."""
    y_raw = frame[data.target]
    if y_raw.isna().any():
        raise DataError(f"data.target: {int(y_raw.isna().sum())} rows have no target value")
    if data.task == "regression":
        if not _is_numeric(y_raw.dtype):
            raise DataError(f"data.target: a regression target must be numeric, "
                            f"'{data.target}' is {y_raw.dtype}")
        y = y_raw.to_numpy(dtype=np.float32)
        if not np.isfinite(y).all():
            raise DataError("data.target: infinite target values")
        return y, None
    classes, y = np.unique(y_raw.to_numpy(), return_inverse=True)
    return y.astype(np.int64), check_classes([_plain(c) for c in classes], data)


def check_classes(classes: list[Any], data: DataSpec) -> list[Any]:
    """``classes`` (the target's distinct labels, sorted), when they fit the task.

    Raises:
        DataError: a binary task without exactly 2 classes, or a single class.
    """
    if data.task == "binary" and len(classes) != 2:
        raise DataError(f"data.task: binary needs exactly 2 target classes, found {len(classes)}"
                        f" ({_listing([str(c) for c in classes])})")
    if len(classes) < 2:
        raise DataError("data.target: only one class present")
    return classes


def _is_numeric(dtype) -> bool:
    """Booleans, integers and reals (pandas' nullable ones too); not complex numbers."""
    from pandas.api.types import is_complex_dtype, is_numeric_dtype

    return is_numeric_dtype(dtype) and not is_complex_dtype(dtype)


def _plain(value: Any) -> Any:
    """A label as a plain JSON value: numpy scalars as Python numbers, decimals as floats."""
    from decimal import Decimal

    if isinstance(value, Decimal):
        return float(value)
    return value.item() if hasattr(value, "item") else value


def require_features(features: list[str], columns: list[str]) -> None:
    """The feature columns exist in ``columns``, and there is at least one.

    Raises:
        DataError: a missing column, or none left.
    """
    present = set(columns)  # not the list: 100,000 columns made this minutes long
    missing = [c for c in features if c not in present]
    if missing:
        raise DataError(f"data.features: no column {missing[0]!r}"
                        f"{did_you_mean(missing[0], columns)}; the data has: {_listing(columns)}")
    if not features:
        raise DataError("data.features: the data has no column besides the target")


def _listing(names: list[str]) -> str:
    return ", ".join(names[:20]) + (f", ... ({len(names)} in all)" if len(names) > 20 else "")


def split_rows(table: Table, data: DataSpec, *, limit: Optional[int] = None) -> Splits:
    """Reproducible train/validation/test indices, stratified for classification.

    Args:
        limit: keep only this many rows (stratified), for smoke runs.
    """
    split = data.split
    indices = np.arange(len(table.target))
    stratify_on = split.stratify if split.stratify is not None else data.task != "regression"
    labels = table.target if stratify_on else None
    if limit is not None and limit < len(indices):
        indices, _ = _split(indices, labels, limit, split.seed)
        labels = table.target[indices] if stratify_on else None
    holdout = split.validation + split.test
    if holdout == 0:
        return Splits(indices, indices[:0], indices[:0])
    train, rest = _split(indices, labels, 1 - holdout, split.seed)
    rest_labels = table.target[rest] if stratify_on else None
    if split.test == 0:
        return Splits(train, rest, rest[:0])
    if split.validation == 0:
        return Splits(train, rest[:0], rest)
    validation, test = _split(rest, rest_labels, split.validation / holdout, split.seed)
    return Splits(train, validation, test)


def _split(indices, labels, train_fraction, seed):
    from sklearn.model_selection import train_test_split

    size = train_fraction if isinstance(train_fraction, float) else int(train_fraction)
    try:
        return train_test_split(indices, train_size=size, random_state=seed, stratify=labels)
    except ValueError as exc:
        if labels is None:
            raise DataError(f"data.split: {exc}") from None
        # too few rows of some class to stratify (tiny data or smoke runs): split plainly
        return train_test_split(indices, train_size=size, random_state=seed)


def fit_preprocessing(data: DataSpec, table: Table, train: np.ndarray, *,
                      missing: Optional[np.ndarray] = None,
                      numeric: Optional[list[int]] = None) -> list[FittedStep]:
    """Fit each step on the training rows, in order, each on the previous step's output.

    Args:
        missing: Per feature, whether any row of any split lacks a value (the streamed path
            knows it from the conversion; by default the table's rows are looked at).
        numeric: The matrix columns of numeric features when the table also holds encoded
            typed features (token ids, pixels); steps apply to those columns only. Default:
            every column.

    Raises:
        DataError: unknown columns, or missing values with no impute step to fill them.
    """
    if numeric is not None:
        return _fit_numeric_part(data, table, train, numeric)
    x = table.features[train].astype(np.float64)
    names = table.feature_names
    fitted: list[FittedStep] = []
    imputed: set[int] = set()
    for index, step in enumerate(data.preprocessing):
        args = step.args
        where = f"data.preprocessing.{index}.{step.key}"
        cols = _columns(args.columns, names, where)
        part = x[:, cols]
        if step.key == "impute":
            fill = (np.nanmean(part, axis=0) if args.strategy == "mean" else
                    np.nanmedian(part, axis=0) if args.strategy == "median" else
                    np.full(len(cols), args.fill_value))
            fill = np.where(np.isnan(fill), 0.0, fill)  # an all-missing column fills with 0
            fitted.append(FittedStep("impute", cols, {"fill": fill.tolist()}))
            imputed.update(cols)
            x[:, cols] = np.where(np.isnan(part), fill, part)
            continue
        _require_complete(part, [names[c] for c in cols], where)
        if step.key == "clip":
            low = np.quantile(part, args.lower_quantile, axis=0)
            high = np.quantile(part, args.upper_quantile, axis=0)
            fitted.append(FittedStep("clip", cols, {"low": low.tolist(), "high": high.tolist()}))
            x[:, cols] = np.clip(part, low, high)
            continue
        center, scale = _scale_stats(step.key, part)
        fitted.append(FittedStep("scale", cols, {"center": center.tolist(),
                                                 "scale": scale.tolist()}))
        x[:, cols] = (part - center) / scale
    everywhere = np.isnan(table.features).any(axis=0) if missing is None \
        else missing  # validation and test rows too
    unfilled = [names[j] for j in np.flatnonzero(np.isnan(x).any(axis=0) | everywhere)
                if j not in imputed]
    if unfilled:
        raise DataError(f"data: missing values in {', '.join(unfilled[:8])}; add "
                        "'- impute: {strategy: median}' to data.preprocessing")
    return fitted


def _fit_numeric_part(data: DataSpec, table: Table, train: np.ndarray,
                      numeric: list[int]) -> list[FittedStep]:
    """:func:`fit_preprocessing` on the numeric columns of a table with typed features; the
    fitted steps index the whole matrix."""
    names = [table.feature_names[j] for j in numeric]  # steps naming a typed feature are
    # refused by validate (semantics._check_typed); others are checked by fit_preprocessing
    if not numeric:
        if data.preprocessing:
            raise DataError("data.preprocessing: there is no numeric feature to preprocess")
        return []
    part = Table(table.features[:, numeric], table.target, names, table.classes)
    fitted = fit_preprocessing(data, part, train)
    return [FittedStep(step.kind, [numeric[c] for c in step.columns], step.params)
            for step in fitted]


def _require_complete(part: np.ndarray, names: list[str], where: str) -> None:
    bad = [names[j] for j in np.flatnonzero(np.isnan(part).any(axis=0))]
    if bad:
        raise DataError(f"{where}: missing values in {', '.join(bad[:8])}; put an impute step "
                        "before it")


def _scale_stats(kind: str, part: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if kind == "standard_scale":
        center, scale = part.mean(axis=0), part.std(axis=0)
    elif kind == "minmax_scale":
        center, scale = part.min(axis=0), part.max(axis=0) - part.min(axis=0)
    else:
        q1, median, q3 = np.quantile(part, [0.25, 0.5, 0.75], axis=0)
        center, scale = median, q3 - q1
    return center, np.where(scale > 0, scale, 1.0)  # constant columns are left unscaled


def _columns(selection, names: list[str], where: str) -> list[int]:
    if selection == "all":
        return list(range(len(names)))
    position = {name: index for index, name in enumerate(names)}
    for name in selection:
        if name not in position:
            raise DataError(f"{where}: no feature '{name}'{did_you_mean(name, names)}; "
                            f"features: {_listing(names)}")
    return [position[name] for name in selection]
