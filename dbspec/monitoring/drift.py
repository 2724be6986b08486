"""Drift statistics of a window of served rows against a reference profile, batch by batch.

A :class:`WindowAccumulator` keeps only bin counts (per column a coarse histogram on the
reference's quantile edges for the PSI, a fine one for the KS statistic, category counts for
discrete columns, a log-spaced latency histogram), so memory does not grow with the rows.

A column drifts when its effect is over the threshold (PSI or KS) *and* the difference is
significant (chi-square on the bins, or the KS test): on big windows a p-value alone flags
differences too small to matter, on small ones a statistic alone flags sampling noise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from dbspec.spec.sections.monitoring import ThresholdsSpec
from dbspec.spec.semantics import lower_is_better

#: Bins below this share of rows are floored to it in the PSI (an empty bin is infinite).
PSI_FLOOR = 1e-4
#: Latency bin edges, in ms: 20 per decade from 0.01 ms to 100 s (quantiles within 12%).
LATENCY_EDGES = 10.0 ** np.arange(-2.0, 5.0 + 1e-9, 0.05)
#: When a column or the model counts as drifted: the spec's ``monitoring.thresholds``.
Thresholds = ThresholdsSpec


def psi(reference: np.ndarray, window: np.ndarray) -> float:
    """The population stability index of two count vectors over the same bins:
    ``sum((q - p) * ln(q / p))`` over the bins' shares, floored at :data:`PSI_FLOOR`."""
    p, q = _floored_shares(reference), _floored_shares(window)
    return float(np.sum((q - p) * np.log(q / p)))


def _floored_shares(counts: np.ndarray) -> np.ndarray:
    counts = np.asarray(counts, dtype=np.float64)
    return np.maximum(counts / max(counts.sum(), 1.0), PSI_FLOOR)


def chi_square_p(reference: np.ndarray, window: np.ndarray) -> float:
    """The p-value of a chi-square test that two count vectors come from one distribution
    (bins empty in both are left out); 1.0 when fewer than two bins hold rows."""
    from scipy.stats import chi2_contingency

    table = np.vstack([reference, window]).astype(np.float64)
    table = table[:, table.sum(axis=0) > 0]
    if table.shape[1] < 2 or (table.sum(axis=1) == 0).any():
        return 1.0
    return float(chi2_contingency(table, correction=False).pvalue)


def ks_binned(reference: np.ndarray, window: np.ndarray) -> tuple[float, float]:
    """The two-sample KS statistic from counts on the same fine bins, and its p-value.

    The largest gap between the empirical CDFs at the bin edges: at most the exact statistic,
    short by at most one bin's share. The p-value is :func:`scipy.stats.ks_2samp`'s asymptotic
    one.
    """
    from scipy.stats import kstwo

    n, m = float(reference.sum()), float(window.sum())
    if n == 0 or m == 0:
        return float("nan"), float("nan")
    gap = np.abs(np.cumsum(reference) / n - np.cumsum(window) / m)
    statistic = float(gap.max())
    effective = round(n * m / (n + m))
    return statistic, float(kstwo.sf(statistic, max(effective, 1)))


def latency_quantile(counts: np.ndarray, q: float) -> float:
    """The ``q`` quantile (0-1) of latencies counted in :data:`LATENCY_EDGES` bins: the
    geometric middle of the bin it falls in (bin 0 is below 0.01 ms, the last above 100 s)."""
    total = counts.sum()
    if total == 0:
        return float("nan")
    index = int(np.searchsorted(np.cumsum(counts), q * total, side="left"))
    if index == 0 or index >= len(LATENCY_EDGES):
        return float(LATENCY_EDGES[min(index, len(LATENCY_EDGES) - 1)])
    return float(math.sqrt(LATENCY_EDGES[index - 1] * LATENCY_EDGES[index]))


def category_key(value: Any) -> Any:
    """How a category is matched: numbers by value (1, 1.0 and True are one), others as text."""
    if isinstance(value, (bool, int, float, np.number, np.bool_)):
        return float(value)
    return str(value)


class ColumnAccumulator:
    """Counts of one column in one window, against the bins of its reference profile."""

    def __init__(self, profile: dict[str, Any]):
        self.profile = profile
        self.discrete = profile["kind"] == "discrete"
        self.rows = 0
        self.missing = 0
        if self.discrete:
            self._index = {category_key(v): i for i, v in enumerate(profile["values"])}
            self.counts = np.zeros(len(profile["values"]) + 1, dtype=np.int64)  # last: unseen
        else:
            self._edges = np.asarray(profile["edges"], dtype=np.float64)
            self._fine_edges = np.asarray(profile["fine_edges"], dtype=np.float64)
            self.counts = np.zeros(len(self._edges) + 1, dtype=np.int64)
            self.fine_counts = np.zeros(len(self._fine_edges) + 1, dtype=np.int64)
            self.outside = 0  # values outside the training minimum-maximum
            # the coarse edges are fine edges: each fine bin lies in one coarse bin
            self._coarse_of_fine = np.concatenate(
                [[0], np.searchsorted(self._edges, self._fine_edges, side="right")])
            # a value v is in a bin, or outside, by how many of these it is below: the fine
            # edges, the minimum, and the next float after the maximum (v > max: v >= that)
            self._cuts = np.concatenate([self._fine_edges, [profile["min"], np.nextafter(
                profile["max"], np.inf)]])
            self._cuts32 = float32_cuts(self._cuts)

    def update(self, values: np.ndarray) -> None:
        """Count a batch of the column's values (NaN or None: missing)."""
        self.rows += len(values)
        if self.discrete:
            present = values[~_missing(values)]
            self.missing += len(values) - len(present)
            if len(present):
                found, counts = np.unique(present, return_counts=True)
                for value, count in zip(found.tolist(), counts.tolist()):
                    self.counts[self._index.get(category_key(value), -1)] += count
            return
        # sorted, the bins are where the cuts fall: a SIMD sort is ~15x faster than a binary
        # search per value; float32 values (the server's) are sorted as they are
        single = values.dtype == np.float32
        ordered = np.sort(values if single else np.asarray(values, dtype=np.float64))
        present = len(ordered) - int(np.count_nonzero(np.isnan(ordered)))  # NaN sorts last
        self.missing += len(ordered) - present
        below = np.searchsorted(ordered, self._cuts32 if single else self._cuts, side="left")
        bins = len(self._fine_edges)
        fine = np.diff(below[:bins], prepend=0, append=present)
        self.fine_counts += fine
        self.counts += np.bincount(self._coarse_of_fine, weights=fine,
                                   minlength=len(self.counts)).astype(np.int64)
        self.outside += int(below[bins] + present - below[bins + 1])


def float32_cuts(cuts: np.ndarray) -> np.ndarray:
    """The smallest float32 at or above each float64 cut: for a float32 value ``v``,
    ``v < cut`` exactly when ``v < float32_cuts(cut)``."""
    with np.errstate(over="ignore"):
        rounded = cuts.astype(np.float32)
    return np.where(rounded.astype(np.float64) < cuts,
                    np.nextafter(rounded, np.float32(np.inf)), rounded)


def _missing(values: np.ndarray) -> np.ndarray:
    if values.dtype.kind == "f":
        return np.isnan(values)
    if values.dtype.kind == "O":
        return np.array([v is None or (isinstance(v, float) and v != v) for v in values],
                        dtype=bool)
    return np.zeros(len(values), dtype=bool)


@dataclass
class ColumnDrift:
    """One column's statistics in one window, and why it drifted (``reasons``; empty: not)."""

    column: str
    kind: str
    rows: int
    psi: float
    psi_p: float
    ks: Optional[float] = None
    ks_p: Optional[float] = None
    missing_rate: float = 0.0
    out_of_range_rate: float = 0.0
    #: (check, what): check is ``drift``, ``missing`` or ``out_of_range``
    findings: list[tuple[str, str]] = field(default_factory=list)

    @property
    def drifted(self) -> bool:
        """Whether the distribution moved (PSI or KS); missing and out-of-range are apart."""
        return any(check == "drift" for check, _ in self.findings)

    @property
    def reasons(self) -> list[str]:
        return [what for _, what in self.findings]

    def to_json(self) -> dict[str, Any]:
        out = {k: finite_or_none(v) for k, v in self.__dict__.items() if k != "findings"}
        return {**out, "drifted": self.drifted, "reasons": self.reasons}


def finite_or_none(value: Any) -> Any:
    """``value``, or None for a NaN or infinite float (JSON has neither)."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


def compare_column(name: str, accumulator: ColumnAccumulator,
                   thresholds: Thresholds) -> ColumnDrift:
    """A column's drift statistics in a window against its reference profile."""
    profile = accumulator.profile
    reference = np.asarray(profile["counts"], dtype=np.int64)
    if accumulator.discrete:
        reference = np.append(reference, 0)  # the reference has no unseen category
    window = accumulator.counts
    present = int(window.sum())
    result = ColumnDrift(name, profile["kind"], accumulator.rows, psi(reference, window),
                         chi_square_p(reference, window))
    result.missing_rate = accumulator.missing / accumulator.rows if accumulator.rows else 0.0
    outside = int(window[-1]) if accumulator.discrete else accumulator.outside  # last: unseen
    result.out_of_range_rate = outside / present if present else 0.0
    if not accumulator.discrete:
        fine = np.asarray(profile["fine_counts"], dtype=np.int64)
        result.ks, result.ks_p = ks_binned(fine, accumulator.fine_counts)
    if present:
        if result.psi > thresholds.psi and result.psi_p < thresholds.p_value:
            result.findings.append(("drift", f"PSI {result.psi:.3g}"))
        if result.ks is not None and result.ks_p is not None and result.ks > thresholds.ks \
                and result.ks_p < thresholds.p_value:
            result.findings.append(("drift", f"KS {result.ks:.3g}"))
        if result.out_of_range_rate > thresholds.out_of_range and \
                _outside_p(outside, present, profile, accumulator.discrete) < thresholds.p_value:
            result.findings.append(("out_of_range", f"{result.out_of_range_rate:.1%} " + (
                "unseen" if accumulator.discrete else "out of range")))
    reference_missing = profile["missing"] / max(profile["count"] + profile["missing"], 1)
    if result.missing_rate > reference_missing + thresholds.missing:
        result.findings.append(("missing", f"{result.missing_rate:.1%} missing"))
    return result


def _outside_p(outside: int, rows: int, profile: dict[str, Any], discrete: bool) -> float:
    """How likely ``outside`` of ``rows`` new values fall outside the training range (or its
    categories) when nothing moved. The share outside the range of ``n`` training values is
    Beta(2, n - 1) distributed, so the count is beta-binomial: a binomial test around the mean
    would flag, on every window, the references whose range came out narrow."""
    from scipy.stats import betabinom

    n = profile["count"]
    a = 1 if discrete else 2
    return float(betabinom.sf(outside - 1, rows, a, max(n - a + 1, 1)))


class WindowAccumulator:
    """Rows, requests, latency and a :class:`ColumnAccumulator` per column, of one window."""

    def __init__(self, profile: dict[str, Any], columns: list[str], start: float):
        self.start = start  # the window's first second (UTC epoch seconds)
        self.columns = {name: ColumnAccumulator(profile["columns"][name]) for name in columns}
        self.rows = 0
        self.requests = 0
        self.latency = np.zeros(len(LATENCY_EDGES) + 1, dtype=np.int64)
        self.labelled: list[tuple[np.ndarray, dict[str, np.ndarray]]] = []

    def update(self, columns: dict[str, np.ndarray], request_latencies: np.ndarray) -> None:
        """Count a batch: its column values and the latency of each request starting in it."""
        self.rows += len(next(iter(columns.values()))) if columns else 0
        for name, accumulator in self.columns.items():
            accumulator.update(columns[name])
        self.requests += len(request_latencies)
        self.latency += np.bincount(np.searchsorted(LATENCY_EDGES, request_latencies,
                                                    side="right"),
                                    minlength=len(self.latency))

    def add_labels(self, y_true: np.ndarray, outputs: dict[str, np.ndarray]) -> None:
        """Keep labelled rows for the window's quality metrics (labels are few next to rows)."""
        if len(y_true):
            self.labelled.append((y_true, outputs))

    def labels(self) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """The labelled rows kept so far: (labels, output columns)."""
        if not self.labelled:
            return np.empty(0), {}
        y = np.concatenate([y for y, _ in self.labelled])
        names = self.labelled[0][1].keys()
        return y, {k: np.concatenate([o[k] for _, o in self.labelled]) for k in names}


def quality_drop(metric: str, reference: float, value: float) -> float:
    """How much worse ``value`` is than ``reference``, as a share of ``|reference|`` (negative:
    better)."""
    if not (math.isfinite(reference) and math.isfinite(value)) or reference == 0:
        return float("nan")
    change = (value - reference) if lower_is_better(metric) else (reference - value)
    return change / abs(reference)
