"""The monitoring side of ``dbspec jobs``: a scheduled monitor job, and a Databricks quality
monitor on the serving endpoint's inference table.

- The monitor job runs ``dbspec monitor SPEC`` on ``jobs.monitor_schedule``: drift and quality
  against the registered version's reference, and ``on_alert``. Alone, an alert fails the run,
  so the job's failure notifications fire. With something to do on an alert (``retrain``, or a
  rollback through the deployment job) the task reports its outcome as task values
  (``--task-values``: ``alert``, ``rollback_to``, ``rollback_from``) and succeeds on an alert;
  condition tasks on those values start the training job or run the deployment job back to the
  previous version (notifying the failure recipients when they start). A crash fails the task,
  which skips them: nothing retrains or rolls back on a failure.
- The quality monitor (bundle ``quality_monitors``) watches the endpoint's AI Gateway payload
  table: request volume, status codes and latency by served entity. That table holds requests
  as JSON text, so feature drift is the monitor job's part. Databricks' newer data-quality API
  (``w.data_quality``: data profiling with an inference log) would profile and drift feature
  columns, but it needs a table with those columns (dbspec writes none on Databricks) and names
  tables by id, which a bundle cannot spell (no such resource in the bundle schema).
"""

from __future__ import annotations

from typing import Any, Optional

from dbspec.jobs.deployment import (MODEL_NAME, MODEL_VERSION, ROLLBACK_FROM, condition,
                                    defers_rollback, deployment_job_key)
from dbspec.jobs.resources import (endpoint_name, inference_table_config, registered_name,
                                   serves_realtime)
from dbspec.jobs.tasks import (cluster, cron, dbspec_arguments, dbspec_task, in_bundle, job_key,
                               job_reference, job_tags, mlflow_env, notifications,
                               task_libraries)
from dbspec.spec.clusters import resolve_cluster
from dbspec.spec.sections.monitoring import CATALOG_TABLE

MONITOR = "monitor"
#: What a Databricks monitor aggregates by ("n weeks" aside): a window of the spec maps to one.
GRANULARITIES = {300: "5 minutes", 1800: "30 minutes", 3600: "1 hour", 86400: "1 day",
                 7 * 86400: "1 week"}
#: The AI Gateway payload table's columns the quality monitor reads.
PAYLOAD_TIMESTAMP, PAYLOAD_ENTITY = "request_time", "served_entity_id"


def monitor_job_key(spec) -> str:
    """The monitor job's resource key, beside the main job's."""
    return f"{job_key(spec)}_monitor"


def build_monitor_job(spec, where) -> Optional[Any]:
    """The monitor job (``jobs.JobSettings``), or None without a ``monitoring`` section: one
    task on the main cluster's settings, one run at a time, the main job's failure
    notifications (an alert fails the run, unless :func:`alert_tasks` act on it) and tags."""
    from databricks.sdk.service import jobs as j

    if spec.monitoring is None:
        return None
    settings = spec.jobs
    follow = alert_tasks(spec, where)
    # the table, window, thresholds and action come from the spec the task passes
    task = dbspec_task(
        spec, MONITOR, dbspec_arguments("monitor", where) + (["--task-values"] if follow else [])
        + (["--defer-rollback"] if defers_rollback(spec) else []),
        libraries=task_libraries(spec, ("evaluate",), where.wheel), job_cluster_key="main",
        description="dbspec monitor: drift and quality of the served version against its "
                    "reference profile; " + ("reports an alert as task values, fails on an error"
                                             if follow else "fails on an alert"))
    return j.JobSettings(
        name=f"{settings.name or spec.name} monitor"[:100],
        description=f"Drift and quality monitoring of {spec.registry.name} (dbspec spec "
                    f"{spec.name})"[:1000],
        tasks=[task, *follow],
        job_clusters=[j.JobCluster(job_cluster_key="main", new_cluster=cluster(
            resolve_cluster(spec, "main"), mlflow_env(spec), current_user=where.current_user))],
        email_notifications=notifications(settings, failures_only=True),
        schedule=cron(settings.monitor_schedule),
        tags=job_tags(spec, where, dbspec_role="monitor"), max_concurrent_runs=1,
        queue=j.QueueSettings(enabled=True))


def alert_tasks(spec, where) -> list:
    """What the monitor job does on an alert its task reports: ``monitoring.retrain`` starts the
    training job, :func:`defers_rollback` runs the deployment job back to the version before
    (job ids are references the deploy resolves, strings where the SDK types an int)."""
    from databricks.sdk.service import jobs as j

    retrain = spec.monitoring.retrain

    def value(key: str) -> str:
        return f"{{{{tasks.{MONITOR}.values.{key}}}}}"

    mail = spec.jobs.notifications.on_failure if spec.jobs.notifications else None
    tell = j.TaskEmailNotifications(on_start=mail) if mail else None  # an alert acted upon
    tasks = []
    if retrain:
        tasks += [condition("alerted", value("alert"), "EQUAL_TO", "true", MONITOR), j.Task(
            task_key="retrain", depends_on=[j.TaskDependency(task_key="alerted", outcome="true")],
            email_notifications=tell, run_job_task=j.RunJobTask(
                job_id=job_reference(where, job_key(spec))),  # type: ignore[arg-type]
            description="Retrain: start the training job (its new version then runs through the "
                        "deployment job's gates and approval)")]
    if defers_rollback(spec):
        name = registered_name(spec) if in_bundle(where) else spec.registry.name
        tasks += [condition("rollback_due", value("rollback_to"), "NOT_EQUAL", "none", MONITOR),
                  j.Task(task_key="rollback", depends_on=[j.TaskDependency(
                      task_key="rollback_due", outcome="true")], email_notifications=tell,
                      run_job_task=j.RunJobTask(job_parameters={
                              MODEL_NAME: name, MODEL_VERSION: value("rollback_to"),
                              ROLLBACK_FROM: value("rollback_from")},
                          job_id=job_reference(where, deployment_job_key(spec))),  # type: ignore
                      description="Roll back: run the deployment job on the version that held "
                                  "the alias before the alerting one")]
    return tasks


def granularity(spec) -> str:
    """The Databricks monitor granularity of ``monitoring.window``: the same length when one
    exists, else the nearest (:func:`monitor_warnings` says so)."""
    from dbspec.spec.sections.monitoring import duration_seconds

    seconds = duration_seconds(spec.monitoring.window)
    return GRANULARITIES[min(GRANULARITIES, key=lambda s: (abs(s - seconds), s))]


def quality_monitor(spec, target: Optional[str], mode: str) -> Optional[dict[str, Any]]:
    """The bundle's ``quality_monitors`` entry on the endpoint's inference table, or None:
    without ``monitoring`` or an inference table, and outside production targets (a development
    endpoint's table is named after the deploying user, which the bundle cannot spell)."""
    if spec.monitoring is None or not serves_realtime(spec) or mode != "production":
        return None
    endpoint = endpoint_name(spec, target or "default")
    table = inference_table_config(spec, endpoint)
    if table is None:
        return None
    when = spec.jobs.monitor_schedule
    return {
        "table_name": f"{table.catalog_name}.{table.schema_name}.{table.table_name_prefix}"
                      "_payload",
        "output_schema_name": f"{table.catalog_name}.{table.schema_name}",
        "assets_dir": f"/Workspace/Shared/dbspec/monitors/{table.table_name_prefix}_payload",
        "time_series": {"timestamp_col": PAYLOAD_TIMESTAMP, "granularities": [granularity(spec)]},
        "slicing_exprs": [PAYLOAD_ENTITY],
        "schedule": {"quartz_cron_expression": when.quartz_cron, "timezone_id": when.timezone},
    }


def monitor_warnings(spec, mode: Optional[str] = None) -> list[str]:
    """What the generated monitoring cannot do although the spec is valid."""
    if spec.monitoring is None:
        return []
    found = []
    table = spec.monitoring.table or (spec.serving.realtime.inference_table.path
                                      if spec.serving.realtime.inference_table else None)
    if table and not CATALOG_TABLE.match(table) and not table.startswith(
            ("/Volumes/", "/dbfs/", "dbfs:/", "s3://", "abfss://", "gs://")):
        found.append(f"monitoring: the monitor job reads the inference table at '{table}', a "
                     "local path; point monitoring.table at the catalog table, or the Volume "
                     "(or cloud path) the serving process writes it to")
    if spec.monitoring.lookback is None:
        found.append("monitoring.lookback is unset: each scheduled pass of the monitor job "
                     "reads the whole inference table and alerts again on windows that drifted "
                     "long ago; set it to a little more than the schedule's period (2h for "
                     "the hourly default)")
    from dbspec.spec.sections.monitoring import duration_seconds

    seconds = duration_seconds(spec.monitoring.window)
    if serves_realtime(spec) and seconds not in GRANULARITIES:
        found.append(f"monitoring.window {spec.monitoring.window}: a Databricks quality monitor "
                     f"aggregates by 5 minutes, 30 minutes, 1 hour, 1 day or 1 week; it uses "
                     f"{granularity(spec)}")
    if serves_realtime(spec) and inference_table_config(spec, "x") is not None:
        if mode == "development":
            found.append("monitoring: no quality monitor in a development target (its "
                         "endpoint's inference table is named after the deploying user); "
                         "production targets get one")
        elif mode == "production":
            found.append("monitoring: the quality monitor needs the endpoint's inference table, "
                         "which exists once the job's update_endpoint task has created the "
                         "endpoint: until the job has run once, a deploy reports the table "
                         "missing; deploy again after that first run")
    return found
