"""What dbspec knows about Databricks compute: runtimes, node types, and the rules that tie
them to a spec's ``compute`` — pure data and checks, so ``dbspec validate`` can enforce them
without the SDK.

Sources (Databricks' public documentation, read 2026-12):

- the Databricks Runtime release notes' *MLflow–Databricks Runtime compatibility matrix*
  (14.3 LTS ML → MLflow 2.9.2, 15.4 LTS → 2.13.1, 16.4 LTS → 2.21.3, 17.3 LTS → 3.0.1,
  18 → 3.8.1, 19 → 3.12.0) and each release's *system environment* (Python, Scala);
- *GPU-enabled compute*: GPU ML runtimes follow from a GPU worker type; Photon is not supported
  on GPU instance types; ``runtime_engine: PHOTON`` replaces ``-photon-`` version strings;
- *AWS Graviton instances*: supported from 15.4 LTS ML, CPU only;
- *Unity Catalog access modes*: Runtime ML reads Unity Catalog data and registers to
  ``catalog.schema.model`` names on **Dedicated** compute only.
"""

from __future__ import annotations

import re
from typing import NamedTuple, Optional


class Runtime(NamedTuple):
    """One Databricks Runtime line (its ML variant)."""

    version: tuple[int, int]
    label: str
    python: str
    scala: str
    mlflow: str

    def version_of(self, package: str) -> tuple[int, ...]:
        """(major, minor) of ``mlflow`` or ``python`` on this runtime."""
        return tuple(int(p) for p in re.findall(r"\d+", getattr(self, package))[:2])


#: Runtime lines dbspec checks against, newest last.
RUNTIMES: tuple[Runtime, ...] = (
    Runtime((14, 3), "14.3 LTS", "3.10", "2.12", "2.9.2"),
    Runtime((15, 4), "15.4 LTS", "3.11", "2.12", "2.13.1"),
    Runtime((16, 4), "16.4 LTS", "3.12", "2.12", "2.21.3"),
    Runtime((17, 3), "17.3 LTS", "3.12", "2.13", "3.0.1"),
    Runtime((18, 0), "18 LTS", "3.12", "2.13", "3.8.1"),
    Runtime((19, 0), "19", "3.12", "2.13", "3.12.0"),
)
#: The runtime of generated clusters: the newest LTS line whose MLflow meets dbspec's own
#: ``mlflow>=3`` requirement (a test reads pyproject.toml to keep the two together).
DEFAULT_RUNTIME = RUNTIMES[3]
#: MLflow and Python that dbspec needs on a task (pyproject.toml: ``mlflow>=3.0``,
#: ``requires-python >= 3.10``).
MLFLOW_REQUIRED = (3, 0)
PYTHON_REQUIRED = (3, 10)
GRAVITON_FROM = (15, 4)

_VERSION = re.compile(r"^(\d+)\.(\d+)\.x-(?P<rest>.+)$")


def default_spark_version(gpu: bool, ml: bool = True) -> str:
    """The ``spark_version`` of a generated cluster (``ml=False``: the standard runtime a
    custom container image runs on)."""
    major, minor = DEFAULT_RUNTIME.version
    if not ml:
        return f"{major}.{minor}.x-scala{DEFAULT_RUNTIME.scala}"
    return f"{major}.{minor}.x-{'gpu' if gpu else 'cpu'}-ml-scala{DEFAULT_RUNTIME.scala}"


class RuntimeName(NamedTuple):
    """A parsed ``spark_version`` such as ``17.3.x-gpu-ml-scala2.13``."""

    version: tuple[int, int]
    ml: bool
    gpu: bool
    photon: bool
    runtime: Optional[Runtime]  # None: a line dbspec's table does not know


def parse_spark_version(value: str) -> Optional[RuntimeName]:
    """The parts of ``value``; None when it is not a Databricks runtime string."""
    match = _VERSION.match(value)
    if not match:
        return None
    version = (int(match.group(1)), int(match.group(2)))
    parts = match.group("rest").split("-")
    known = next((r for r in RUNTIMES if r.version == version), None)
    return RuntimeName(version, "ml" in parts, "gpu" in parts, "photon" in parts, known)


# --- node types -----------------------------------------------------------------------------

#: GPUs per node of the GPU node types dbspec picks or recognises, per cloud.
GPU_NODE_TYPES: dict[str, dict[str, int]] = {
    "aws": {"g4dn.xlarge": 1, "g4dn.12xlarge": 4, "g5.xlarge": 1, "g5.2xlarge": 1,
            "g5.12xlarge": 4, "g5.48xlarge": 8, "g6.xlarge": 1, "g6.12xlarge": 4,
            "g6.48xlarge": 8, "g6e.xlarge": 1, "g6e.12xlarge": 4, "g6e.48xlarge": 8,
            "p3.2xlarge": 1, "p3.8xlarge": 4, "p3.16xlarge": 8, "p4d.24xlarge": 8,
            "p5.48xlarge": 8},
    "azure": {"Standard_NC4as_T4_v3": 1, "Standard_NC64as_T4_v3": 4,
              "Standard_NC6s_v3": 1, "Standard_NC12s_v3": 2, "Standard_NC24s_v3": 4,
              "Standard_NC24ads_A100_v4": 1, "Standard_NC48ads_A100_v4": 2,
              "Standard_NC96ads_A100_v4": 4, "Standard_ND96asr_v4": 8,
              "Standard_ND96isr_H100_v5": 8},
    "gcp": {"g2-standard-4": 1, "g2-standard-48": 4, "a2-highgpu-1g": 1, "a2-highgpu-2g": 2,
            "a2-highgpu-4g": 4, "a2-highgpu-8g": 8, "a2-ultragpu-8g": 8, "a3-highgpu-8g": 8},
}
#: The GPU node generated for a number of GPUs per node: the smallest that holds them.
GPU_DEFAULTS: dict[str, tuple[tuple[int, str], ...]] = {
    "aws": ((1, "g5.xlarge"), (4, "g5.12xlarge"), (8, "p4d.24xlarge")),
    "azure": ((1, "Standard_NC4as_T4_v3"), (4, "Standard_NC64as_T4_v3"),
              (8, "Standard_ND96asr_v4")),
    "gcp": ((1, "g2-standard-4"), (4, "a2-highgpu-4g"), (8, "a2-highgpu-8g")),
}
CPU_DEFAULTS = {"aws": "i3.xlarge", "azure": "Standard_DS3_v2", "gcp": "n2-standard-4"}
GRAVITON_DEFAULT = "m7gd.xlarge"
_GPU_FAMILY = {"aws": re.compile(r"^(g\d+[a-z]*|p\d+[a-z]*)\."),
               "azure": re.compile(r"^Standard_N"),
               "gcp": re.compile(r"^(a\d-|g2-)")}
_CLOUD_OF = ((re.compile(r"^Standard_"), "azure"),
             (re.compile(r"^[a-z]\d[a-z]*-[a-z]+-\d+[a-z]*$|^n\d[a-z]*-"), "gcp"),
             (re.compile(r"^[a-z]+\d+[a-z-]*\.\d*[a-z]+$"), "aws"))
#: AWS Graviton families: a ``g`` after the generation digit (m6gd, c7g, r7gd...).
_GRAVITON = re.compile(r"^[a-z]+\d+g[a-z]*\.")


def node_cloud(node: str) -> Optional[str]:
    """The cloud whose naming ``node`` follows, or None when it is not recognised."""
    return next((cloud for pattern, cloud in _CLOUD_OF if pattern.match(node)), None)


def gpus_of(node: str, cloud: str) -> Optional[int]:
    """GPUs of ``node``: a number for known GPU types, 0 for CPU types, None when it looks like
    a GPU type dbspec does not know the size of."""
    known = GPU_NODE_TYPES.get(cloud, {})
    if node in known:
        return known[node]
    return None if _GPU_FAMILY[cloud].match(node) else 0


def is_graviton(node: str) -> bool:
    """Whether ``node`` is an AWS Graviton (ARM) type."""
    return bool(_GRAVITON.match(node)) and node_cloud(node) == "aws"


def default_node(cloud: str, gpus_per_node: int, graviton: bool = False) -> str:
    """The node type a generated cluster uses."""
    if gpus_per_node > 0:
        table = GPU_DEFAULTS[cloud]
        return next((n for limit, n in table if gpus_per_node <= limit), table[-1][1])
    return GRAVITON_DEFAULT if graviton else CPU_DEFAULTS[cloud]


# --- what training needs --------------------------------------------------------------------

class Resources(NamedTuple):
    """What a cluster needs for training: GPUs per node and workers."""

    gpus_per_node: int
    num_workers: int
    on_executors: bool


def unity_catalog(spec) -> bool:
    """Whether the spec registers to, or reads from, Unity Catalog."""
    if spec.registry is not None and spec.registry.name.count(".") == 2:
        return True
    source = spec.data.source
    name = getattr(source, "table", None) or ""
    path = str(getattr(source, "path", "") or "")
    return name.count(".") == 2 or path.startswith("/Volumes/")


#: An AI Runtime experiment *name* (databricks-air's run config); its folder is given apart.
EXPERIMENT_NAME = re.compile(r"^[A-Za-z0-9_-]{1,100}$")


def experiment_location(experiment: str) -> tuple[str, Optional[str]]:
    """AI Runtime's experiment name and ``mlflow_experiment_directory`` for an MLflow experiment
    path: ``/Shared/x`` -> ``("x", "/Workspace/Shared")``; a bare name has no directory."""
    folder, _, name = experiment.rstrip("/").rpartition("/")
    if not folder:
        return name, None
    return name, folder if folder.startswith("/Workspace") else f"/Workspace{folder}"


#: The variable naming the directory the nodes of one AI Runtime run meet in: the generated
#: command script sets it; node 0's torchrun launcher writes the other nodes' command there.
RENDEZVOUS = "DBSPEC_RENDEZVOUS"
