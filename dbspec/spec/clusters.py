"""The job clusters a spec asks for, resolved from ``jobs`` and ``compute``, and the Databricks
runtime rules they must follow (see :mod:`dbspec.spec.databricks` for the facts and sources).

``dbspec validate`` runs :func:`check_clusters`; ``dbspec jobs`` builds the SDK's
``ClusterSpec`` from the same :class:`ResolvedCluster`, so what is checked is what is emitted.
"""

from __future__ import annotations

import re
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
    autoscale: Optional[tuple[int, int]] = None  # (min, max) workers instead of num_workers


def serverless(spec) -> bool:
    """Whether the spec trains on AI Runtime (then the job has no clusters of its own)."""
    return compute_kind(spec).serverless


#: Where a job's data lies in storage its Spark reads (Unity Catalog Volumes, DBFS, clouds).
_CLUSTER_STORAGE = re.compile(r"^(/Volumes/|dbfs:|/dbfs/|(s3a?|gs|abfss?|wasbs?|r2)://)")


def reads_through_spark(spec) -> bool:
    """Whether a job's data task reads the source with the cluster's Spark: a table only Spark
    reads, or files in cluster storage (Unity Catalog Volumes, DBFS, a cloud URI)."""
    from dbspec.seams.sources import source_kind

    path = str(getattr(spec.data.source, "path", "") or "")
    return bool(getattr(source_kind(spec.data), "spark_only", False)
                or _CLUSTER_STORAGE.match(path))


def spark_work(spec) -> bool:
    """Whether the main cluster's tasks use Spark: reading the source, the spark executor, or
    batch scoring on Spark."""
    batch = getattr(spec.serving, "batch", None)
    return bool(reads_through_spark(spec) or spec.executor == "spark"
                or (batch is not None and batch.engine == "spark"))


def spark_trials(spec) -> bool:
    """Whether the tune task runs its trials as Spark tasks on the training cluster."""
    return spec.search is not None and spec.search.parallelism > 1 \
        and not compute_kind(spec).distributed


def resolve_cluster(spec, key: str) -> ResolvedCluster:
    """The main (``key="main"``) or training cluster of ``spec``'s job."""
    jobs = spec.jobs
    settings = jobs.cluster if key == "main" else jobs.training_cluster
    # the training cluster: GPUs and workers as the compute kind asks
    resources = Resources(0, 0, False) if key == "main" else \
        compute_kind(spec).resources(spec.compute)
    named = gpus_of(settings.node_type_id, jobs.cloud) if settings.node_type_id else 0
    gpu = resources.gpus_per_node > 0 or named is None or named > 0  # a GPU node: GPU runtime
    node = settings.node_type_id or default_node(jobs.cloud, resources.gpus_per_node,
                                                 settings.graviton and not gpu)
    workers = settings.num_workers if settings.num_workers is not None \
        else resources.num_workers
    if settings.use_ml_runtime or settings.docker_image is not None:
        version = settings.spark_version or default_spark_version(gpu, ml=False)
    else:
        version = settings.spark_version or default_spark_version(gpu)
    mode = settings.data_security_mode or (DEDICATED if unity_catalog(spec) else
                                           "DATA_SECURITY_MODE_AUTO")
    user = settings.single_user_name or (CURRENT_USER if mode in _DEDICATED_MODES else None)
    scale = (settings.autoscale.min_workers, settings.autoscale.max_workers) \
        if settings.autoscale else None
    if scale is None and settings.num_workers is None and not resources.num_workers and (
            spark_work(spec) if key == "main" else spark_trials(spec)):
        # workers that are no training ranks follow the load: Spark reads, scoring, trials
        scale = (1, max(4, spec.search.parallelism) if key != "main" else 4)
    return ResolvedCluster(key, ("jobs", "cluster" if key == "main" else "training_cluster"),
                           settings, version, node, workers, resources, mode, user, scale)


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
    yield from _check_ml_flag(settings, path, name)
    image = settings.docker_image
    if not ml and image is None:
        yield Problem(version_path, f"'{c.spark_version}' is not an ML runtime: dbspec's tasks "
                      "import PyTorch and MLflow, which Databricks Runtime ML ships (a -ml- "
                      "version, or use_ml_runtime: true), or give a docker_image that has them")
    yield from _check_image(c, path, ml, gpu_node)
    yield from _check_autoscale(c, path)
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


def _check_ml_flag(settings, path, name) -> Iterator[Problem]:
    if settings.use_ml_runtime and settings.kind is None:  # its one value is CLASSIC_PREVIEW
        yield Problem(path + ("use_ml_runtime",), "use_ml_runtime needs kind: CLASSIC_PREVIEW "
                      "(the Clusters API refuses it otherwise)")
    if settings.use_ml_runtime and (name.ml or name.gpu):
        yield Problem(path + ("spark_version",), f"with use_ml_runtime give the plain runtime "
                      f"(such as {name.version[0]}.{name.version[1]}.x-scala2.13): the ML and GPU "
                      "variant follow from the flag and the node type")


def _check_image(c: ResolvedCluster, path, ml: bool, gpu_node: bool) -> Iterator[Problem]:
    """Databricks Container Services: a standard runtime, not on Graviton or standard access
    mode, on GPU nodes an image on the GPU (CUDA) base."""
    image = c.settings.docker_image
    if image is None:
        return
    where = path + ("docker_image",)
    if ml:
        yield Problem(path + ("spark_version",), f"'{c.spark_version}': Databricks Runtime ML "
                      "does not run custom images (Container Services); use a standard runtime "
                      f"such as {default_spark_version(gpu_node, ml=False)}, or drop docker_image")
    if c.settings.graviton or is_graviton(c.node_type_id):
        yield Problem(where, "Container Services does not run on AWS Graviton nodes")
    if c.data_security_mode in ("DATA_SECURITY_MODE_STANDARD", "USER_ISOLATION"):
        yield Problem(path + ("data_security_mode",), "Container Services does not run in "
                      "standard (shared) access mode; use dedicated")
    if gpu_node and not any(w in image.url.lower() for w in ("gpu", "cuda")):
        yield Problem(where + ("url",), f"'{image.url}' on GPU node '{c.node_type_id}': the image "
                      "must be built on Databricks' GPU base image (CUDA), or the GPUs sit "
                      "unused; name it so (gpu/cuda) once it is", warning=True)


def _check_autoscale(c: ResolvedCluster, path) -> Iterator[Problem]:
    if c.settings.autoscale is None:
        return
    if c.settings.num_workers is not None:
        yield Problem(path + ("autoscale",), "give num_workers or autoscale, not both")
    elif c.resources.num_workers:
        yield Problem(path + ("autoscale",), f"this cluster's {c.resources.num_workers} worker(s) "
                      "are training ranks, which cannot come and go; remove autoscale")


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
