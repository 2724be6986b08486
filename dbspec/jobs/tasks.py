"""The pieces of a job's tasks that the job and its resources share: the job's key, cluster
specs, the MLflow environment, task settings and the libraries each task installs."""

from __future__ import annotations

from typing import Any, Optional, Sequence

from dbspec.errors import UsageError
from dbspec.seams.compute import compute_kind
from dbspec.spec.clusters import CURRENT_USER, ResolvedCluster


def cluster(resolved: ResolvedCluster, env: dict[str, str], *, current_user: Optional[str]):
    """A ``compute.ClusterSpec`` of a resolved cluster; ``current_user`` stands in for a
    dedicated cluster's default principal (None where the format has no such reference)."""
    from databricks.sdk.service import compute as c

    settings, resources = resolved.settings, resolved.resources
    gpu = resources.gpus_per_node > 0
    conf = {}
    tags = dict(settings.custom_tags)
    scale = c.AutoScale(min_workers=resolved.autoscale[0], max_workers=resolved.autoscale[1]) \
        if resolved.autoscale else None
    if resolved.num_workers == 0 and scale is None:  # single node, as the Clusters API has it
        conf.update({"spark.databricks.cluster.profile": "singleNode",
                     "spark.master": "local[*, 4]"})
        tags["ResourceClass"] = "SingleNode"
    if gpu and resources.on_executors:
        conf["spark.task.resource.gpu.amount"] = str(resources.gpus_per_node)
    conf.update(settings.spark_conf)
    user = resolved.single_user_name
    if user == CURRENT_USER:
        user = current_user
    mode, image = resolved.data_security_mode, settings.docker_image
    auth = c.DockerBasicAuth(username=image.username, password=f"{{{{secrets/"
                             f"{image.password_secret}}}}}") if image and image.username else None
    return c.ClusterSpec(
        spark_version=resolved.spark_version,
        node_type_id=resolved.node_type_id, driver_node_type_id=settings.driver_node_type_id,
        num_workers=None if scale else resolved.num_workers, autoscale=scale,
        policy_id=settings.policy_id,
        data_security_mode=c.DataSecurityMode(mode) if mode else None,
        single_user_name=user,
        runtime_engine=c.RuntimeEngine(settings.runtime_engine) if settings.runtime_engine
        else None,
        use_ml_runtime=settings.use_ml_runtime,
        docker_image=c.DockerImage(url=image.url, basic_auth=auth) if image else None,
        kind=c.Kind(settings.kind) if settings.kind else None,
        spark_conf=dict(sorted(conf.items())) or None,
        custom_tags=dict(sorted(tags.items())) or None,
        spark_env_vars=dict(sorted(env.items())) or None)


def mlflow_env(spec) -> dict[str, str]:
    """The tracking and registry URIs every task states: MLflow 3 would otherwise take Unity
    Catalog as the registry of a workspace model."""
    tracking = spec.tracking.tracking_uri or "databricks"
    uc = spec.registry is not None and spec.registry.name.count(".") == 2
    return {"MLFLOW_TRACKING_URI": tracking, "MLFLOW_REGISTRY_URI": spec.tracking.registry_uri
            or ("databricks-uc" if uc else tracking)}


#: Task setting -> the spec's name for it (``jobs.task_defaults``, ``jobs.tasks.<key>``).
_TASK_SETTINGS = {"timeout_seconds": "timeout_seconds", "max_retries": "max_retries",
                  "min_retry_interval_millis": "min_retry_interval_ms",
                  "retry_on_timeout": "retry_on_timeout"}


def task_settings(jobs, key: str) -> dict[str, Any]:
    """Timeout and retry settings of task ``key``: ``jobs.task_defaults``, then its own."""
    merged = jobs.task_defaults.model_dump(exclude_none=True)
    if key in jobs.tasks:
        merged.update(jobs.tasks[key].model_dump(exclude_none=True))
    return {field: merged[name] for field, name in _TASK_SETTINGS.items() if name in merged}


def dbspec_arguments(command: str, where) -> list[str]:
    """``COMMAND SPEC [--target T] [--set=A...]``: how every task starts its command line."""
    return [command, where.spec_path] + (["--target", where.target] if where.target else []) \
        + [f"--set={a}" for a in where.assignments]


def dbspec_task(spec, key: str, arguments: list[str], *, libraries: list,
                upstream: Sequence[str] = (), **fields: Any):
    """The ``jobs.Task`` ``key`` running ``dbspec ARGUMENTS`` from the wheel after the tasks
    ``upstream``, with its timeout and retry settings; ``fields``: description, compute."""
    from databricks.sdk.service import jobs as j

    return j.Task(
        task_key=key, depends_on=[j.TaskDependency(task_key=u) for u in upstream] or None,
        python_wheel_task=j.PythonWheelTask(package_name="dbspec", entry_point="dbspec",
                                            parameters=arguments),
        libraries=libraries, **fields, **task_settings(spec.jobs, key))


def cron(schedule):
    """A spec's schedule (``jobs.schedule``, ``jobs.monitor_schedule``) as ``jobs.CronSchedule``."""
    from databricks.sdk.service import jobs as j

    return j.CronSchedule(
        quartz_cron_expression=schedule.quartz_cron, timezone_id=schedule.timezone,
        pause_status=j.PauseStatus.PAUSED if schedule.paused else j.PauseStatus.UNPAUSED)


def notifications(settings, *, failures_only: bool = False):
    """``jobs.notifications`` as ``jobs.JobEmailNotifications`` (None without them)."""
    from databricks.sdk.service import jobs as j

    n = settings.notifications
    if n is None:
        return None
    return j.JobEmailNotifications(
        on_start=None if failures_only else n.on_start or None,
        on_success=None if failures_only else n.on_success or None,
        on_failure=n.on_failure or None,
        no_alert_for_skipped_runs=n.no_alert_for_skipped_runs or None)


def job_tags(spec, where, **extra: str) -> dict[str, str]:
    """A job's tags, sorted: the spec, ``extra``, the target, then ``jobs.tags``."""
    tags = {"dbspec_spec": spec.name, **extra,
            **({"dbspec_target": where.target} if where.target else {}), **spec.jobs.tags}
    return dict(sorted(tags.items()))


def in_bundle(where) -> bool:
    """Whether ``where`` is a bundle's (its paths are bundle references), not a Jobs API body's."""
    return where.spec_path.startswith("${workspace.")


def job_reference(where, key: str) -> str:
    """The id of the job with resource key ``key``: a bundle reference, or in a Jobs API body a
    placeholder that ``deploy.sh`` replaces with the id of the job it created or reset."""
    if in_bundle(where):
        return f"${{resources.jobs.{key}.id}}"
    return f"${{dbspec.jobs.{key}.{where.target or 'default'}.id}}"


def job_key(spec) -> str:
    """The job's resource key: the spec name with only [A-Za-z0-9_]."""
    return "".join(c if c.isalnum() else "_" for c in spec.name)


#: Packages of dbspec's extras that tasks never install: Databricks Runtime ML ships them,
#: built for its CUDA and Spark (a PyPI wheel would replace them).
RUNTIME_PROVIDED = ("torch", "pyspark")


def extra_requirements(extra: Optional[str], keep: Sequence[str] = ()) -> list[str]:
    """The requirements of ``dbspec[extra]`` (None: of dbspec itself), read from the installed
    package's metadata (so from the same pyproject.toml the deployed wheel is built from),
    without what runtimes provide unless named in ``keep``.

    Raises:
        UsageError: dbspec's metadata is missing (not installed through pip).
    """
    import importlib.metadata
    import re

    try:
        requires = importlib.metadata.requires("dbspec") or []
    except importlib.metadata.PackageNotFoundError:
        raise UsageError("dbspec jobs reads the task libraries from dbspec's package metadata; "
                         "install dbspec with pip (pip install -e .) first") from None
    marker = re.compile(r"""extra\s*==\s*["']([\w-]+)["']""")
    out = []
    for line in requires:
        requirement, _, condition = line.partition(";")
        found = marker.search(condition)
        if (found.group(1) if found else None) != extra:
            continue
        # other markers (sys_platform != "win32") hold on Databricks' Linux nodes: dropped
        name = _distribution(requirement)
        if name in RUNTIME_PROVIDED and name not in keep or name == "dbspec":
            continue
        out.append(requirement.strip())
    return out


def _distribution(requirement: str) -> str:
    """The distribution a requirement names, lower case (``mlflow>=3.0,<4`` -> ``mlflow``)."""
    import re

    return re.split(r"[<>=!~\[ ;]", requirement.strip(), maxsplit=1)[0].lower()


def task_extras(spec, stages: tuple[str, ...]) -> tuple[str, ...]:
    """The dbspec extras the stages of one task import."""
    extras = ["train"]
    if "train" in stages or "tune" in stages:
        extras += dict.fromkeys(compute_kind(spec).extras.values())  # what the kind imports
    if "serve" in stages:
        extras.append("serve")
    if spec.model.pretrained is not None:  # the tokenizer, the network and its adapters
        extras.append("finetune")
    return tuple(extras)


def task_libraries(spec, stages: tuple[str, ...], wheel: str, *,
                   packages: Optional[tuple[str, ...]] = None) -> list:
    """The wheel (or dbspec's pinned requirement), and its extras' requirements as PyPI
    libraries (a wheel library installs the core dependencies only); ``packages`` keeps only
    those distributions' pins."""
    from databricks.sdk.service.compute import Library, PythonPyPiLibrary

    pins = [pin for extra in task_extras(spec, stages) for pin in extra_requirements(extra)]
    if packages is not None:
        wanted = {p.lower() for p in packages}
        pins = [pin for pin in pins if _distribution(pin) in wanted]
    own = Library(whl=wheel) if "/" in wheel else Library(pypi=PythonPyPiLibrary(package=wheel))
    return [own] + [Library(pypi=PythonPyPiLibrary(package=pin))
                                   for pin in dict.fromkeys(pins)]
