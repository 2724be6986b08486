"""The root of the spec models: :class:`Spec`, its targets and its Spark section."""


from typing import Any, Literal, Optional, Union

from pydantic import AfterValidator, StrictBool, WithJsonSchema
from typing_extensions import Annotated

from dbspec.paths import TARGET_PATTERN, TARGET_RULE, is_name

from dbspec.spec.sections.base import SpecModel, d, section
from dbspec.spec.sections.compute import Compute
from dbspec.spec.sections.data import DataSpec
from dbspec.spec.sections.jobs import JobsSpec
from dbspec.spec.sections.lifecycle import (
    EvaluationSpec,
    RegistrySpec,
    ServingSpec,
    TrackingSpec,
)
from dbspec.spec.sections.monitoring import MonitoringSpec
from dbspec.spec.sections.network import ModelSpec
from dbspec.spec.sections.roles import RolesSpec
from dbspec.spec.sections.search import SearchSpec
from dbspec.spec.sections.training import TrainingSpec

SECTION_NAMES = ("vars", "description", "data", "model", "training", "compute", "tracking",
                 "search", "evaluation", "registry", "serving", "executor", "spark", "jobs",
                 "roles", "monitoring")


class SparkSpec(SpecModel):
    """The Spark session of the spark executor."""

    master: Optional[str] = d("Spark master URL; default: --master, SPARK_MASTER, else local[*].",
                              default=None)
    app_name: Optional[str] = d("Application name; default: dbspec-<spec name>.", default=None)
    conf: dict[str, Union[str, int, float, bool]] = d("Extra Spark configuration.",
                                                      default={})
    shared_dir: Optional[str] = d(
        "A directory every node of the cluster mounts (a UC Volume such as "
        "/Volumes/main/ml/dbspec, dbfs:/..., NFS): training ranks and search trials on "
        "executors read their inputs and write checkpoints and results there. "
        "DBSPEC_SHARED_DIR and --shared-dir override it.", default=None)


class TargetSpec(SpecModel):
    """Overrides for one environment, merged over the spec with --target NAME."""

    mode: Literal["development", "production"] = d(
        "Deployment mode of the target (used for generated bundles).", default="development")
    default: StrictBool = d("The target used when none is named (at most one).", default=False)
    vars: Optional[dict[str, Any]] = d("Overrides of vars.", default=None)
    description: Optional[str] = d("Override of description.", default=None)
    data: Optional[dict[str, Any]] = d("Overrides of data.", default=None)
    model: Optional[dict[str, Any]] = d("Overrides of model.", default=None)
    training: Optional[dict[str, Any]] = d("Overrides of training.", default=None)
    compute: Optional[dict[str, Any]] = d("Overrides of compute.", default=None)
    tracking: Optional[dict[str, Any]] = d("Overrides of tracking.", default=None)
    search: Optional[dict[str, Any]] = d("Overrides of search.", default=None)
    evaluation: Optional[dict[str, Any]] = d("Overrides of evaluation.", default=None)
    registry: Optional[dict[str, Any]] = d("Overrides of registry.", default=None)
    serving: Optional[dict[str, Any]] = d("Overrides of serving.", default=None)
    executor: Optional[str] = d("Override of executor.", default=None)
    spark: Optional[dict[str, Any]] = d("Overrides of spark.", default=None)
    jobs: Optional[dict[str, Any]] = d("Overrides of jobs.", default=None)
    roles: Optional[dict[str, Any]] = d("Overrides of roles.", default=None)
    monitoring: Optional[dict[str, Any]] = d("Overrides of monitoring.", default=None)


def _target_name(name: str) -> str:
    if not is_name(name, TARGET_PATTERN):
        raise ValueError(f"target name {name!r} is not allowed: it becomes part of file, job "
                         f"and endpoint names; use {TARGET_RULE}")
    return name


#: A target's name: part of state directories, bundle files and endpoint names.
TargetName = Annotated[str, AfterValidator(_target_name),
                       WithJsonSchema({"type": "string", "pattern": TARGET_PATTERN})]


class Spec(SpecModel):
    """A dbspec model spec: data, model, training, compute, search, registry and serving."""

    model_config = SpecModel.model_config | {"title": "dbspec model spec"}

    name: str = d("Name of the spec; default experiment and study name (also a path part of "
                  "the state dir: letters, digits, '_', '-' and '.', starting with a letter or "
                  "digit).",
                  pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$", max_length=128)
    description: str = d("What this spec trains and why.", default="")
    vars: dict[str, Any] = d("Values for {{ templates }} in the rest of the spec.",
                             default={})
    targets: dict[TargetName, TargetSpec] = d(
        "Per-environment overrides (dev, staging, prod...); a name is letters, digits, '_' "
        "and '-', starting with a letter or digit (it becomes part of file and job names).",
        default={}, json_schema_extra={"additionalProperties": False})
    data: DataSpec = d("The data and the task.")
    model: ModelSpec = d("The network.")
    training: TrainingSpec = section("How it is trained.")
    compute: Compute = section("Where training runs, selected by 'kind'.", kind="local")
    executor: Literal["local", "spark"] = d("Run stages in this process, or on Spark.",
                                            default="local")
    spark: SparkSpec = section("Master URL and configuration of the Spark session.")
    tracking: TrackingSpec = section("MLflow tracking.")
    search: Optional[SearchSpec] = d("Hyperparameter search; omit to train once.", default=None)
    evaluation: EvaluationSpec = section("Metrics and plots.")
    registry: Optional[RegistrySpec] = d("Model registry entry; omit to skip registration.",
                                         default=None)
    serving: ServingSpec = section("How the model is served.")
    jobs: JobsSpec = section("The Databricks job generated by dbspec jobs.")
    roles: Optional[RolesSpec] = d("Who may read, write and deploy on Databricks.", default=None)
    monitoring: Optional[MonitoringSpec] = d("Drift and quality monitoring of the served model "
                                             "(dbspec monitor).", default=None)


__all__ = ["SECTION_NAMES", "SparkSpec", "Spec", "TargetSpec"]
