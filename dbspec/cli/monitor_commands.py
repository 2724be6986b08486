"""``dbspec monitor``: drift and quality of a served model from its inference table.

Exit codes: 0 no alert, 3 an alert (the drifted features are named), 1 an error (also a
rollback that was asked for and could not be made), 2 a usage error.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, NamedTuple, Optional

from dbspec.cli.options import Command, add_registry_options, add_spec_options
from dbspec.errors import DbspecError, UsageError

#: The exit code of a pass that alerted.
ALERT_EXIT = 3
PROFILE_ARTIFACT = "monitoring/reference_profile.json"


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
        return _monitor(args, registry, _Pass(spec, section, target, table, settings, window,
                                              dataset, labels))
    except MlflowException as exc:  # a store that stopped answering midway
        raise DbspecError(f"the tracking store at {registry.client.tracking_uri} failed: "
                          f"{str(exc).splitlines()[0]}") from None


class _Pass(NamedTuple):
    """What one pass reads and how: resolved from the arguments and the spec."""

    spec: Any
    section: Any  # MonitoringSpec
    target: Any  # ModelTarget
    table: str
    settings: Any  # MonitorSettings
    window: str
    dataset: Any
    labels: Any


def _monitor(args: argparse.Namespace, registry, run: _Pass) -> int:
    from dbspec.monitoring.monitor import evaluate_windows, scan_table

    client, target, settings, table = registry.client, run.target, run.settings, run.table
    section, labels, window = run.section, run.labels, run.window
    version_filter = target.version  # models:/NAME/VERSION: that version only
    skipped: dict[str, str] = {}  # version -> why it has no profile

    def profile_for(version: str) -> Optional[dict]:
        try:
            return _reference_profile(client, target.name, version)
        except NoProfile as exc:  # an old version among others must not stop the pass
            skipped[version] = str(exc)
            print(f"warning: {exc}; its rows are left out", file=sys.stderr)
            return None

    def progress(rows: int, seconds: float) -> None:
        print(f"  scanned {rows:,} rows ({rows / seconds:,.0f} rows/s)", file=sys.stderr,
              flush=True)

    started = time.monotonic()
    scans = scan_table(run.dataset, target.name, profile_for, settings, version=version_filter,
                       labels=labels, progress=progress)
    if not scans and skipped:
        raise DbspecError("; ".join(skipped.values()))
    if not scans:
        since = args.since or section.lookback
        since = f" since {since}" if since and since != "all" else ""
        raise DbspecError(f"no rows of {target.name}" + (f" v{version_filter}" if
                          version_filter else "") + f" in {table}{since}: nothing to monitor")
    rows = sum(w.rows for s in scans for w in s.windows.values())
    seconds = time.monotonic() - started
    for scan in scans:
        if scan.missing:
            print(f"warning: the table has no column {', '.join(scan.missing)} of "
                  f"{scan.name} v{scan.version}: not monitored", file=sys.stderr)
    from dbspec.evaluation.metrics import task_metrics

    reports = [evaluate_windows(s, settings, labels=labels, score=task_metrics,
                                reference_metrics=_test_metrics(client, s.name, s.version))
               for s in sorted(scans, key=lambda s: int(s.version))]
    on_alert = args.on_alert or section.on_alert
    alias = target.alias if target.alias else None
    experiment = section.experiment or f"{target.name}-monitoring"
    outputs, failed = [], False
    for report in reports:
        run_id = _log_run(client, report, experiment, Path(args.state_dir), table=table,
                          window=window, settings=settings)
        actions, ok = _act(registry, report, on_alert, alias, run_id)
        failed = failed or not ok
        outputs.append((report, run_id, actions))
    _print(outputs, table=table, window=window, rows=rows, seconds=seconds, as_json=args.json)
    alerted = [r for r, _, _ in outputs if r.alerts]
    if alerted:
        named = sorted({c for r in alerted for c in r.drifted_columns()})
        print(f"alert: {', '.join(f'{r.name} v{r.version}' for r in alerted)}"
              + (f": drift in {', '.join(named)}" if named else ": quality drop")
              + f" (exit {ALERT_EXIT})", file=sys.stderr)
    return 1 if failed else ALERT_EXIT if alerted else 0


class NoProfile(DbspecError):
    """A version the registry confirms has no reference profile (or no longer exists)."""


def _reference_profile(client, name: str, version: str) -> dict:
    """The reference profile logged with the version's training run.

    Raises:
        NoProfile: the registry confirms the version, or its profile, is not there.
        RegistryUnavailable: the registry or the artifact store answered with an error: the
            version is not skipped then, the pass fails (a drifted version must not pass
            unseen because the store was down).
    """
    from mlflow.exceptions import MlflowException

    from dbspec.monitoring.profile import check_profile
    from dbspec.registry.errors import is_not_found, unavailable

    try:
        run_id = client.get_model_version(name, version).run_id
    except MlflowException as exc:
        if not is_not_found(exc):
            raise unavailable(exc, f"{name} v{version}") from None
        raise NoProfile(f"the inference table has rows of {name} v{version}, which the "
                        f"registry does not have: {str(exc).splitlines()[0]}") from None
    try:
        with tempfile.TemporaryDirectory() as scratch:
            path = client.download_artifacts(run_id, PROFILE_ARTIFACT, scratch)
            return check_profile(json.loads(Path(path).read_text()))
    except MlflowException as exc:
        if not is_not_found(exc):
            raise unavailable(exc, f"the reference profile of {name} v{version}") from None
        missing = exc
    except (FileNotFoundError, ValueError) as exc:
        missing = exc
    except OSError as exc:
        raise unavailable(exc, f"the reference profile of {name} v{version}") from None
    raise NoProfile(f"{name} v{version} has no reference profile ({PROFILE_ARTIFACT} in run "
                    f"{run_id}: {str(missing).splitlines()[0]}); versions trained before dbspec "
                    "recorded profiles cannot be monitored: train it again")


def _test_metrics(client, name: str, version: str) -> dict[str, float]:
    """The version's registered test metrics by bare name (``metric.test_rmse`` -> rmse)."""
    tags = client.get_model_version(name, version).tags or {}
    out = {}
    for key, value in tags.items():
        if key.startswith("metric.test_") and key != "metric.test_loss":
            try:
                out[key[len("metric.test_"):]] = float(value)
            except ValueError:
                continue
    return out


def _log_run(client, report, experiment: str, state_dir: Path, *, table: str, window: str,
             settings) -> str:
    """One MLflow run for the version's pass: tags, per-window metrics, drift table, plots."""
    from mlflow.entities import Metric

    from dbspec.monitoring.report import window_metrics, write_drift_plots, write_drift_table
    from dbspec.tracking.mlflow_tracking import ensure_experiment

    status = "alert" if report.alerts else "ok"
    tags = {"mlflow.runName": f"monitor {report.name} v{report.version}",
            "dbspec.model_name": report.name, "dbspec.model_version": report.version,
            "dbspec.monitoring.table": table, "dbspec.monitoring.status": status,
            "dbspec.monitoring.drifted": ",".join(report.drifted_columns())}
    run = client.create_run(ensure_experiment(client, experiment, state_dir), tags=tags)
    run_id = run.info.run_id
    try:
        client.log_batch(run_id, params=_params(window, settings))
        metrics = [Metric(k, v, int(w.start * 1000), w.index) for w in report.windows
                   for k, v in window_metrics(w).items()]
        for at in range(0, len(metrics), 1000):
            client.log_batch(run_id, metrics=metrics[at:at + 1000])
        with tempfile.TemporaryDirectory() as scratch:
            for path in write_drift_table(report, Path(scratch)):
                client.log_artifact(run_id, str(path), "monitoring")
            for path in write_drift_plots(report, Path(scratch) / "plots"):
                client.log_artifact(run_id, str(path), "plots")
        client.set_model_version_tag(report.name, report.version, "dbspec.monitoring.last_run",
                                     run_id)
        client.set_model_version_tag(report.name, report.version, "dbspec.monitoring.status",
                                     status)
    except BaseException:
        client.set_terminated(run_id, "FAILED")
        raise
    client.set_terminated(run_id, "FINISHED")
    return run_id


def _params(window: str, settings) -> list:
    from mlflow.entities import Param

    from dbspec.monitoring.monitor import iso_utc

    values = {"window": window, "min_rows": settings.min_rows,
              "since": "" if settings.since is None else iso_utc(settings.since),
              "checks": ",".join(settings.checks),
              **{f"threshold.{k}": v for k, v in settings.thresholds.__dict__.items()}}
    return [Param(k, str(v)) for k, v in values.items()]


def _act(registry, report, on_alert: str, alias: Optional[str],
         run_id: str) -> tuple[list[str], bool]:
    """Tag the alerting version, and roll its alias back when it holds it; (what was done,
    whether everything asked for was done)."""
    if not report.alerts or on_alert == "none":
        return [], True
    from dbspec.registry import RegistryError, alias_holder
    from dbspec.registry.commands import rollback

    client, name, version = registry.client, report.name, report.version
    why = f"monitoring run {run_id}: " + "; ".join(report.alerts[-5:])
    client.set_model_version_tag(name, version, "dbspec.monitoring.alert", why[:4900])
    actions = [f"tagged {name} v{version} dbspec.monitoring.alert"]
    if on_alert != "rollback":
        return actions, True
    if alias is None:
        return actions + ["rollback: no alias to move back (give --alias)"], False
    holder = alias_holder(client, name, alias)
    if holder is None or str(holder.version) != version:
        held = "nothing" if holder is None else f"v{holder.version}"
        return actions + [f"rollback: @{alias} holds {held}, not v{version}: left as it is"], \
            True
    try:  # under the lock, only while the alerting version still holds it
        moved = rollback(registry, name, alias, None, expected=version)
    except RegistryError as exc:
        return actions + [f"rollback of @{alias} failed: {exc}"], False
    if moved.get("moved") is False:
        return actions + [f"rollback: @{alias} moved to v{moved['previous']} meanwhile, not "
                          f"v{version}: left as it is"], True
    restored = moved["version"]
    client.set_model_version_tag(name, version, "dbspec.monitoring.rolled_back",
                                 f"@{alias} moved back to v{restored} by {why}"[:4900])
    client.set_model_version_tag(name, restored, "dbspec.monitoring.restored",
                                 f"@{alias} restored here from v{version} by {why}"[:4900])
    return actions + [f"rolled back {name}@{alias}: v{version} -> v{restored}"], True


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
