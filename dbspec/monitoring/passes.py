"""One pass of ``dbspec monitor``: scan the inference table, compare each version with its
reference profile, log one MLflow run per version, tag and roll back on alerts."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple, Optional

from dbspec.errors import DbspecError
from dbspec.monitoring.layout import left_out_text
from dbspec.monitoring.profile import ARTIFACT_PATH


class MonitorPass(NamedTuple):
    """What one pass reads and how: resolved from the arguments and the spec."""

    section: Any  # MonitoringSpec
    target: Any  # ModelTarget
    table: str
    settings: Any  # MonitorSettings
    window: str
    dataset: Any
    labels: Any


class PassOutcome(NamedTuple):
    """What a pass found and did: (report, MLflow run id, actions) per version."""

    outputs: list
    rows: int
    seconds: float
    failed: bool  # an action that was asked for could not be made


def monitor_table(registry, run: MonitorPass, *, on_alert: str, state_dir: Path,
                  since: Optional[str] = None) -> PassOutcome:
    """One monitoring pass (see the module docstring).

    Args:
        registry: The opened registry (:func:`dbspec.registry.commands.open_registry`).
        run: What the pass reads and how.
        on_alert: ``none``, ``tag`` or ``rollback``.
        state_dir: The state directory (the experiment lock).
        since: The look-back the user gave, for the "no rows" message.

    Raises:
        DbspecError: no rows to monitor, or only versions without a reference profile.
    """
    from dbspec.monitoring.monitor import scan_table
    from dbspec.monitoring.windows import evaluate_windows

    client, target, settings = registry.client, run.target, run.settings
    section, labels = run.section, run.labels
    settings = dataclasses.replace(settings, version=target.version)  # NAME/VERSION: only it
    skipped: dict[str, str] = {}  # version -> why it has no profile

    def profile_for(version: str) -> Optional[dict]:
        try:
            return reference_profile(client, target.name, version)
        except NoProfile as exc:  # an old version among others must not stop the pass
            skipped[version] = str(exc)
            print(f"warning: {exc}; its rows are left out", file=sys.stderr)
            return None

    started = time.monotonic()
    with ThreadPoolExecutor(1) as background:  # the statistics' import (a second), meanwhile
        background.submit(importlib.import_module, "scipy.stats")
        scans = scan_table(run.dataset, target.name, profile_for, settings, labels=labels,
                           progress=_progress)
    for scan in scans:
        if scan.left_out and not scan.windows:  # nothing usable: no run, no alert, no action
            print(f"warning: {scan.name} v{scan.version}: {left_out_text(scan.left_out)}; "
                  "nothing of it to monitor", file=sys.stderr)
    if not any(scan.windows for scan in scans):
        raise _nothing_to_monitor(run, skipped, since, scans)
    scans = [scan for scan in scans if scan.windows]
    rows = sum(w.rows for s in scans for w in s.windows.values())
    seconds = time.monotonic() - started
    from dbspec.evaluation.metrics import task_metrics

    reports = [evaluate_windows(s, settings, labels=labels, score=task_metrics,
                                reference_metrics=_test_metrics(client, s.name, s.version))
               for s in sorted(scans, key=lambda s: int(s.version))]
    alias = target.alias if target.alias else None
    experiment = section.experiment or f"{target.name}-monitoring"
    outputs, failed = [], False
    for report in reports:
        run_id = _log_run(client, report, run, experiment, state_dir)
        actions, ok = _act(registry, report, on_alert, alias, run_id)
        failed = failed or not ok
        outputs.append((report, run_id, actions))
    return PassOutcome(outputs, rows, seconds, failed)


def _progress(rows: int, seconds: float) -> None:
    print(f"  scanned {rows:,} rows ({rows / seconds:,.0f} rows/s)", file=sys.stderr, flush=True)


def _nothing_to_monitor(run: MonitorPass, skipped: dict[str, str], since: Optional[str],
                        scans: list) -> DbspecError:
    """Why a pass found no rows: only versions without a profile, none in the window, or
    only rows left out."""
    if skipped and not scans:
        return DbspecError("; ".join(skipped.values()))
    since = since or run.section.lookback
    since = f" since {since}" if since and since != "all" else ""
    version = f" v{run.target.version}" if run.target.version else ""
    left_out: dict[str, int] = {}
    for scan in scans:
        for why, count in scan.left_out.items():
            left_out[why] = left_out.get(why, 0) + count
    usable = f" ({left_out_text(left_out)})" if left_out else ""
    return DbspecError(f"no {'usable ' if left_out else ''}rows of {run.target.name}{version} "
                       f"in {run.table}{since}{usable}: nothing to monitor")


class NoProfile(DbspecError):
    """A version the registry confirms has no reference profile (or no longer exists)."""


def reference_profile(client, name: str, version: str) -> dict:
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
    missing: Exception
    try:
        with tempfile.TemporaryDirectory() as scratch:
            path = client.download_artifacts(run_id, ARTIFACT_PATH, scratch)
            return check_profile(json.loads(Path(path).read_text()))
    except MlflowException as exc:
        if not is_not_found(exc):
            raise unavailable(exc, f"the reference profile of {name} v{version}") from None
        missing = exc
    except (FileNotFoundError, ValueError) as exc:
        missing = exc
    except OSError as exc:
        raise unavailable(exc, f"the reference profile of {name} v{version}") from None
    raise NoProfile(f"{name} v{version} has no reference profile ({ARTIFACT_PATH} in run "
                    f"{run_id}: {str(missing).splitlines()[0]}); versions trained before dbspec "
                    "recorded profiles cannot be monitored: train it again")


def _test_metrics(client, name: str, version: str) -> dict[str, float]:
    """The version's registered test metrics by bare name (``metric.test_rmse`` -> rmse)."""
    tags = client.get_model_version(name, version).tags or {}
    out = {}
    for key, value in tags.items():
        with contextlib.suppress(ValueError):
            if key.startswith("metric.test_") and key != "metric.test_loss":
                out[key[len("metric.test_"):]] = float(value)
    return out


def _log_run(client, report, run: MonitorPass, experiment: str, state_dir: Path) -> str:
    """One MLflow run for the version's pass: tags, per-window metrics, drift table, and
    plots when it alerted."""
    from mlflow.entities import Metric

    from dbspec.monitoring.report import window_metrics, write_drift_plots, write_drift_table
    from dbspec.tracking.mlflow_tracking import ensure_experiment

    table, window, settings = run.table, run.window, run.settings
    status = "alert" if report.alerts else "ok"
    tags = {"mlflow.runName": f"monitor {report.name} v{report.version}",
            "dbspec.model_name": report.name, "dbspec.model_version": report.version,
            "dbspec.monitoring.table": table, "dbspec.monitoring.status": status,
            "dbspec.monitoring.drifted": ",".join(report.drifted_columns())}
    created = client.create_run(ensure_experiment(client, experiment, state_dir), tags=tags)
    run_id = created.info.run_id
    try:
        client.log_batch(run_id, params=_params(window, settings))
        metrics = [Metric(k, v, int(w.start * 1000), w.index) for w in report.windows
                   for k, v in window_metrics(w).items()]
        for at in range(0, len(metrics), 1000):
            client.log_batch(run_id, metrics=metrics[at:at + 1000])
        with tempfile.TemporaryDirectory() as scratch:
            for path in write_drift_table(report, Path(scratch)):
                client.log_artifact(run_id, str(path), "monitoring")
            # MLflow charts the per-window metrics itself; the plots (matplotlib: a second or
            # more a pass) are drawn for the version that alerted, the run someone opens
            for path in write_drift_plots(report, Path(scratch) / "plots") if report.alerts \
                    else ():
                client.log_artifact(run_id, str(path), "plots")
        for key, value in (("last_run", run_id), ("status", status)):
            client.set_model_version_tag(report.name, report.version, f"dbspec.monitoring.{key}",
                                         value)
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
