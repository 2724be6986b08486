"""The job clusters a spec asks for, resolved from ``jobs`` and ``compute``, and the Databricks
runtime rules they must follow (see :mod:`dbspec.spec.databricks` for the facts and sources).

``dbspec validate`` runs :func:`check_clusters`; ``dbspec jobs`` builds the SDK's
``ClusterSpec`` from the same :class:`ResolvedCluster`, so what is checked is what is emitted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator, NamedTuple, Optional

from dbspec.seams.compute import ComputeFinding as Problem, compute_kind
from dbspec.spec.databricks import (DEFAULT_RUNTIME, GRAVITON_FROM, MLFLOW_REQUIRED,
                                    PYTHON_REQUIRED, Resources, default_node,
                                    default_spark_version, gpus_of, is_graviton, node_cloud,
                                    parse_spark_version, unity_catalog)

if TYPE_CHECKING:
    from dbspec.spec.sections.jobs import ClusterSettings

DEDICATED = "DATA_SECURITY_MODE_DEDICATED"
_DEDICATED_MODES = (DEDICATED, "SINGLE_USER")
#: In bundles, dedicated compute defaults to the user who deploys (and so runs) the job.
CURRENT_USER = "${workspace.current_user.userName}"
_CLOUDS = {"aws": "an AWS", "azure": "an Azure", "gcp": "a Google Cloud"}
#: Task groups that run on the training cluster (see dbspec.jobs.build.GROUPS).
TRAINING_GROUPS = ("tune", "train")


class ResolvedCluster(NamedTuple):
    """A job cluster with every default filled in, and where in the spec it comes from."""

    key: str  # "main" or "training"
    path: tuple[str, ...]  # the spec field of its settings
    settings: ClusterSettings
    spark_version: str
    node_type_id: str
    num_workers: int
    resources: Resources
    data_security_mode: Optional[str]
    single_user_name: Optional[str]


def serverless(spec) -> bool:
    """Whether the spec trains on AI Runtime (then the job has no clusters of its own)."""
    return compute_kind(spec).serverless


def resolve_cluster(spec, key: str) -> ResolvedCluster:
    """The main (``key="main"``) or training cluster of ``spec``'s job."""
    jobs = spec.jobs
    settings = jobs.cluster if key == "main" else jobs.training_cluster
    # the training cluster: GPUs and workers as the compute kind asks
    resources = Resources(0, 0, False) if key == "main" else \
        compute_kind(spec).resources(spec.compute)
    gpu = resources.gpus_per_node > 0
    node = settings.node_type_id or default_node(jobs.cloud, resources.gpus_per_node,
                                                 settings.graviton and not gpu)
    workers = settings.num_workers if settings.num_workers is not None \
        else resources.num_workers
    if settings.use_ml_runtime:
        major, minor = DEFAULT_RUNTIME.version
        version = settings.spark_version or f"{major}.{minor}.x-scala{DEFAULT_RUNTIME.scala}"
    else:
        version = settings.spark_version or default_spark_version(gpu)
    mode = settings.data_security_mode or (DEDICATED if unity_catalog(spec) else None)
    user = settings.single_user_name or (CURRENT_USER if mode in _DEDICATED_MODES else None)
    return ResolvedCluster(key, ("jobs", "cluster" if key == "main" else "training_cluster"),
                           settings, version, node, workers, resources, mode, user)


# --- rules ----------------------------------------------------------------------------------

def check_clusters(spec) -> list[Problem]:
    """Every Databricks runtime rule the spec's job clusters break (none on AI Runtime, which
    has no job clusters: its kind checks what it needs)."""
    if serverless(spec):
        return []
    problems: list[Problem] = []
    for key in ("main", "training"):
        problems.extend(_check_cluster(spec, resolve_cluster(spec, key)))
    return problems


def _check_cluster(spec, c: ResolvedCluster) -> Iterator[Problem]:
    settings, cloud = c.settings, spec.jobs.cloud
    path = c.path
    training = c.key == "training"
    name = parse_spark_version(c.spark_version)
    node_path = path + ("node_type_id",) if settings.node_type_id else ("compute",)
    version_path = path + ("spark_version",)
    if name is None:
        yield Problem(version_path, f"'{c.spark_version}' is not a Databricks runtime version "
                      f"(such as {default_spark_version(False)})")
        return
    ml = name.ml or bool(settings.use_ml_runtime)
    if name.photon:
        yield Problem(version_path, f"'{c.spark_version}': -photon- runtime strings are the old "
                      "form; use the plain runtime with runtime_engine: PHOTON (CPU clusters only)")
        return
    cloud_of = node_cloud(c.node_type_id)
    if settings.node_type_id and cloud_of is not None and cloud_of != cloud:
        yield Problem(node_path, f"'{c.node_type_id}' is named like {_CLOUDS[cloud_of]} node "
                      f"type but jobs.cloud is {cloud}; set jobs.cloud: {cloud_of}, or pick one of "
                      f"the {cloud} node types")
        return
    node_gpus = gpus_of(c.node_type_id, cloud)
    if settings.driver_node_type_id and c.resources.gpus_per_node and not c.resources.on_executors:
        node_gpus = gpus_of(settings.driver_node_type_id, cloud)  # ranks run on the driver
    gpu_node = node_gpus is None or node_gpus > 0
    yield from _check_engine(settings, path, gpu_node, training)
    if settings.use_ml_runtime and settings.kind is None:  # its one value is CLASSIC_PREVIEW
        yield Problem(path + ("use_ml_runtime",), "use_ml_runtime needs kind: CLASSIC_PREVIEW "
                      "(the Clusters API refuses it otherwise)")
    if settings.use_ml_runtime and (name.ml or name.gpu):
        yield Problem(version_path, f"with use_ml_runtime give the plain runtime (such as "
                      f"{name.version[0]}.{name.version[1]}.x-scala2.13): the ML and GPU variant "
                      "follow from the flag and the node type")
    if training and not ml:
        yield Problem(version_path, f"'{c.spark_version}' is not an ML runtime: training needs "
                      "PyTorch, MLflow and TorchDistributor from Databricks Runtime ML (a "
                      "-ml- version, or use_ml_runtime: true)")
    if not settings.use_ml_runtime and ml and settings.spark_version:  # a default one fits
        if name.gpu and not gpu_node:
            yield Problem(version_path, f"'{c.spark_version}' is a GPU runtime but "
                          f"'{c.node_type_id}' has no GPU; use a GPU node type or the -cpu- "
                          "runtime")
        if not name.gpu and gpu_node:
            yield Problem(version_path, f"'{c.spark_version}' is a CPU runtime on GPU node "
                          f"'{c.node_type_id}': the GPUs would sit unused without CUDA; use the "
                          "-gpu- runtime")
    if c.resources.gpus_per_node and node_gpus is not None:
        if node_gpus == 0:
            yield Problem(node_path, f"training needs {c.resources.gpus_per_node} GPU(s) per "
                          f"node but '{c.node_type_id}' has none")
        elif c.resources.gpus_per_node > node_gpus:
            yield Problem(("compute",), f"{c.resources.gpus_per_node} ranks on one node need "
                          f"{c.resources.gpus_per_node} GPUs but '{c.node_type_id}' has "
                          f"{node_gpus}; lower the process count, use more nodes (local_mode: "
                          "false), or a larger node type")
    yield from _check_arm(c, cloud, name.version, gpu_node)
    yield from _check_runtime_line(name, version_path, c.resources.gpus_per_node > 0)
    yield from _check_access(spec, c, path)


def _check_engine(settings, path, gpu_node: bool, training: bool) -> Iterator[Problem]:
    if settings.runtime_engine != "PHOTON":
        return
    if gpu_node:
        yield Problem(path + ("runtime_engine",), "Photon is not supported on GPU instance "
                      "types; remove runtime_engine: PHOTON")
    elif training:
        yield Problem(path + ("runtime_engine",), "Photon speeds up Spark SQL and DataFrames, "
                      "not PyTorch training; set it on jobs.cluster (data and batch tasks) only")


def _check_arm(c: ResolvedCluster, cloud: str, version: tuple[int, int],
               gpu_node: bool) -> Iterator[Problem]:
    nodes = [n for n in (c.node_type_id, c.settings.driver_node_type_id) if n]
    graviton = [n for n in nodes if is_graviton(n)]
    if c.settings.graviton and cloud != "aws":
        yield Problem(c.path + ("graviton",), f"Graviton is an AWS instance family; jobs.cloud "
                      f"is {cloud}")
    if c.settings.graviton and c.resources.gpus_per_node:
        yield Problem(c.path + ("graviton",), "Graviton nodes have no GPUs; this cluster trains "
                      "on GPUs")
    if graviton and version < GRAVITON_FROM:
        yield Problem(c.path + ("spark_version",), f"Graviton node '{graviton[0]}' needs "
                      f"Databricks Runtime ML {GRAVITON_FROM[0]}.{GRAVITON_FROM[1]} LTS or later, "
                      f"not {version[0]}.{version[1]}")


def _check_runtime_line(name, version_path, gpu: bool) -> Iterator[Problem]:
    runtime = name.runtime
    if runtime is None:
        yield Problem(version_path, f"runtime {name.version[0]}.{name.version[1]} is not in "
                      "dbspec's runtime table, so its MLflow and Python are not checked",
                      warning=True)
        return
    label = f"{runtime.label} ML (MLflow {runtime.mlflow}, Python {runtime.python})"
    if runtime.version_of("mlflow") < MLFLOW_REQUIRED:
        yield Problem(version_path, f"{label} is too old for dbspec, which needs MLflow 3 "
                      "(log_model(name=...), logged-model registration); use "
                      f"{DEFAULT_RUNTIME.label} ML or newer ({default_spark_version(gpu)})")
    elif runtime.version_of("python") < PYTHON_REQUIRED:
        yield Problem(version_path, f"{label}: dbspec needs Python 3.10 or newer")


def _check_access(spec, c: ResolvedCluster, path) -> Iterator[Problem]:
    if not unity_catalog(spec):
        return
    mode = c.data_security_mode
    if mode in ("DATA_SECURITY_MODE_STANDARD", "USER_ISOLATION", "NONE"):
        yield Problem(path + ("data_security_mode",), f"{mode}: Databricks Runtime ML reaches "
                      "Unity Catalog (this spec's registry or data) only in dedicated access "
                      "mode; use DATA_SECURITY_MODE_DEDICATED with single_user_name (a user or "
                      "a group)")
