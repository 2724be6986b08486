"""``dbspec monitor``: drift and quality of a served model from its inference table.

Exit codes: 0 no alert, 3 an alert (the drifted features are named), 1 an error (also a
rollback that was asked for and could not be made), 2 a usage error. With ``--task-values`` (a
Databricks job's monitor task) an alert exits 0 too: the outcome goes to the job's condition
tasks as task values, and only an error fails the task.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from dbspec.cli.options import (Command, DeprecatedAlias, add_format_option,
                                add_registry_options, add_spec_options)
from dbspec.cli.serving_handlers import say

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
    parser.add_argument("--task-values", action="store_true",
                        help="in a Databricks job: set the task values alert (true|false), "
                             "rollback_to and rollback_from (a version, or none) and exit 0 on "
                             "an alert, so that condition tasks tell an alert from an error")
    parser.add_argument("--defer-rollback", action="store_true",
                        help="with --task-values and on_alert rollback: move no alias; report "
                             "the version to go back to (the deployment job moves it)")
    add_format_option(parser, "json")
    parser.add_argument("--json", dest="format", action=DeprecatedAlias, nargs=0, const="json",
                        use="--format json")
    add_registry_options(parser)


def _run(args: argparse.Namespace) -> int:
    from dbspec.errors import UsageError
    from dbspec.monitoring.use_case import MonitorFlags, monitor_served

    if args.defer_rollback and not args.task_values:
        raise UsageError("--defer-rollback hands the rollback to the job: give --task-values")
    flags = MonitorFlags(**{**{name: getattr(args, name) for name in MonitorFlags._fields
                               if name != "assignments"},
                            "assignments": tuple(args.assignments)})
    result = monitor_served(flags, say=say, defer_rollback=args.defer_rollback,
                            task_values=args.task_values,
                            show=lambda shown: _print(shown, as_json=args.format == "json"))
    code = _exit_code(result.outcome, 0 if args.task_values else ALERT_EXIT)
    if result.task_values is None:  # no --task-values, or an error: the task fails as it is
        return code
    values, was_set = result.task_values
    shown = " ".join(f"{k}={v}" for k, v in values.items())
    print(f"task values{'' if was_set else ' (not in a Databricks job: unset)'}: {shown}",
          file=sys.stderr)
    return 0


def _exit_code(outcome: Any, alert_exit: int = ALERT_EXIT) -> int:
    """1 when an action asked for failed, ``alert_exit`` on an alert (named on stderr), else 0."""
    alerted = [r for r, _, _ in outcome.outputs if r.alerts]
    if alerted:
        named = sorted({c for r in alerted for c in r.drifted_columns()})
        print(f"alert: {', '.join(f'{r.name} v{r.version}' for r in alerted)}"
              + (f": drift in {', '.join(named)}" if named else ": quality drop")
              + f" (exit {alert_exit})", file=sys.stderr)
    return 1 if outcome.failed else alert_exit if alerted else 0


def _print(result: Any, *, as_json: bool) -> None:
    from dbspec.monitoring.report import render_version, report_json

    outputs, table, window = result.outcome.outputs, result.table, result.window
    rows, seconds = result.outcome.rows, result.outcome.seconds
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
