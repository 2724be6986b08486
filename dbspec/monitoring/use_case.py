"""``dbspec monitor``'s use case: which model and table, the flags over the spec's
``monitoring`` section (a flag left out is None), and one pass
(:func:`dbspec.monitoring.passes.monitor_table`)."""

from __future__ import annotations

import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, NamedTuple, Optional

from dbspec.errors import DbspecError, UsageError


class MonitorFlags(NamedTuple):
    """``dbspec monitor``'s settings."""

    model: str  #: a spec file or a ``models:/`` URI
    target: Optional[str] = None
    assignments: tuple[str, ...] = ()
    table: Optional[str] = None
    since: Optional[str] = None
    window: Optional[str] = None
    min_rows: Optional[int] = None
    labels: Optional[str] = None
    label_column: Optional[str] = None
    on_alert: Optional[str] = None
    alias: Optional[str] = None
    tracking_uri: Optional[str] = None
    state_dir: str = ".dbspec"


class MonitorResult(NamedTuple):
    """What a pass found and did (a :class:`~dbspec.monitoring.passes.PassOutcome`), with the
    table and window it read; a deferred rollback's (version to restore, alerting version)."""

    outcome: Any
    table: str
    window: str
    rollback: Optional[tuple[str, str]] = None
    #: ``--task-values``: the values for the job's condition tasks, and whether they were set
    #: (False off Databricks); None without it or when the pass failed
    task_values: Optional[tuple[dict[str, str], bool]] = None


class _Resolved(NamedTuple):
    spec: Any  # the spec, or None for a models:/ URI
    section: Any  # MonitoringSpec
    target: Any  # ModelTarget
    table: str


def parse_since(text: str, now: Optional[float] = None) -> float:
    """Epoch seconds of ``--since``: an ISO time (UTC unless it says otherwise) or a duration
    before ``now``; else UsageError."""
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


def monitor_settings(flags: MonitorFlags, section: Any) -> tuple[Any, str]:
    """(MonitorSettings, window text) from the flags over the spec's section; UsageError for
    a window, ``--min-rows`` or ``--since`` that means nothing."""
    from dbspec.monitoring.monitor import MonitorSettings
    from dbspec.spec.sections.monitoring import duration_seconds

    window = flags.window or section.window
    try:
        window_s = duration_seconds(window)
    except ValueError as exc:
        raise UsageError(f"--window {exc}") from None
    if flags.min_rows is not None and flags.min_rows < 1:
        raise UsageError(f"--min-rows must be at least 1, not {flags.min_rows}")
    since = flags.since or section.lookback
    since = None if since in (None, "all") else parse_since(since)
    return MonitorSettings(window_s=window_s, since=since,
                           min_rows=flags.min_rows or section.min_rows,
                           thresholds=section.thresholds, checks=tuple(section.checks)), window


def _resolve(flags: MonitorFlags, say: Callable[[str], None]) -> _Resolved:
    """The spec (or None), its monitoring section, the model and the table; ``--alias``
    replaces the alias that tag and rollback act on, not which rows are read."""
    from dbspec.serving.source import parse_model_uri, spec_target
    from dbspec.spec.loader import load_spec
    from dbspec.spec.sections.monitoring import MonitoringSpec, default_alias

    if flags.model.startswith("models:/"):
        if flags.target or flags.assignments:
            raise UsageError("--target and --set apply to a spec, not to a models:/ URI")
        if not flags.table:
            raise UsageError("a models:/ URI names no inference table: give --table PATH")
        target = parse_model_uri(flags.model)
        return _Resolved(None, MonitoringSpec(),
                         target._replace(alias=flags.alias or target.alias), flags.table)
    loaded = load_spec(flags.model, target=flags.target, assignments=list(flags.assignments))
    for diag in loaded.warnings:
        say(diag.format())
    spec = loaded.spec
    section = spec.monitoring or MonitoringSpec()
    configured = spec.serving.realtime.inference_table
    table = flags.table or section.table or (configured.path if configured else None)
    if table is None:
        raise UsageError(f"spec '{spec.name}' names no inference table: set "
                         "serving.realtime.inference_table or monitoring.table, or give --table")
    return _Resolved(spec, section, spec_target(spec, alias=flags.alias or default_alias(spec)),
                     table)


def _labels(flags: MonitorFlags, resolved: _Resolved, say: Callable[[str], None]) -> Any:
    """The labels to join for quality metrics, or None without a labels file."""
    from dbspec.monitoring.labels import read_labels

    from dbspec.spec.sections.monitoring import LabelsSpec

    spec, given = resolved.spec, resolved.section.labels
    path = flags.labels or (given.path if given else None)
    if not path:
        return None
    given = given or LabelsSpec()
    column = flags.label_column or given.column or \
        (spec.data.target if spec is not None else "target")
    labels = read_labels(path, given.key, column)
    if labels.pending:
        say(f"labels {path}: {labels.pending:,} row(s) without a label yet are left out")
    return labels


def monitor_served(flags: MonitorFlags, *, say: Callable[[str], None] = print,
                   defer_rollback: bool = False, task_values: bool = False,
                   show: Optional[Callable[[MonitorResult], None]] = None) -> MonitorResult:
    """One monitoring pass over the served model's inference table; ``defer_rollback``: an
    ``on_alert: rollback`` tags and finds the version to go back to, moving nothing;
    ``task_values``: a pass that did not fail sets the job task's values (:func:`set_values`),
    after ``show`` got the pass's result (so a task whose values are refused still shows it).

    Raises:
        UsageError: flags that mean nothing, or no inference table named.
        DbspecError: no rows to monitor, an unreadable table or labels, or a tracking store
            that stopped answering.
    """
    from concurrent.futures import ThreadPoolExecutor

    import pyarrow.dataset  # noqa: F401  (here, not in both threads at once)

    from dbspec.monitoring.monitor import open_inference_table
    from dbspec.monitoring.passes import MonitorPass, monitor_table
    from dbspec.registry.commands import open_registry
    from dbspec.serving.source import tracking_uri_for

    resolved = _resolve(flags, say)
    with ThreadPoolExecutor(1) as background:  # MLflow's import and store: seconds, meanwhile
        opening = background.submit(open_registry, tracking_uri_for(
            resolved.spec, flags.tracking_uri), Path(flags.state_dir))
        settings, window = monitor_settings(flags, resolved.section)
        dataset = open_inference_table(resolved.table, resolved.target.name, settings.since,
                                       resolved.target.version)
        labels = _labels(flags, resolved, say)
        registry = opening.result()
    from mlflow.exceptions import MlflowException

    run = MonitorPass(resolved.section, resolved.target, resolved.table,
                      settings, window, dataset, labels)
    on_alert = flags.on_alert or resolved.section.on_alert
    deferred = defer_rollback and on_alert == "rollback"
    try:
        outcome = monitor_table(registry, run, on_alert="tag" if deferred else on_alert,
                                state_dir=Path(flags.state_dir), since=flags.since)
        back = deferred_rollback(registry, outcome, resolved.target.alias) if deferred else None
    except MlflowException as exc:  # a store that stopped answering midway
        raise DbspecError(f"the tracking store at {registry.client.tracking_uri} failed: "
                          f"{str(exc).splitlines()[0]}") from None
    result = MonitorResult(outcome, resolved.table, window, back)
    if show is not None:
        show(result)
    return result._replace(task_values=set_values(result)) if task_values and \
        not outcome.failed else result


def set_values(result: MonitorResult) -> tuple[dict[str, str], bool]:
    """The task values of a pass (``alert``, ``rollback_to``, ``rollback_from``), set on the
    Databricks job task; whether they were set (False off Databricks).

    Raises:
        DbspecError: on Databricks, the runtime refused them (the task must fail).
    """
    from dbspec.jobs.task_values import set_task_values

    back, alerting = result.rollback or ("none", "none")
    alerted = any(report.alerts for report, _, _ in result.outcome.outputs)
    values = {"alert": str(alerted).lower(), "rollback_to": back, "rollback_from": alerting}
    return values, set_task_values(values)


def deferred_rollback(registry, outcome, alias: Optional[str]) -> Optional[tuple[str, str]]:
    """(version to restore, alerting version) for the first alerting version that holds
    ``alias`` and has an earlier holder recorded, as ``dbspec rollback`` would choose it."""
    from dbspec.registry import alias_holder

    for report, _, actions in outcome.outputs:
        if not report.alerts or not alias:
            continue
        holder = alias_holder(registry.client, report.name, alias)
        if holder is None or str(holder.version) != report.version:
            actions.append(f"rollback: @{alias} does not hold v{report.version}: left as it is")
            continue
        back = registry.snapshot(report.name).replaced(alias, report.version)
        if back is None:
            actions.append(f"rollback: @{alias} has no earlier holder recorded: left as it is")
            continue
        actions.append(f"rollback of {report.name}@{alias} v{report.version} -> v{back} "
                       "handed to the deployment job")
        return str(back), report.version
    return None
