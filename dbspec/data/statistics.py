"""Preprocessing fitted on a streamed training split, in one pass over its shards.

The pass sums each feature's count, sum, sum of squares, minimum and maximum (float64), keeps
the training targets (one float32 column, for the target scale) and gathers a uniform sample
of ``data.streaming.sample_rows`` rows. The steps are fitted on the sample with the in-memory
code (:func:`dbspec.data.prepare.fit_preprocessing`), then every statistic that the sums give
exactly replaces the sample's estimate: an impute's mean, a standard or min-max scale's centre
and scale, for as long as no clip (which the sums cannot follow) came before on that column.
Medians, quantile clips and robust scales stay sample estimates. When the split has no more
rows than the sample, the sample is the split and every statistic is exact, as in memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from dbspec.data.prepare import FittedStep, Table, fit_preprocessing
from dbspec.data.shards import ShardSet, read_shard
from dbspec.data.sources import DataError
from dbspec.spec.sections.data import DataSpec


@dataclass
class Moments:
    """Per-column sums over the present values of the ``n`` training rows; carried through
    the preprocessing steps by :func:`_exact_moments`."""

    n: float
    count: np.ndarray
    s1: np.ndarray
    s2: np.ndarray
    low: np.ndarray
    high: np.ndarray
    exact: np.ndarray  # whether a column's values are still known exactly from the sums


@dataclass
class StreamedStats:
    """What the pass found: the fitted steps and what the model card needs."""

    fitted: list[FittedStep]
    target_mean: float
    target_std: float
    ranges: dict[str, list[Optional[float]]]
    sampled_rows: int
    exact: bool

    def to_json(self) -> dict[str, Any]:
        return {"target_mean": self.target_mean, "target_std": self.target_std,
                "ranges": self.ranges, "sampled_rows": self.sampled_rows, "exact": self.exact}


def fit_streamed(data: DataSpec, shard_set: ShardSet) -> StreamedStats:
    """One pass over the training shards: moments, targets and the sample; then the steps.

    Raises:
        DataError: missing values a step cannot take, unknown columns (as in memory).
    """
    names = shard_set.feature_names
    width = len(names)
    total = shard_set.rows("train")
    if total == 0:
        raise DataError("data.split: the training split is empty")
    wanted = data.streaming.sample_rows
    chosen = np.arange(total) if total <= wanted else \
        np.sort(np.random.default_rng(data.split.seed).choice(total, wanted, replace=False))
    moments = Moments(float(total), np.zeros(width), np.zeros(width), np.zeros(width),
                      np.full(width, np.inf), np.full(width, -np.inf), np.ones(width, dtype=bool))
    sample, targets, offset = [], [], 0
    for path, count in shard_set.shards("train"):
        x, y, _ = read_shard(path, width)
        _accumulate(moments, x)
        if data.task == "regression":
            targets.append(np.asarray(y, dtype=np.float32))
        low, high = np.searchsorted(chosen, [offset, offset + count])
        if high > low:
            sample.append(np.array(x[chosen[low:high] - offset]))
        offset += count
    x_sample = np.concatenate(sample)
    missing = _missing_anywhere(shard_set)
    _check_complete(data, names, set(shard_set.index["nan_columns"]["train"]))
    sample_table = Table(x_sample, np.zeros(len(x_sample), dtype=np.float32), names)
    fitted = fit_preprocessing(data, sample_table, np.arange(len(x_sample)), missing=missing)
    ranges = {"low": _finite(moments.low), "high": _finite(moments.high)}
    exact = len(x_sample) == total
    if not exact:
        _exact_moments(data, fitted, moments)
    mean, std = _target_scale(data.task, targets)
    return StreamedStats(fitted, mean, std, ranges, len(x_sample), exact)


def _accumulate(moments: Moments, x: np.ndarray) -> None:
    values = x.astype(np.float64)
    moments.count += (~np.isnan(values)).sum(axis=0)
    moments.s1 += np.nansum(values, axis=0)
    moments.s2 += np.nansum(values * values, axis=0)
    moments.low = np.fmin(moments.low, np.fmin.reduce(values, axis=0))  # fmin skips NaN
    moments.high = np.fmax(moments.high, np.fmax.reduce(values, axis=0))


def _missing_anywhere(shard_set: ShardSet) -> np.ndarray:
    missing = set().union(*(set(columns) for columns in shard_set.index["nan_columns"].values()))
    return np.array([name in missing for name in shard_set.feature_names])


def _check_complete(data: DataSpec, names: list[str], train_missing: set) -> None:
    """A step other than impute on a column with missing training values fails, as in memory
    (the sample alone may not hold a missing value)."""
    from dbspec.data.prepare import _columns

    imputed: set = set()
    for index, step in enumerate(data.preprocessing):
        where = f"data.preprocessing.{index}.{step.key}"
        columns = {names[c] for c in _columns(step.args.columns, names, where)}
        if step.key == "impute":
            imputed |= columns
            continue
        bad = sorted(columns & (train_missing - imputed), key=names.index)
        if bad:
            raise DataError(f"{where}: missing values in {', '.join(bad[:8])}; put an impute "
                            "step before it")


def _exact_moments(data: DataSpec, fitted: list[FittedStep], sums: Moments) -> None:
    """Replace sample estimates by exact values where the sums give them (module docstring).

    The sums are carried through the steps in order, each step's kind updating them as its
    transform would (``_EXACT`` holds one function per fitted-step kind).
    """
    for step, spec_step in zip(fitted, data.preprocessing):
        _EXACT[step.kind](sums, step, spec_step, np.array(step.columns, dtype=np.int64))


def _exact_impute(r: Moments, step: FittedStep, spec_step: Any, cols: np.ndarray) -> None:
    fill = np.array(step.params["fill"], dtype=np.float64)
    if spec_step.args.strategy == "mean":
        mean = np.where(r.count[cols] > 0, r.s1[cols] / np.maximum(r.count[cols], 1), 0.0)
        fill = np.where(r.exact[cols], mean, fill)
        step.params["fill"] = fill.tolist()
    gap = r.n - r.count[cols]
    r.s1[cols] += fill * gap
    r.s2[cols] += fill * fill * gap
    r.low[cols] = np.where(gap > 0, np.fmin(r.low[cols], fill), r.low[cols])
    r.high[cols] = np.where(gap > 0, np.fmax(r.high[cols], fill), r.high[cols])
    r.count[cols] = r.n


def _exact_clip(r: Moments, step: FittedStep, spec_step: Any, cols: np.ndarray) -> None:
    r.exact[cols] = False  # clipping moves values by amounts the sums cannot tell


def _exact_scale(r: Moments, step: FittedStep, spec_step: Any, cols: np.ndarray) -> None:
    n = r.n
    center = np.array(step.params["center"], dtype=np.float64)
    scale = np.array(step.params["scale"], dtype=np.float64)
    if spec_step.key in ("standard_scale", "minmax_scale"):
        if spec_step.key == "standard_scale":
            mean = r.s1[cols] / n
            deviation = np.sqrt(np.maximum(r.s2[cols] / n - mean * mean, 0.0))
            new_center, new_scale = mean, deviation
        else:
            new_center, new_scale = r.low[cols], r.high[cols] - r.low[cols]
        new_scale = np.where(new_scale > 0, new_scale, 1.0)
        center = np.where(r.exact[cols], new_center, center)
        scale = np.where(r.exact[cols], new_scale, scale)
        step.params.update(center=center.tolist(), scale=scale.tolist())
    s1_old = r.s1[cols]
    r.s1[cols] = (s1_old - n * center) / scale
    r.s2[cols] = (r.s2[cols] - 2 * center * s1_old + n * center * center) / (scale * scale)
    r.low[cols] = (r.low[cols] - center) / scale
    r.high[cols] = (r.high[cols] - center) / scale


#: How each kind of fitted step (data.prepare.FittedStep.kind) moves the running sums.
_EXACT = {"impute": _exact_impute, "clip": _exact_clip, "scale": _exact_scale}


def _target_scale(task: str, targets: list[np.ndarray]) -> tuple[float, float]:
    """As the in-memory path: regression targets standardised on the training split."""
    if task != "regression" or not targets:
        return 0.0, 1.0
    y = np.concatenate(targets)
    std = float(y.std())
    return float(y.mean()), std if std > 0 else 1.0


def _finite(values: np.ndarray) -> list[Optional[float]]:
    return [float(v) if np.isfinite(v) else None for v in values]
