"""The reference profile of a model version: its training data and its predictions, binned.

Written at evaluate time from the training split and logged with the training run as
:data:`ARTIFACT_PATH`, so ``dbspec monitor`` compares served rows with what the model learned
from. A numeric column keeps quantile edges (coarse for the PSI, fine for the KS statistic),
the counts between them, missing count, minimum and maximum; a column with few distinct
values keeps one count per value.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import numpy as np

FORMAT_VERSION = 1
#: Where the profile sits among the training run's artifacts.
ARTIFACT_PATH = "monitoring/reference_profile.json"
#: A column with at most this many distinct values is profiled as categories.
MAX_CATEGORIES = 10
COARSE_BINS = 10
FINE_BINS = 100


def profile_column(values: np.ndarray, *, coarse_bins: int = COARSE_BINS,
                   fine_bins: int = FINE_BINS,
                   max_categories: int = MAX_CATEGORIES) -> dict[str, Any]:
    """One column's profile; NaN and None count as missing.

    Edges are the inner edges of equal-count bins (ties merged), halfway between two training
    values: bin ``i`` holds ``[edges[i-1], edges[i])``; the first and last are open-ended.
    """
    values = np.asarray(values)
    if values.dtype.kind in "fiub":
        numbers = values.astype(np.float64)
        present = numbers[~np.isnan(numbers)]
    else:
        present = np.asarray([v for v in values.tolist() if v is not None], dtype=object)
    missing = len(values) - len(present)
    found, counts = np.unique(present, return_counts=True) if len(present) else \
        (np.array([], dtype=object), np.array([], dtype=np.int64))
    numeric = present.dtype.kind == "f"
    if not numeric or len(found) <= max_categories:
        return {"kind": "discrete", "count": int(len(present)), "missing": int(missing),
                "values": [_plain(v) for v in found],
                "counts": [int(c) for c in counts]}
    # the coarse edges are fine edges too: a scan finds both bins with one search
    quantiles = _between_values(np.quantile(present, np.linspace(0, 1, fine_bins + 1)[1:-1]),
                                found)
    step = max(fine_bins // coarse_bins, 1)
    edges = np.unique(quantiles[step - 1::step][:coarse_bins - 1])
    fine = np.unique(quantiles)
    return {"kind": "numeric", "count": int(len(present)), "missing": int(missing),
            "min": float(present.min()), "max": float(present.max()),
            "mean": float(present.mean()), "std": float(present.std()),
            "edges": edges.tolist(), "counts": _bin_counts(present, edges),
            "fine_edges": fine.tolist(), "fine_counts": _bin_counts(present, fine)}


def _between_values(quantiles: np.ndarray, distinct: np.ndarray) -> np.ndarray:
    """Each edge moved halfway into the gap below the first training value at or above it:
    the training counts stay the same, and no edge sits on a tied value, where the slightest
    difference in served values (a rounding) would move its whole mass and read as drift."""
    distinct = np.asarray(distinct, dtype=np.float64)
    above = np.searchsorted(distinct, quantiles, side="left")  # first value >= the edge
    inside = (above > 0) & (above < len(distinct))
    moved = quantiles.copy()
    moved[inside] = (distinct[above[inside] - 1] + distinct[above[inside]]) / 2
    if len(distinct) > 1:  # an edge on the minimum (tied there): half a gap below it
        moved[above == 0] = distinct[0] - (distinct[1] - distinct[0]) / 2
    return moved


def build_profile(features: dict[str, np.ndarray], outputs: dict[str, np.ndarray], *,
                  task: str, classes: Optional[list[Any]] = None,
                  threshold: float = 0.5) -> dict[str, Any]:
    """The reference profile of a model version.

    Args:
        features: The training split's feature columns, raw (as requests send them).
        outputs: The served model's prediction columns on those rows, as the inference table
            stores them (``prediction``, ``probability``, ``probability_<class>``).
        task: ``regression``, ``binary`` or ``multiclass``.
        classes: A classifier's class labels, in the model's order.
        threshold: A binary classifier's decision threshold.
    """
    columns = {name: profile_column(values) for name, values in features.items()}
    for name, values in outputs.items():
        labels = name == "prediction" and task != "regression"  # class labels: categories
        columns[name] = profile_column(values, max_categories=len(values) + 1 if labels
                                       else MAX_CATEGORIES)
    rows = len(next(iter(features.values()))) if features else 0
    return {"format_version": FORMAT_VERSION, "task": task, "rows": int(rows),
            "classes": None if classes is None else [_plain(c) for c in classes],
            "threshold": float(threshold), "features": list(features),
            "outputs": list(outputs), "columns": columns}


def _plain(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


def _bin_counts(values: np.ndarray, edges: np.ndarray) -> list[int]:
    return np.bincount(np.searchsorted(edges, values, side="right"),
                       minlength=len(edges) + 1).tolist()


def write_profile(profile: dict[str, Any], path: Path) -> Path:
    """Write ``profile`` as JSON; returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(profile, indent=1))
    return path


def check_profile(profile: Any) -> dict[str, Any]:
    """``profile`` when it is a reference profile this dbspec reads, else ValueError."""
    if not isinstance(profile, dict) or "columns" not in profile or "features" not in profile:
        raise ValueError("not a dbspec reference profile")
    if profile.get("format_version", 0) > FORMAT_VERSION:
        raise ValueError(f"reference profile format {profile['format_version']} is newer than "
                         f"this dbspec reads ({FORMAT_VERSION}): upgrade dbspec")
    return profile
