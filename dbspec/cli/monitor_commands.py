"""``dbspec monitor``: drift and quality of a served model from its inference table.

Exit codes: 0 no alert, 3 an alert (the drifted features are named), 1 an error (also a
rollback that was asked for and could not be made), 2 a usage error.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional

from dbspec.cli.options import Command, add_registry_options, add_spec_options
from dbspec.errors import DbspecError, UsageError

#: The exit code of a pass that alerted.
ALERT_EXIT = 3


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="SPEC|MODEL_URI",
                        help="a spec (its registered model, alias and monitoring section), "
                             "models:/NAME@ALIAS, models:/NAME/VERSION (that version's rows "
                             "only) or models:/NAME")
    add_spec_options(parser)
    parser.add_argument("--table", metavar="PATH",
                        help="the inference table (default: monitoring.table, else "
                             "serving.realtime.inference_table.path)")
    parser.add_argument("--since", metavar="T",
                        help="only rows from T on: an ISO time (2026-01-31T12:00Z), a "
                             "duration ago (90m, 24h, 7d) or all (default: "
                             "monitoring.lookback, else all)")
    parser.add_argument("--window", metavar="W", help="window length, e.g. 15m, 1h, 1d "
                                                      "(default: monitoring.window, 1h)")
    parser.add_argument("--min-rows", type=int, metavar="N",
                        help="windows with fewer rows are not checked (default: "
                             "monitoring.min_rows, 100)")
    parser.add_argument("--labels", metavar="PATH",
                        help="labels (Delta, Parquet or CSV) joined on monitoring.labels.key "
                             "(request_id) for quality metrics")
    parser.add_argument("--label-column", metavar="NAME",
                        help="the labels' column (default: monitoring.labels.column, else "
                             "data.target, else 'target')")
    parser.add_argument("--on-alert", choices=("none", "tag", "rollback"),
                        help="what an alert does (default: monitoring.on_alert, none)")
    parser.add_argument("--alias", help="the alias tag/rollback act on (default: the spec's)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    add_registry_options(parser)


def parse_since(text: str, now: Optional[float] = None) -> float:
    """Epoch seconds of ``--since``: an ISO time (UTC unless it says otherwise) or a duration
    before ``now``.

    Raises:
        UsageError: neither.
    """
    from dbspec.spec.sections.monitoring import duration_seconds

    try:
        return (time.time() if now is None else now) - duration_seconds(text)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(f"--since '{text}': expected an ISO time such as 2026-01-31T12:00Z "
                         "or a duration ago such as 90m, 24h or 7d") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()


def _settings(args: argparse.Namespace, section) -> tuple[Any, str]:
    """(MonitorSettings, window text) from the flags over the spec's section."""
    from dbspec.monitoring.drift import Thresholds
    from dbspec.monitoring.monitor import MonitorSettings
    from dbspec.spec.sections.monitoring import duration_seconds

    window = args.window or section.window
    try:
        window_s = duration_seconds(window)
    except ValueError as exc:
        raise UsageError(f"--window {exc}") from None
    if args.min_rows is not None and args.min_rows < 1:
        raise UsageError(f"--min-rows must be at least 1, not {args.min_rows}")
    since = args.since or section.lookback
    since = None if since in (None, "all") else parse_since(since)
    thresholds = Thresholds(**section.thresholds.model_dump())
    return MonitorSettings(window_s=window_s, since=since,
                           min_rows=args.min_rows or section.min_rows, thresholds=thresholds,
                           checks=tuple(section.checks)), window


def _resolve(args: argparse.Namespace):
    """(spec or None, monitoring section, target, table path); ``--alias`` replaces the
    target's alias (the one tag and rollback act on), not which rows are read."""
    from dbspec.serving.source import parse_model_uri, spec_target
    from dbspec.spec.sections.monitoring import MonitoringSpec, default_alias

    if args.model.startswith("models:/"):
        if args.target or args.assignments:
            raise UsageError("--target and --set apply to a spec, not to a models:/ URI")
        if not args.table:
            raise UsageError("a models:/ URI names no inference table: give --table PATH")
        target = parse_model_uri(args.model)
        return None, MonitoringSpec(), target._replace(alias=args.alias or target.alias), \
            args.table
    from dbspec.cli.options import load_spec_arguments

    args.file = args.model  # what the spec options read
    spec = load_spec_arguments(args).spec
    section = spec.monitoring or MonitoringSpec()
    target = spec_target(spec, alias=args.alias or default_alias(spec))
    configured = spec.serving.realtime.inference_table
    table = args.table or section.table or (configured.path if configured else None)
    if table is None:
        raise UsageError(f"spec '{spec.name}' names no inference table: set "
                         "serving.realtime.inference_table or monitoring.table, or give --table")
    return spec, section, target, table


def _run(args: argparse.Namespace) -> int:
    from dbspec.monitoring.labels import read_labels
    from dbspec.monitoring.monitor import open_inference_table
    from dbspec.monitoring.passes import MonitorPass, monitor_table
    from dbspec.serving.source import tracking_uri_for

    spec, section, target, table = _resolve(args)
    settings, window = _settings(args, section)
    dataset = open_inference_table(table)
    labels = None
    labels_path = args.labels or (section.labels.path if section.labels else None)
    if labels_path:
        key = section.labels.key if section.labels else "request_id"
        column = args.label_column or (section.labels.column if section.labels else None) or \
            (spec.data.target if spec is not None else "target")
        labels = read_labels(labels_path, key, column)
        if labels.pending:
            print(f"labels {labels_path}: {labels.pending:,} row(s) without a label yet are left "
                  "out", file=sys.stderr)
    from mlflow.exceptions import MlflowException

    from dbspec.registry.commands import open_registry

    registry = open_registry(tracking_uri_for(spec, args.tracking_uri), Path(args.state_dir))
    try:
        run = MonitorPass(spec, section, target, table, settings, window, dataset, labels)
        outcome = monitor_table(registry, run, on_alert=args.on_alert or section.on_alert,
                                state_dir=Path(args.state_dir), since=args.since)
    except MlflowException as exc:  # a store that stopped answering midway
        raise DbspecError(f"the tracking store at {registry.client.tracking_uri} failed: "
                          f"{str(exc).splitlines()[0]}") from None
    _print(outcome.outputs, table=table, window=window, rows=outcome.rows,
           seconds=outcome.seconds, as_json=args.json)
    alerted = [r for r, _, _ in outcome.outputs if r.alerts]
    if alerted:
        named = sorted({c for r in alerted for c in r.drifted_columns()})
        print(f"alert: {', '.join(f'{r.name} v{r.version}' for r in alerted)}"
              + (f": drift in {', '.join(named)}" if named else ": quality drop")
              + f" (exit {ALERT_EXIT})", file=sys.stderr)
    return 1 if outcome.failed else ALERT_EXIT if alerted else 0


def _print(outputs, *, table: str, window: str, rows: int, seconds: float,
           as_json: bool) -> None:
    from dbspec.monitoring.report import render_version, report_json

    if as_json:
        print(json.dumps({"table": table, "window": window, "rows": rows,
                          "scan_seconds": round(seconds, 3),
                          "versions": [report_json(r, run_id=run_id, actions=actions)
                                       for r, run_id, actions in outputs]}, indent=1))
        return
    for report, run_id, actions in outputs:
        print(render_version(report, table=table, window=window))
        for alert in report.alerts:
            print(f"  ALERT {alert}")
        for action in actions:
            print(f"  {action}")
        print(f"  MLflow run {run_id}")
    rate = f" ({rows / seconds:,.0f} rows/s)" if seconds > 0 else ""
    print(f"scanned {rows:,} rows in {seconds:.1f} s{rate}")


COMMANDS = (
    Command("monitor", "drift and quality of a served model from its inference table",
            _arguments, _run,
            "Stream the Delta inference table window by window and compare each window of "
            "each model version with the reference profile logged at training: PSI and KS per "
            "feature and output (categories: PSI and chi-square), missing and out-of-range "
            "rates, requests and latency, and with --labels the quality metrics against the "
            "version's test metrics. Each pass is an MLflow run with per-window metrics, a "
            "drift table and plots. Exit 0: no alert; 3: an alert (on_alert: tag tags the "
            "version, rollback also moves its alias back); 1: an error; 2: usage."),
)
