"""A spec's plan as a Databricks job, built with databricks-sdk's typed classes.

Stages are grouped into tasks (:data:`GROUPS`); ``depends_on`` follows the plan's edges. Each
task is a ``python_wheel_task`` running ``dbspec run SPEC --only STAGES --run-key
{{job.run_id}} --shared-dir DIR``: tasks hand stages over through the run key's MLflow run, and
ranks and trials on any node meet in the shared directory (never a node's ``/local_disk0``).
Training gets its own job cluster sized from ``compute`` where it differs from the main one.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

from dbspec.jobs.ai_runtime import ai_runtime_environments, ai_runtime_task
from dbspec.jobs.deployment import link_task
from dbspec.jobs.resources import endpoint_task, resource_warnings, role_permissions
from dbspec.jobs.tasks import (cluster, cron, dbspec_arguments, dbspec_task, job_tags,
                               mlflow_env, notifications, task_libraries)
from dbspec.plan import Plan, compile_plan
from dbspec.seams.targets import job_warnings
from dbspec.spec.clusters import (TRAINING_GROUPS, reads_through_spark, resolve_cluster,
                                  serverless, spark_trials)
from dbspec.spec.sections.jobs import check_shared_dir

#: Tasks and the stages each runs, in plan order.
GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("data", ("load_data", "split", "preprocess")),
    ("tune", ("tune",)),
    ("train", ("train",)),
    ("evaluate", ("evaluate", "register")),
    ("promote", ("promote",)),
    ("serve", ("serve",)),
    ("batch_predict", ("batch_predict",)),
)
#: The shared directory when neither the spec nor its registry suggests one: a volume in the
#: catalog and schema every Unity Catalog metastore starts with.
DEFAULT_SHARED_DIR = "/Volumes/main/default/dbspec"
SHARED_DIR = "shared_dir"
#: Node-local directories that pass as absolute paths but are no more shared than /local_disk0.
_NODE_LOCAL_HINTS = ("/tmp", "/var/tmp", "/databricks/driver")


class JobTarget(NamedTuple):
    """Where the generated job finds the spec and the dbspec wheel, and the spec's target;
    ``shared_dir`` is a bundle variable or job parameter reference (set at deploy or run time).
    """

    spec_path: str
    wheel: str
    target: Optional[str]
    shared_dir: str
    parameters: tuple[tuple[str, str], ...] = ()
    #: The principal of dedicated clusters when the spec names none (bundles: the deployer).
    current_user: Optional[str] = None
    #: Workspace path of the AI Runtime command script (``compute.kind: serverless_gpu``).
    script: Optional[str] = None
    #: ``--set`` assignments every task passes (bundles: the names of the registered model
    #: and experiment resources, which development mode prefixes per user).
    assignments: tuple[str, ...] = ()


def task_groups(plan: Plan) -> list[tuple[str, tuple[str, ...], tuple[str, ...]]]:
    """(task key, stages, upstream task keys) for the stages present in ``plan``."""
    owner = {stage: key for key, stages in GROUPS for stage in stages}
    out = []
    for key, stages in GROUPS:
        present = tuple(s for s in stages if s in plan.names)
        if not present:
            continue
        upstream = {owner[dep] for s in present for dep in plan[s].depends_on} - {key}
        out.append((key, present, tuple(k for k, _ in GROUPS if k in upstream)))
    return out


def shared_dir(spec) -> str:
    """The directory every node reaches: ``jobs.shared_dir``, else ``spark.shared_dir`` when it
    names shared storage, else a ``dbspec`` volume beside a Unity Catalog registered model,
    else :data:`DEFAULT_SHARED_DIR`."""
    if spec.jobs.shared_dir:
        return spec.jobs.shared_dir
    # spark.shared_dir also serves local runs, where a relative or node-local path is fine;
    # a job passes --shared-dir, which wins over it, so reuse it only when it fits a cluster
    spark_dir = getattr(spec.spark, "shared_dir", None)
    if spark_dir:
        try:
            return check_shared_dir(str(spark_dir))
        except ValueError:
            pass
    if spec.registry is not None and spec.registry.name.count(".") == 2:
        catalog, schema, _ = spec.registry.name.split(".")
        return f"/Volumes/{catalog}/{schema}/dbspec"
    return DEFAULT_SHARED_DIR


def task_parameters(spec, where: JobTarget, stages: tuple[str, ...]) -> list[str]:
    """The ``dbspec`` command line of the task running ``stages``."""
    parameters = dbspec_arguments("run", where) + ["--only", ",".join(stages), "--run-key",
                                                   "{{job.run_id}}", "--shared-dir",
                                                   where.shared_dir]
    if spec.executor != "spark" and (  # the cluster's Spark reads the data, runs the trials
            "load_data" in stages and reads_through_spark(spec)
            or "tune" in stages and spark_trials(spec)):
        parameters += ["--executor", "spark"]
    if spec.jobs.state_dir:  # else node-local scratch: nothing is handed over through it
        parameters += ["--state-dir", spec.jobs.state_dir]
    return parameters + ["--quiet"]


def build_job(spec, where: JobTarget):
    """The job for ``spec`` as ``jobs.JobSettings``."""
    from databricks.sdk.service import jobs as j

    settings = spec.jobs
    groups = task_groups(compile_plan(spec))
    clusters: dict[str, Any] = {}
    link = None
    if serverless(spec):
        tasks = [ai_runtime_task(spec, str(where.script),
                                 [s for _, group, _ in groups for s in group])]
    else:
        clusters = job_clusters(spec, where, groups)
        tasks = [wheel_task(spec, where, group, clusters) for group in groups]
        link = link_task(spec, where)  # before a version is registered, so MLflow runs the job
        registers = next((t for t in tasks if "register" in dict(GROUPS)[t.task_key]), None)
        if link is not None and registers is not None:
            registers.depends_on = [*(registers.depends_on or []),
                                    j.TaskDependency(task_key=link.task_key)]
            tasks.insert(0, link)
    # the endpoint follows the alias (realtime serving); with a linked deployment job, the run's
    # promote stage leaves the version to that job, which moves the alias and the endpoint
    update = endpoint_task(spec, where) if link is None else None
    if update is not None:
        tasks.append(update)
    return j.JobSettings(
        name=settings.name or spec.name,
        description=(spec.description.strip() or f"dbspec spec {spec.name}")[:1000],
        tasks=tasks,
        job_clusters=[j.JobCluster(job_cluster_key=k, new_cluster=c)
                      for k, c in clusters.items()] or None,
        email_notifications=notifications(settings),
        schedule=cron(settings.schedule) if settings.schedule is not None else None,
        tags=job_tags(spec, where),
        max_concurrent_runs=settings.max_concurrent_runs,
        timeout_seconds=settings.timeout_seconds or None,
        parameters=[j.JobParameterDefinition(name=name, default=default)
                    for name, default in where.parameters] or None,
        environments=ai_runtime_environments(spec) if serverless(spec) else None,
        queue=j.QueueSettings(enabled=True))


def job_clusters(spec, where: JobTarget, groups) -> dict[str, Any]:
    """The job clusters by key: ``main``, and ``training`` where training tasks need another."""
    env = mlflow_env(spec)
    clusters = {"main": cluster(resolve_cluster(spec, "main"), env,
                                current_user=where.current_user)}
    if any(key in TRAINING_GROUPS for key, _, _ in groups):
        training = cluster(resolve_cluster(spec, "training"), env,
                           current_user=where.current_user)
        if training != clusters["main"]:  # else the tasks share one cluster
            clusters["training"] = training
    return clusters


def wheel_task(spec, where: JobTarget, group: tuple[str, tuple[str, ...], tuple[str, ...]],
               clusters: dict[str, Any]):
    """The ``python_wheel_task`` running one group of stages (see :func:`task_groups`)."""
    key, stages, upstream = group
    return dbspec_task(
        spec, key, task_parameters(spec, where, stages),
        libraries=task_libraries(spec, stages, where.wheel), upstream=upstream,
        description=f"dbspec stages: {', '.join(stages)}",
        job_cluster_key="training" if key in TRAINING_GROUPS and "training" in clusters
        else "main")


def access_control(spec) -> list:
    """``jobs.JobAccessControlRequest`` entries from ``jobs.permissions``, then the roles' (a
    principal named in both keeps its ``jobs.permissions`` level)."""
    from databricks.sdk.service import jobs as j

    return [j.JobAccessControlRequest(
        user_name=p.user, group_name=p.group, service_principal_name=p.service_principal,
        permission_level=j.JobPermissionLevel(p.level)) for p in spec.jobs.permissions] + \
        role_permissions(spec)


def warnings_for(spec) -> list[str]:
    """What would break on Databricks although the spec is valid."""
    found = []
    experiment = spec.tracking.experiment
    if not experiment or not experiment.startswith(("/Users/", "/Shared/", "/Workspace/")):
        found.append(f"tracking.experiment is '{experiment or spec.name}': MLflow on Databricks "
                     "needs a workspace path such as /Shared/<name> (set it in this target)")
    chosen = spec.jobs.shared_dir or ""
    if chosen.startswith(tuple(h + "/" for h in _NODE_LOCAL_HINTS)) or chosen in _NODE_LOCAL_HINTS:
        found.append(f"jobs.shared_dir '{chosen}' is on each node's own disk; ranks and tasks on "
                     "other nodes will not see each other's files (use a /Volumes path)")
    found += job_warnings(spec)  # the serving mode's targets say what breaks in a job
    found += resource_warnings(spec)
    return found
