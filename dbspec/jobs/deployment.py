"""The MLflow 3 deployment job of a Unity Catalog model, from the spec's ``registry.promotion``.

A job with ``model_name`` and ``model_version`` parameters that MLflow runs on each new version:
per promotion stage a task re-checking the stage's gates and moving its alias (``dbspec
promote``); a stage that requires approval first passes an approval task (``approval_<alias>``,
which succeeds once the version carries a tag of that name with the value ``approved``, the tag
the UI's Approve button sets), then ``dbspec approve``; last the ``update_endpoint`` task moves
the serving endpoint. One run at a time, queued, so promotions of one model never overlap: the
promote stage of a run on a linked model leaves the version to it, and the main job has no
``update_endpoint`` task of its own.

With ``monitoring.on_alert: rollback`` the monitor job runs it to go back: ``rollback_from``
names the alerting version, ``model_version`` the one to restore, and a condition sends the run
to ``dbspec rollback`` (only while the alerting version still holds the alias) instead of the
gates. The bundle's ``registered_models`` resource has no ``deployment_job_id`` field: the main
job's ``link_deployment_job`` task links the job to the model (``dbspec link-job``).
"""

from __future__ import annotations

from typing import Any, Optional

from dbspec.jobs.resources import ENDPOINT_PACKAGES, endpoint_task, registered_name
from dbspec.jobs.tasks import (cluster, dbspec_task, in_bundle, job_key, job_reference, job_tags,
                               mlflow_env, notifications, task_libraries)
from dbspec.spec.clusters import resolve_cluster, serverless

#: The job parameters MLflow sets when it runs a deployment job; the monitor job's rollback
#: also sets ``rollback_from`` (else :data:`NO_VERSION`).
MODEL_NAME, MODEL_VERSION, ROLLBACK_FROM = "model_name", "model_version", "rollback_from"
NO_VERSION = "none"
LINK_TASK = "link_deployment_job"
#: The value of the approval tag that lets an approval task pass (what the UI's Approve sets).
APPROVED = "approved"


def deployment_job_key(spec) -> str:
    """The deployment job's resource key, beside the main job's."""
    return f"{job_key(spec)}_deployment"


def has_deployment_job(spec) -> bool:
    """Whether ``spec`` gets a deployment job: a Unity Catalog model with promotion stages."""
    registry = spec.registry
    return registry is not None and registry.name.count(".") == 2 and bool(registry.promotion_stages())


def defers_rollback(spec) -> bool:
    """Whether the monitor job rolls back through the deployment job (``on_alert: rollback`` on
    a model that has one) rather than in ``dbspec monitor``."""
    from dbspec.spec.sections.monitoring import default_alias

    return has_deployment_job(spec) and spec.monitoring is not None and \
        spec.monitoring.on_alert == "rollback" and default_alias(spec) is not None


def condition(key: str, left: str, op: str, right: str, upstream: str):
    """A ``condition_task`` ``key`` comparing ``left`` (a dynamic value reference) with
    ``right`` once ``upstream`` succeeded."""
    from databricks.sdk.service import jobs as j

    return j.Task(task_key=key, depends_on=[j.TaskDependency(task_key=upstream)] if upstream
                  else None, condition_task=j.ConditionTask(
                      op=j.ConditionTaskOp(op), left=left, right=right))


def approval_task_key(alias: str) -> str:
    """The approval task of stage ``alias``, and the name of the tag that approves it."""
    return f"approval_{alias}"


def _registry_task(spec, where, key: str, arguments: list[str], upstream: list[str],
                   description: str):
    return dbspec_task(
        spec, key, arguments, upstream=upstream, job_cluster_key="main",
        libraries=task_libraries(spec, (), where.wheel, packages=ENDPOINT_PACKAGES),
        description=description)


def deployment_tasks(spec, where) -> list:
    """The tasks, in order: per stage (approval, then) promotion; then ``update_endpoint``; with
    :func:`defers_rollback`, first the branch to ``dbspec rollback``."""
    from databricks.sdk.service import jobs as j

    name, version = f"{{{{job.parameters.{MODEL_NAME}}}}}", f"{{{{job.parameters.{MODEL_VERSION}}}}}"
    tasks: list = _rollback_branch(spec, where, name, version)
    ends, upstream = [t.task_key for t in tasks], list[str]()
    for stage in spec.registry.promotion_stages():
        gates = [name, version, "--alias", stage.alias]  # registry: MLFLOW_REGISTRY_URI
        if stage.approval == "required":
            key = approval_task_key(stage.alias)
            tasks.append(_registry_task(
                spec, where, key, ["approval", *gates, "--tag", key], upstream,
                f"Passes once the version carries the tag {key}={APPROVED} (the Approve button "
                "sets it); fails otherwise"))
            tasks.append(_registry_task(
                spec, where, f"promote_{stage.alias}", ["approve", *gates], [key],
                f"Re-check the gates of @{stage.alias} and move it to the approved version"))
        else:
            tasks.append(_registry_task(
                spec, where, f"promote_{stage.alias}", ["promote", *gates], upstream,
                f"Evaluate: re-check the gates of @{stage.alias} on the new version's metrics "
                "and move the alias (fails when a gate fails)"))
        upstream = [tasks[-1].task_key]
    if ends:  # not a rollback: the first stage runs on the condition's false branch
        first = next(t for t in tasks if t.task_key not in ends)
        first.depends_on = [j.TaskDependency(task_key=ends[0], outcome="false")]
    update = endpoint_task(spec, where)
    if update is not None:
        update.depends_on = [j.TaskDependency(task_key=u) for u in upstream + ends[1:]]
        update.run_if = j.RunIf.AT_LEAST_ONE_SUCCESS if ends else None  # either branch
        tasks.append(update)
    return tasks


def _rollback_branch(spec, where, name: str, version: str) -> list:
    """``rollback_requested`` (a condition on ``rollback_from``) and ``rollback`` on its true
    branch, or nothing without :func:`defers_rollback`."""
    from databricks.sdk.service import jobs as j

    from dbspec.spec.sections.monitoring import default_alias

    if not defers_rollback(spec):
        return []
    alias = str(default_alias(spec))
    check = condition("rollback_requested", f"{{{{job.parameters.{ROLLBACK_FROM}}}}}",
                      "NOT_EQUAL", NO_VERSION, "")
    back = _registry_task(
        spec, where, "rollback", ["rollback", name, "--alias", alias, "--to", version,
                                  "--expected", f"{{{{job.parameters.{ROLLBACK_FROM}}}}}"], [],
        f"The monitor job's rollback: move @{alias} back to model_version while the alerting "
        "version (rollback_from) still holds it")
    back.depends_on = [j.TaskDependency(task_key=check.task_key, outcome="true")]
    return [check, back]


def build_deployment_job(spec, where) -> Optional[Any]:
    """The deployment job (``jobs.JobSettings``), or None (see :func:`has_deployment_job`)."""
    from databricks.sdk.service import jobs as j

    if not has_deployment_job(spec):
        return None
    settings = spec.jobs
    return j.JobSettings(
        name=f"{settings.name or spec.name} deployment"[:100],
        description=f"MLflow deployment job of {spec.registry.name}: gates, approval, alias "
                    f"and endpoint for each new version (dbspec spec {spec.name})"[:1000],
        tasks=deployment_tasks(spec, where),
        job_clusters=[j.JobCluster(job_cluster_key="main", new_cluster=cluster(
            resolve_cluster(spec, "main"), mlflow_env(spec), current_user=where.current_user))],
        email_notifications=notifications(settings, failures_only=True),
        tags=job_tags(spec, where, dbspec_role="deployment"), max_concurrent_runs=1,
        queue=j.QueueSettings(enabled=True),
        parameters=[j.JobParameterDefinition(name=MODEL_NAME, default=registered_name(spec)
                                             if in_bundle(where) else spec.registry.name),
                    j.JobParameterDefinition(name=MODEL_VERSION, default="")] + (
            [j.JobParameterDefinition(name=ROLLBACK_FROM, default=NO_VERSION)]
            if defers_rollback(spec) else []))


def deployment_warnings(spec) -> list[str]:
    """How to link the deployment job where no task does (AI Runtime: one task runs it all)."""
    if not has_deployment_job(spec) or not serverless(spec):
        return []
    return ["the deployment job is not linked to the registered model (the bundle has no "
            "deployment_job_id field); after deploying, link it: dbspec link-job "
            f"{spec.registry.name} JOB_ID (JOB_ID: job {deployment_job_key(spec)})"]


def link_task(spec, where):
    """The main job's ``link_deployment_job`` task (``dbspec link-job NAME ID``), or None: it
    links the deployment job to the registered model before a new version is registered."""
    if not has_deployment_job(spec) or serverless(spec):
        return None
    name = registered_name(spec) if in_bundle(where) else spec.registry.name
    return _registry_task(spec, where, LINK_TASK, ["link-job", name, job_reference(
        where, deployment_job_key(spec))], [], "Link the deployment job to the registered model "
        "(deployment_job_id), so MLflow runs it on each new version")
