"""``jobs``: what ``dbspec jobs`` puts in the generated Databricks job (schedule, clusters,
notifications, permissions, retries, the shared directory). Every field is optional; targets
override it."""

import posixpath
import re
from typing import Annotated, Literal, Optional

from pydantic import AfterValidator, StringConstraints, model_validator

from dbspec.spec.sections.base import SpecModel, d, section

_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+$")
#: The tasks of a generated job (``jobs.tasks`` keys): the stage groups, then the endpoint task.
TASK_GROUPS = ("data", "tune", "train", "evaluate", "promote", "serve", "batch_predict",
               "update_endpoint", "monitor")
#: URI schemes of shared storage that dbspec can open with file I/O (DBFS, through /dbfs on
#: every node). Ranks and trials torch.save and glob in the shared dir, so object storage
#: (s3://, abfss://, gs://) is reached through a Unity Catalog Volume or a mount instead.
SHARED_SCHEMES = ("dbfs",)
_OBJECT_STORES = ("s3", "s3a", "s3n", "gs", "abfs", "abfss", "wasb", "wasbs", "r2")
#: Where Databricks mounts each node's own disk: nothing written there leaves the node.
NODE_LOCAL = "/local_disk0"
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")


def _refuse_node_disk(value: str, why: str) -> None:
    """Raise ValueError when ``value`` (a POSIX path, or a ``file:`` URI) lies on a node's local
    disk, saying ``why`` that cannot work."""
    path = value.removeprefix("file:")
    normal = posixpath.normpath("/" + path.lstrip("/"))
    if path.startswith("/") and (normal == NODE_LOCAL or normal.startswith(NODE_LOCAL + "/")):
        raise ValueError(f"'{value}' is on a node's local disk ({NODE_LOCAL}); {why}: give a "
                         "directory every node reaches, such as a Unity Catalog Volume "
                         "(/Volumes/<catalog>/<schema>/<volume>)")


def check_shared_dir(value: str) -> str:
    """``value`` if it names storage every node of a cluster reaches: an absolute path
    (``/Volumes/...``, ``/dbfs/...``, a shared mount) or ``dbfs:/...``.

    Raises:
        ValueError: a relative or node-local path, another URI scheme, or a ``/Volumes`` path
            that stops before the volume.
    """
    _refuse_node_disk(value, "training ranks and tasks on other nodes cannot read it")
    scheme = _SCHEME.match(value)
    if scheme:
        name = scheme.group(1).lower()
        if name in _OBJECT_STORES:
            raise ValueError(f"'{value}': ranks and trials read and write the shared dir with "
                             "file I/O, which object storage does not offer; use a Unity Catalog "
                             "Volume over it (/Volumes/<catalog>/<schema>/<volume>) or a mount")
        if name not in SHARED_SCHEMES:
            raise ValueError(f"'{value}': unknown storage scheme '{scheme.group(1)}:'; use an "
                             "absolute path, a /Volumes path or dbfs:/")
        return value
    if not value.startswith("/"):
        raise ValueError(f"'{value}' is relative, so each task would resolve it on its own node; "
                         "give an absolute path such as /Volumes/<catalog>/<schema>/<volume>")
    _check_volume(value)
    return value


def _check_volume(value: str) -> None:
    # /Volumes/<catalog>/<schema> is not writable: files live inside a volume
    parts = [p for p in posixpath.normpath(value).split("/") if p]
    if parts and parts[0] == "Volumes" and len(parts) < 4:
        raise ValueError(f"'{value}' stops before the volume; a Unity Catalog Volume path is "
                         "/Volumes/<catalog>/<schema>/<volume>[/<folder>...]")


def check_state_dir(value: str) -> str:
    """``value`` if a task can use it as its state directory (``dbspec run --state-dir``).

    Raises:
        ValueError: a relative path, a URI (the state dir is opened as a local directory), or
            a node-local path (a later task, retry or repair may run on another node).
    """
    _refuse_node_disk(value, "a later task, a retry or a repair may run on another node and "
                      "not find it")
    if _SCHEME.match(value):
        raise ValueError(f"'{value}': the state dir is opened as a local directory; use a "
                         "mounted path (/Volumes/..., /dbfs/...) or leave it unset")
    if not value.startswith("/"):
        raise ValueError(f"'{value}' is relative to whatever directory a task starts in; give "
                         "an absolute path or leave it unset")
    _check_volume(value)
    return value


_Text = StringConstraints(min_length=1)
SharedDir = Annotated[str, _Text, AfterValidator(check_shared_dir)]
StateDir = Annotated[str, _Text, AfterValidator(check_state_dir)]


class ScheduleSpec(SpecModel):
    """When the job runs on its own."""

    quartz_cron: str = d("Quartz cron expression (seconds first), e.g. '0 0 3 * * ?'.",
                         pattern=r"^\S+( \S+){5,6}$")
    timezone: str = d("Java timezone id.", default="UTC", min_length=1)
    paused: bool = d("Create the schedule paused.", default=False)


class NotificationsSpec(SpecModel):
    """E-mail notifications of the job."""

    on_start: list[str] = d("Addresses told when a run starts.", default=[])
    on_success: list[str] = d("Addresses told when a run succeeds.", default=[])
    on_failure: list[str] = d("Addresses told when a run fails.", default=[])
    no_alert_for_skipped_runs: bool = d("No mail for skipped runs.", default=False)

    @model_validator(mode="after")
    def _addresses(self) -> "NotificationsSpec":
        for field in ("on_start", "on_success", "on_failure"):
            for address in getattr(self, field):
                if not _EMAIL.match(address):
                    raise ValueError(f"{field}: '{address}' is not an e-mail address")
        return self


class PermissionSpec(SpecModel):
    """One access-control entry; exactly one of user, group, service_principal."""

    level: Literal["CAN_VIEW", "CAN_MANAGE_RUN", "CAN_MANAGE", "IS_OWNER"] = d(
        "Permission level on the job.")
    user: Optional[str] = d("User name (e-mail).", default=None, min_length=1)
    group: Optional[str] = d("Group name.", default=None, min_length=1)
    service_principal: Optional[str] = d("Service principal application id.", default=None,
                                         min_length=1)

    @model_validator(mode="after")
    def _one_principal(self) -> "PermissionSpec":
        given = [k for k in ("user", "group", "service_principal") if getattr(self, k)]
        if len(given) != 1:
            raise ValueError("give exactly one of user, group, service_principal"
                             + (f" (got {', '.join(given)})" if given else ""))
        return self


class TaskSettings(SpecModel):
    """Timeout and retries of a task (unset: the job's defaults, then Databricks')."""

    timeout_seconds: Optional[int] = d("Task timeout; 0 means none.", default=None, ge=0)
    max_retries: Optional[int] = d("Retries after a failure; -1 retries forever.", default=None,
                                   ge=-1)
    min_retry_interval_ms: Optional[int] = d("Wait between retries.", default=None, ge=0)
    retry_on_timeout: Optional[bool] = d("Retry a timed-out task.", default=None)


class Autoscale(SpecModel):
    """Workers that follow the load: for clusters whose workers are not training ranks."""

    min_workers: int = d("Fewest workers.", default=1, ge=0)
    max_workers: int = d("Most workers; more than min_workers.", default=4, ge=1)

    @model_validator(mode="after")
    def _ordered(self) -> "Autoscale":
        if self.max_workers <= self.min_workers:
            raise ValueError(f"max_workers ({self.max_workers}) must be greater than "
                             f"min_workers ({self.min_workers})")
        return self


class DockerImage(SpecModel):
    """A custom image (Databricks Container Services): a standard runtime, never ML; on GPU
    nodes an image built on Databricks' GPU base image (CUDA)."""

    url: str = d("Image URL, e.g. registry.example.com/team/dbspec-gpu:1.0.", min_length=1)
    username: Optional[str] = d("Registry user.", default=None, min_length=1)
    password_secret: Optional[str] = d(
        "The registry password as a Databricks secret, 'scope/key' (never the password).",
        default=None, pattern=r"^[\w.-]+/[\w.-]+$")

    @model_validator(mode="after")
    def _paired(self) -> "DockerImage":
        if (self.username is None) != (self.password_secret is None):
            raise ValueError("give username and password_secret together, or neither")
        return self


class ClusterSettings(SpecModel):
    """A job cluster; unset fields follow from ``compute`` (GPU runtime, node type, workers)."""

    spark_version: Optional[str] = d("Databricks runtime, e.g. 15.4.x-gpu-ml-scala2.12.",
                                     default=None, min_length=1)
    node_type_id: Optional[str] = d("Worker (and driver) node type.", default=None, min_length=1)
    driver_node_type_id: Optional[str] = d("Driver node type, when it differs.", default=None,
                                           min_length=1)
    num_workers: Optional[int] = d("Workers; 0 makes a single-node cluster.", default=None, ge=0)
    autoscale: Optional[Autoscale] = d(
        "Autoscaling instead of num_workers; not where the workers are training ranks. Default "
        "on the main cluster when its tasks use Spark (a spark_table source, batch scoring on "
        "Spark): 1 to 4 workers; else a single node.", default=None)
    docker_image: Optional[DockerImage] = d(
        "A custom container image; the cluster then runs the standard runtime it names (default "
        "the LTS line without ML), and the image must supply PyTorch and MLflow.", default=None)
    policy_id: Optional[str] = d("Cluster policy.", default=None, min_length=1)
    spark_conf: dict[str, str] = d("Extra Spark configuration.", default={})
    custom_tags: dict[str, str] = d("Tags on the cluster's cloud resources.",
                                    default={})
    data_security_mode: Optional[Literal[
        "DATA_SECURITY_MODE_DEDICATED", "DATA_SECURITY_MODE_STANDARD", "DATA_SECURITY_MODE_AUTO",
        "SINGLE_USER", "USER_ISOLATION", "NONE"]] = d(
        "Access mode. Default: DATA_SECURITY_MODE_DEDICATED when the registry or the data are "
        "in Unity Catalog (Runtime ML reaches Unity Catalog on dedicated compute only), else "
        "DATA_SECURITY_MODE_AUTO (Databricks picks from the runtime).", default=None)
    single_user_name: Optional[str] = d(
        "The principal of dedicated compute: a user (e-mail) or a group, whose members then "
        "share the cluster with the group's permissions. Default in bundles: the deploying "
        "user (${workspace.current_user.userName}).", default=None, min_length=1)
    runtime_engine: Optional[Literal["STANDARD", "PHOTON"]] = d(
        "PHOTON speeds up Spark SQL and DataFrame work, not PyTorch; allowed on CPU clusters "
        "only (data, evaluation and batch tasks), never on GPU nodes.", default=None)
    use_ml_runtime: Optional[bool] = d(
        "The Clusters API's newer form: a plain spark_version (e.g. 17.3.x-scala2.13) plus the "
        "ML runtime flag; needs kind: CLASSIC_PREVIEW.", default=None)
    kind: Optional[Literal["CLASSIC_PREVIEW"]] = d("Cluster kind (with use_ml_runtime).",
                                                   default=None)
    graviton: bool = d("Default CPU nodes are AWS Graviton (ARM) types (15.4 LTS ML and later, "
                       "CPU only).", default=False)


class JobsSpec(SpecModel):
    """The production job generated by ``dbspec jobs``."""

    name: Optional[str] = d("Job name; default: the spec's name.", default=None, min_length=1,
                            max_length=100)
    workspace_root: str = d("Workspace folder the jobs-json format expects the spec and the wheel "
                            "in (bundles upload them).", default="/Workspace/Shared/dbspec",
                            pattern=r"^(/Workspace|/Volumes|dbfs:)/")
    shared_dir: Optional[SharedDir] = d(
        "Directory every node of the job's clusters reaches, passed to each task as "
        "'dbspec run --shared-dir': distributed training ranks, Spark trial tasks and checkpoints "
        "live there (stage outputs travel in the run key's MLflow run). An absolute path such "
        "as a Unity Catalog Volume (/Volumes/<catalog>/<schema>/<volume>), dbfs:/... or a cloud "
        "URI; never relative or under /local_disk0. Default: spark.shared_dir when it is such a "
        "directory, else /Volumes/<catalog>/<schema>/dbspec from a three-part registry.name, "
        "else /Volumes/main/default/dbspec (the volume must exist). Bundles take it from the "
        "'shared_dir' bundle variable, jobs-json from the 'shared_dir' job parameter; both can "
        "be overridden at deploy or run time.", default=None)
    state_dir: Optional[StateDir] = d(
        "State directory of every task ('dbspec run --state-dir'); unset: node-local scratch "
        "in the task's working directory, since tasks hand over through MLflow and shared_dir. "
        "An absolute path (a mounted /Volumes/... or /dbfs/... path), never under /local_disk0.",
        default=None)
    schedule: Optional[ScheduleSpec] = d("Schedule; none: runs on demand.", default=None)
    monitor_schedule: ScheduleSpec = d(
        "With a monitoring section: when the monitor job ('dbspec monitor' on its own job "
        "cluster) and the endpoint's quality monitor run. Default: hourly, 5 minutes past the "
        "hour (the last hour's window is complete then).",
        default=ScheduleSpec(quartz_cron="0 5 * * * ?"))
    notifications: Optional[NotificationsSpec] = d("E-mail notifications.", default=None)
    tags: dict[str, str] = d("Job tags.", default={})
    permissions: list[PermissionSpec] = d("Access control.", default=[])
    max_concurrent_runs: int = d("Runs allowed at once.", default=1, ge=1, le=1000)
    timeout_seconds: int = d("Job timeout; 0 means none.", default=0, ge=0)
    task_defaults: TaskSettings = section("Timeout and retries of every task.")
    tasks: dict[Literal[TASK_GROUPS], TaskSettings] = d(  # type: ignore[valid-type]
        "Per-task overrides, by task: data, tune, train, evaluate, promote, serve, "
        "batch_predict, update_endpoint, monitor (the monitor job's task).", default={})
    cloud: Literal["aws", "azure", "gcp"] = d("Cloud of the workspace: chooses the default "
                                              "node types and checks given ones.",
                                              default="aws")
    cluster: ClusterSettings = section("The cluster of the data, evaluation and serving tasks.")
    training_cluster: ClusterSettings = section("The cluster of the tune and train tasks.")
