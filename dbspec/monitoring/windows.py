"""Each window of one pass, compared: drift per column, missing values, out-of-range, quality
against the version's registered metrics where labels are given; and the alerts."""

from __future__ import annotations

from typing import Callable, NamedTuple, Optional

import numpy as np

from dbspec.monitoring.drift import (WindowAccumulator, category_key, compare_column,
                                     latency_quantile, quality_drop)
from dbspec.monitoring.labels import Labels
from dbspec.monitoring.monitor import MonitorSettings, VersionReport, WindowReport, VersionScan


def evaluate_windows(scan: VersionScan, settings: MonitorSettings, *,
                     labels: Optional[Labels] = None,
                     score: Optional[Callable[..., dict[str, float]]] = None,
                     reference_metrics: Optional[dict[str, float]] = None) -> VersionReport:
    """Each window's statistics and alerts.

    Args:
        score: ``score(task, y_true, predictions, names, threshold=...)`` giving metrics by
            name (:func:`dbspec.evaluation.metrics.task_metrics`); with ``labels``.
        reference_metrics: The version's registered test metrics, by bare name (``rmse``).
    """
    profile, thresholds = scan.profile, settings.thresholds
    outputs = set(profile["outputs"])
    reports = []
    for number, (_, window) in enumerate(sorted(scan.windows.items())):
        report = WindowReport(number, window.start, window.start + settings.window_s,
                              window.rows, window.requests, latency_quantile(window.latency, 0.5),
                              latency_quantile(window.latency, 0.95))
        report.columns = [compare_column(c, a, thresholds) for c, a in window.columns.items()]
        report.counts = {c: a.counts.tolist() for c, a in window.columns.items()}
        report.checked = window.rows >= settings.min_rows
        if report.checked:
            for column in report.columns:
                drift = "predictions" if column.column in outputs else "features"
                found = [what for check, what in column.findings
                         if (drift if check == "drift" else check) in settings.checks]
                if found:
                    report.alerts.append(f"{column.column}: {', '.join(found)}")
        if labels is not None and score is not None:
            _quality(report, window, _Labelled(labels, score, reference_metrics or {}),
                     profile, settings)
        reports.append(report)
    return VersionReport(scan.name, scan.version, profile, reports, dict(scan.left_out))


class _Labelled(NamedTuple):
    """What a window's quality is computed from: the labels, the scorer, the registered
    metrics it is compared with."""

    labels: Labels
    score: Callable[..., dict[str, float]]
    reference: dict[str, float]


def _quality(report: WindowReport, window: WindowAccumulator, labelled: _Labelled,
             profile: dict, settings: MonitorSettings) -> None:
    labels, score, reference = labelled
    found, outputs = window.labels()
    report.labelled = len(found)
    if not len(found) or not reference:
        return
    task = profile["task"]
    y_true = labels.values[found]
    if task == "regression":
        y_true, predictions = y_true.astype(np.float64), outputs["prediction"]
    else:
        index = {category_key(c): i for i, c in enumerate(profile["classes"])}
        y_true = np.array([index.get(category_key(v), -1) for v in y_true.tolist()])
        known = y_true >= 0
        y_true = y_true[known]
        if task == "binary":
            predictions = outputs["probability"][known]
        else:
            predictions = np.column_stack([outputs[f"probability_{c}"][known]
                                           for c in profile["classes"]])
    if not len(y_true):
        return
    values = score(task, y_true, predictions, sorted(reference),
                   threshold=profile.get("threshold", 0.5))
    for metric, value in values.items():
        drop = quality_drop(metric, reference[metric], value)
        report.quality[metric] = {"value": value, "reference": reference[metric], "drop": drop}
        if report.labelled >= settings.min_rows and "quality" in settings.checks and \
                np.isfinite(drop) and drop > settings.thresholds.quality_drop:
            report.alerts.append(f"quality: {metric} {value:.4g} vs test {reference[metric]:.4g} "
                                 f"({drop:.0%} worse)")
