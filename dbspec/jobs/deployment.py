"""The MLflow 3 deployment job of a Unity Catalog model, from the spec's ``registry.promotion``.

A job with ``model_name`` and ``model_version`` parameters that MLflow runs on each new version:
per promotion stage a task re-checking the stage's gates and moving its alias (``dbspec
promote``); a stage that requires approval first passes an approval task (``approval_<alias>``,
which succeeds once the version carries a tag of that name with the value ``approved``, the tag
the UI's Approve button sets), then ``dbspec approve``; last the ``update_endpoint`` task moves
the serving endpoint. One run at a time, queued, so promotions of one model never overlap.

The bundle's ``registered_models`` resource has no ``deployment_job_id`` field: ``dbspec jobs``
prints the command that links the deployed job to the model.
"""

from __future__ import annotations

from typing import Any, Optional

from dbspec.jobs.resources import ENDPOINT_PACKAGES, endpoint_task, registered_name
from dbspec.jobs.tasks import (cluster, dbspec_task, job_key, job_tags, mlflow_env,
                               notifications, task_libraries)
from dbspec.spec.clusters import resolve_cluster

#: The job parameters MLflow sets when it runs a deployment job.
MODEL_NAME, MODEL_VERSION = "model_name", "model_version"
#: The value of the approval tag that lets an approval task pass (what the UI's Approve sets).
APPROVED = "approved"


def deployment_job_key(spec) -> str:
    """The deployment job's resource key, beside the main job's."""
    return f"{job_key(spec)}_deployment"


def has_deployment_job(spec) -> bool:
    """Whether ``spec`` gets a deployment job: a Unity Catalog model with promotion stages."""
    registry = spec.registry
    return registry is not None and registry.name.count(".") == 2 and bool(registry.promotion_stages())


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
    """The tasks, in order: per stage (approval, then) promotion; then ``update_endpoint``."""
    name, version = f"{{{{job.parameters.{MODEL_NAME}}}}}", f"{{{{job.parameters.{MODEL_VERSION}}}}}"
    tasks: list = []
    upstream: list[str] = []
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
    update = endpoint_task(spec, where)
    if update is not None:
        from databricks.sdk.service import jobs as j

        update.depends_on = [j.TaskDependency(task_key=u) for u in upstream]
        tasks.append(update)
    return tasks


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
        parameters=[j.JobParameterDefinition(name=MODEL_NAME, default=registered_name(spec)),
                    j.JobParameterDefinition(name=MODEL_VERSION, default="")])


def deployment_warnings(spec) -> list[str]:
    """How to link the deployment job, which no bundle field does."""
    if not has_deployment_job(spec):
        return []
    return ["the deployment job is not linked to the registered model (the bundle has no "
            "deployment_job_id field); after deploying, link it: " + link_command(spec)]


def link_command(spec) -> str:
    """The command linking the deployed job to the registered model."""
    return (f"MLFLOW_REGISTRY_URI=databricks-uc python -c \"import mlflow; mlflow.MlflowClient()"
            f".update_registered_model('{spec.registry.name}', deployment_job_id='JOB_ID')\" "
            f"(JOB_ID: job {deployment_job_key(spec)} once deployed)")


def retrain_tasks(spec, where, monitor: str) -> list:
    """With ``monitoring.retrain`` in a bundle: a condition on the monitor task's result
    (it fails on an alert) and a ``run_job_task`` starting the training job when it failed."""
    from databricks.sdk.service import jobs as j

    if spec.monitoring is None or not spec.monitoring.retrain or \
            not where.spec_path.startswith("${workspace."):
        return []
    check = j.Task(task_key="alerted", depends_on=[j.TaskDependency(task_key=monitor)],
                   run_if=j.RunIf.ALL_DONE, description="Whether the monitor task failed "
                   "(an alert: drift or a quality drop)",
                   condition_task=j.ConditionTask(op=j.ConditionTaskOp.EQUAL_TO, right="failed",
                                                  left=f"{{{{tasks.{monitor}.result_state}}}}"))
    return [check, j.Task(
        task_key="retrain", depends_on=[j.TaskDependency(task_key="alerted", outcome="true")],
        description="Retrain: start the training job (its new version then runs through the "
                    "deployment job's gates and approval)",
        run_job_task=j.RunJobTask(job_id=f"${{resources.jobs.{job_key(spec)}.id}}"))]  # type: ignore[arg-type]
