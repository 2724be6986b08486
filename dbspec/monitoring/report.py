"""What a monitoring pass shows and records: the text table, the JSON report, the drift table
file, the per-window metrics of its MLflow run, and its plots."""

from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np

from dbspec.monitoring.layout import left_out_text
from dbspec.monitoring.monitor import VersionReport, WindowReport, iso_utc


def render_version(report: VersionReport, *, table: str, window: str) -> str:
    """The windows of one version, then the columns of its last checked window."""
    lines = [f"{report.name} v{report.version} in {table} (windows of {window})",
             f"  {'window start':<21}{'rows':>9}{'requests':>10}{'p50 ms':>9}{'p95 ms':>9}"
             "  status"]
    for w in report.windows:
        lines.append(f"  {iso_utc(w.start):<21}{w.rows:>9,}{w.requests:>10,}"
                     f"{_number(w.latency_p50_ms):>9}{_number(w.latency_p95_ms):>9}  {w.status}")
    if report.left_out:
        lines.append(f"  {left_out_text(report.left_out)}")
    shown = _shown_window(report)
    if shown is not None:
        lines.append(f"  columns of the window from {iso_utc(shown.start)}:")
        lines.append(f"    {'column':<16}{'PSI':>8}{'KS':>8}{'missing':>9}{'outside':>9}  status")
        for column in shown.columns:
            status = ("drifted: " if column.drifted else "") + ", ".join(column.reasons) \
                if column.findings else "ok"
            lines.append(f"    {column.column:<16}{_number(column.psi):>8}"
                         f"{_number(column.ks):>8}{column.missing_rate:>9.1%}"
                         f"{column.out_of_range_rate:>9.1%}  {status}")
        for metric, quality in shown.quality.items():
            lines.append(f"    quality {metric}: {_number(quality['value'])} (test "
                         f"{_number(quality['reference'])}, {shown.labelled:,} labelled rows)")
    return "\n".join(lines)


def _shown_window(report: VersionReport):
    """The last window that alerted, else the last checked one, else the last one."""
    for wanted in (lambda w: w.alerts, lambda w: w.checked, lambda w: True):
        found = [w for w in report.windows if wanted(w)]
        if found:
            return found[-1]
    return None


def _number(value: Any) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"


def report_json(report: VersionReport, **extra: Any) -> dict[str, Any]:
    """The version's report as JSON-ready data (``extra``: run id, actions...)."""
    return {"name": report.name, "version": report.version,
            "status": "alert" if report.alerts else "ok", "alerts": report.alerts,
            "drifted": report.drifted_columns(), "left_out": report.left_out, **extra,
            "windows": [w.to_json() for w in report.windows]}


def write_drift_table(report: VersionReport, directory: Path) -> list[Path]:
    """``drift_table.csv`` (one row per window and column) and ``report.json``."""
    directory.mkdir(parents=True, exist_ok=True)
    table = directory / "drift_table.csv"
    with table.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["window_start", "window_rows", "column", "kind", "psi", "psi_p", "ks",
                         "ks_p", "missing_rate", "out_of_range_rate", "drifted", "findings"])
        for w in report.windows:
            for c in w.columns:
                writer.writerow([iso_utc(w.start), w.rows, c.column, c.kind, c.psi, c.psi_p, c.ks,
                                 c.ks_p, c.missing_rate, c.out_of_range_rate, c.drifted,
                                 "; ".join(c.reasons)])
    full = directory / "report.json"
    full.write_text(json.dumps(report_json(report), indent=1))
    return [table, full]


def window_metrics(window: WindowReport) -> dict[str, float]:
    """The MLflow metrics of one window (logged at step = window index)."""
    metrics: dict[str, float] = {"rows": window.rows, "requests": window.requests,
                                 "alerts": len(window.alerts),
                                 "latency_p50_ms": window.latency_p50_ms,
                                 "latency_p95_ms": window.latency_p95_ms}
    for column in window.columns:
        name = metric_name(column.column)
        metrics[f"psi.{name}"] = column.psi
        if column.ks is not None:
            metrics[f"ks.{name}"] = column.ks
        metrics[f"missing.{name}"] = column.missing_rate
        metrics[f"out_of_range.{name}"] = column.out_of_range_rate
    for metric, quality in window.quality.items():
        metrics[f"quality.{metric}"] = quality["value"]
        metrics[f"quality_drop.{metric}"] = quality["drop"]
    return {k: float(v) for k, v in metrics.items()
            if v is not None and math.isfinite(float(v))}


def metric_name(column: str) -> str:
    """A column name MLflow accepts as part of a metric key."""
    return re.sub(r"[^A-Za-z0-9_\-. /]", "_", column)


def write_drift_plots(report: VersionReport, directory: Path) -> list[Path]:
    """``drift_over_time.png`` (PSI per column and window) and ``distributions.png`` (each
    column's reference shares against the window :func:`render_version` shows)."""
    import matplotlib

    matplotlib.use("Agg")  # files only; never a window
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    written = []
    columns = list(report.profile["columns"])
    starts = [np.datetime64(int(w.start), "s") for w in report.windows]
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=100)
    try:
        for name in columns:
            values = [next((c.psi for c in w.columns if c.column == name), np.nan)
                      for w in report.windows]
            ax.plot(starts, values, marker="o", markersize=3, label=name)
        ax.set(xlabel="window start (UTC)", ylabel="PSI", title=f"Drift over time, v"
               f"{report.version}")
        ax.legend(fontsize="x-small", ncol=2)
        fig.autofmt_xdate()
        fig.tight_layout()
        written.append(directory / "drift_over_time.png")
        fig.savefig(written[-1])
    finally:
        plt.close(fig)
    shown = _shown_window(report)
    if shown is None or not shown.columns:
        return written
    count = len(shown.columns)
    across = min(4, count)
    down = -(-count // across)
    fig, axes = plt.subplots(down, across, figsize=(3.2 * across, 2.6 * down), dpi=100,
                             squeeze=False)
    try:
        for ax, column in zip(axes.flat, shown.columns):
            profile = report.profile["columns"][column.column]
            reference = np.asarray(profile["counts"], dtype=float)
            window = np.asarray(shown.counts.get(column.column, [])[:len(reference)], dtype=float)
            bins = np.arange(len(reference))
            ax.bar(bins - 0.2, reference / max(reference.sum(), 1), width=0.4, label="training")
            if len(window):
                ax.bar(bins + 0.2, window / max(window.sum(), 1), width=0.4, label="window")
            ax.set_title(f"{column.column} (PSI {_number(column.psi)})", fontsize="small")
            ax.set_xticks([])
        for ax in list(axes.flat)[count:]:
            ax.axis("off")
        axes.flat[0].legend(fontsize="x-small")
        fig.suptitle(f"Shares per training quantile bin, window from {iso_utc(shown.start)}",
                     fontsize="small")
        fig.tight_layout()
        written.append(directory / "distributions.png")
        fig.savefig(written[-1])
    finally:
        plt.close(fig)
    return written
