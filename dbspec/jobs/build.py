"""A spec's plan as a Databricks job, built with databricks-sdk's typed classes.

Stages are grouped into tasks (data -> [tune] -> train -> evaluate -> promote -> serve or
batch_predict); ``depends_on`` follows the plan's edges. Each task is a ``python_wheel_task`` of
the ``dbspec`` package running ``dbspec run SPEC --target T --only STAGES --run-key
{{job.run_id}} --shared-dir DIR``: the tasks hand their stages over through the run key's MLflow
run, and ranks and trial tasks on any node meet in the shared directory (never a node's
``/local_disk0``). Training gets its own job cluster sized from ``compute``: a GPU ML runtime,
GPUs per node, workers from the process count.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

from dbspec.plan import Plan, compile_plan
from dbspec.spec.models.jobs import check_shared_dir

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
TRAINING_GROUPS = ("tune", "train")
DEFAULT_RUNTIME = "15.4.x-{kind}-ml-scala2.12"
CPU_NODE = "i3.xlarge"
GPU_NODES = ((1, "g5.xlarge"), (4, "g5.12xlarge"), (8, "p4d.24xlarge"))
#: The shared directory when neither the spec nor its registry suggests one: a volume in the
#: catalog and schema every Unity Catalog metastore starts with.
DEFAULT_SHARED_DIR = "/Volumes/main/default/dbspec"
SHARED_DIR = "shared_dir"
#: Node-local directories that pass as absolute paths but are no more shared than /local_disk0.
_NODE_LOCAL_HINTS = ("/tmp", "/var/tmp", "/databricks/driver")


class JobTarget(NamedTuple):
    """Where the generated job finds the spec and the dbspec wheel, and the spec's target.

    ``shared_dir`` is what each task passes to ``--shared-dir``: a bundle variable or job
    parameter reference, so that the value can change at deploy or run time without editing
    tasks. ``parameters`` are the job's parameters as (name, default).
    """

    spec_path: str
    wheel: str
    target: Optional[str]
    shared_dir: str
    parameters: tuple[tuple[str, str], ...] = ()


class Resources(NamedTuple):
    """What a cluster needs for training: GPUs per node and workers."""

    gpus_per_node: int
    num_workers: int
    on_executors: bool


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


def training_resources(spec) -> Resources:
    """GPUs and workers the training cluster needs, from ``compute``."""
    compute = spec.compute
    if compute.kind == "single_gpu" or compute.kind == "local" and compute.device == "cuda":
        return Resources(1, 0, False)
    if compute.kind == "torch_distributor" and compute.use_gpu is not False:
        if compute.local_mode:
            return Resources(compute.num_processes, 0, False)
        return Resources(1, compute.num_processes, True)
    if compute.kind == "deepspeed" and compute.use_gpu:
        if compute.local_mode and compute.num_nodes == 1:
            return Resources(compute.num_gpus, 0, False)
        return Resources(compute.num_gpus, compute.num_nodes, True)
    return Resources(0, 0, False)


def cluster(settings, resources: Resources, env: dict[str, str]):
    """A ``compute.ClusterSpec`` from the spec's cluster settings and the training needs."""
    from databricks.sdk.service.compute import ClusterSpec

    gpu = resources.gpus_per_node > 0
    workers = settings.num_workers if settings.num_workers is not None else resources.num_workers
    node = settings.node_type_id or (
        next((n for limit, n in GPU_NODES if resources.gpus_per_node <= limit), GPU_NODES[-1][1])
        if gpu else CPU_NODE)
    conf = {}
    tags = dict(settings.custom_tags)
    if workers == 0:  # a single-node cluster, the way the Clusters API expects it
        conf.update({"spark.databricks.cluster.profile": "singleNode",
                     "spark.master": "local[*, 4]"})
        tags["ResourceClass"] = "SingleNode"
    if gpu and resources.on_executors:
        conf["spark.task.resource.gpu.amount"] = str(resources.gpus_per_node)
    conf.update(settings.spark_conf)
    return ClusterSpec(
        spark_version=settings.spark_version or DEFAULT_RUNTIME.format(kind="gpu" if gpu
                                                                       else "cpu"),
        node_type_id=node, driver_node_type_id=settings.driver_node_type_id,
        num_workers=workers, policy_id=settings.policy_id,
        spark_conf=dict(sorted(conf.items())) or None,
        custom_tags=dict(sorted(tags.items())) or None,
        spark_env_vars=dict(sorted(env.items())) or None)


def mlflow_env(spec) -> dict[str, str]:
    """The tracking (and Unity Catalog registry) URIs the tasks need to find each other."""
    env = {"MLFLOW_TRACKING_URI": spec.tracking.tracking_uri or "databricks"}
    registry = spec.tracking.registry_uri
    if registry is None and spec.registry is not None and spec.registry.name.count(".") == 2:
        registry = "databricks-uc"
    if registry:
        env["MLFLOW_REGISTRY_URI"] = registry
    return env


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
    parameters = ["run", where.spec_path] + (["--target", where.target] if where.target else [])
    parameters += ["--only", ",".join(stages), "--run-key", "{{job.run_id}}",
                   "--shared-dir", where.shared_dir]
    if spec.jobs.state_dir:  # else node-local scratch: nothing is handed over through it
        parameters += ["--state-dir", spec.jobs.state_dir]
    return parameters + ["--quiet"]


def _task_settings(jobs, key: str) -> dict[str, Any]:
    merged = jobs.task_defaults.model_dump(exclude_none=True)
    if key in jobs.tasks:
        merged.update(jobs.tasks[key].model_dump(exclude_none=True))
    out = {}
    if "timeout_seconds" in merged:
        out["timeout_seconds"] = merged["timeout_seconds"]
    if "max_retries" in merged:
        out["max_retries"] = merged["max_retries"]
    if "min_retry_interval_ms" in merged:
        out["min_retry_interval_millis"] = merged["min_retry_interval_ms"]
    if "retry_on_timeout" in merged:
        out["retry_on_timeout"] = merged["retry_on_timeout"]
    return out


def job_key(spec) -> str:
    """The job's resource key: the spec name with only [A-Za-z0-9_]."""
    return "".join(c if c.isalnum() else "_" for c in spec.name)


def build_job(spec, where: JobTarget):
    """The job for ``spec`` as ``jobs.JobSettings``."""
    from databricks.sdk.service import jobs as j
    from databricks.sdk.service.compute import Library

    plan = compile_plan(spec)
    settings = spec.jobs
    resources = training_resources(spec)
    env = mlflow_env(spec)
    clusters = {"main": cluster(settings.cluster, Resources(0, 0, False), env)}
    groups = task_groups(plan)
    if any(key in TRAINING_GROUPS for key, _, _ in groups):
        training = cluster(settings.training_cluster, resources, env)
        if training != clusters["main"]:  # else the tasks share one cluster
            clusters["training"] = training
    tasks = []
    for key, stages, upstream in groups:
        parameters = task_parameters(spec, where, stages)
        tasks.append(j.Task(
            task_key=key,
            description=f"dbspec stages: {', '.join(stages)}",
            depends_on=[j.TaskDependency(task_key=u) for u in upstream] or None,
            job_cluster_key="training" if key in TRAINING_GROUPS and "training" in clusters
            else "main",
            python_wheel_task=j.PythonWheelTask(package_name="dbspec", entry_point="dbspec",
                                                parameters=parameters),
            libraries=[Library(whl=where.wheel)],
            **_task_settings(settings, key)))
    notifications = None
    if settings.notifications is not None:
        n = settings.notifications
        notifications = j.JobEmailNotifications(
            on_start=n.on_start or None, on_success=n.on_success or None,
            on_failure=n.on_failure or None,
            no_alert_for_skipped_runs=n.no_alert_for_skipped_runs or None)
    schedule = None
    if settings.schedule is not None:
        schedule = j.CronSchedule(
            quartz_cron_expression=settings.schedule.quartz_cron,
            timezone_id=settings.schedule.timezone,
            pause_status=j.PauseStatus.PAUSED if settings.schedule.paused
            else j.PauseStatus.UNPAUSED)
    tags = {"dbspec_spec": spec.name, **({"dbspec_target": where.target} if where.target
                                          else {}), **settings.tags}
    return j.JobSettings(
        name=settings.name or spec.name,
        description=(spec.description.strip() or f"dbspec spec {spec.name}")[:1000],
        tasks=tasks,
        job_clusters=[j.JobCluster(job_cluster_key=k, new_cluster=c)
                      for k, c in clusters.items()],
        email_notifications=notifications, schedule=schedule,
        tags=dict(sorted(tags.items())),
        max_concurrent_runs=settings.max_concurrent_runs,
        timeout_seconds=settings.timeout_seconds or None,
        parameters=[j.JobParameterDefinition(name=name, default=default)
                    for name, default in where.parameters] or None,
        queue=j.QueueSettings(enabled=True))


def access_control(spec) -> list:
    """``jobs.JobAccessControlRequest`` entries from ``jobs.permissions``."""
    from databricks.sdk.service import jobs as j

    return [j.JobAccessControlRequest(
        user_name=p.user, group_name=p.group, service_principal_name=p.service_principal,
        permission_level=j.JobPermissionLevel(p.level)) for p in spec.jobs.permissions]


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
    if spec.serving.mode == "batch" and spec.serving.batch is not None:
        if spec.serving.batch.input.startswith((".", "/tmp")):
            found.append(f"serving.batch.input '{spec.serving.batch.input}' is a local path; a "
                         "job needs a table name, a /Volumes path or cloud storage")
    return found
