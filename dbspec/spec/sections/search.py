"""``search``: an Optuna study over dotted paths of this spec."""

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, Discriminator, Tag

from dbspec.spec.sections.base import SpecModel, d, section, shorthand


class FloatDistribution(SpecModel):
    low_high: tuple[float, float] = d("[low, high] bounds, both included.", alias="float")
    log: bool = d("Sample on a log scale (low must be > 0).", default=False)
    step: Optional[float] = d("Discretisation step (not with log).", default=None, gt=0)


class IntDistribution(SpecModel):
    low_high: tuple[int, int] = d("[low, high] bounds, both included.", alias="int")
    log: bool = d("Sample on a log scale (low must be >= 1).", default=False)
    step: int = d("Step between values (1 with log).", default=1, ge=1)


class CategoricalDistribution(SpecModel):
    choices: list[Any] = d("The values to choose from.", alias="categorical", min_length=1)


_KINDS = ("float", "int", "categorical")


def _distribution_kind(value: Any) -> Optional[str]:
    if isinstance(value, BaseModel):
        return {FloatDistribution: "float", IntDistribution: "int",
                CategoricalDistribution: "categorical"}.get(type(value))
    if isinstance(value, dict):
        present = [k for k in _KINDS if k in value]
        return present[0] if len(present) == 1 else None
    return None


Distribution = Annotated[
    Union[Annotated[FloatDistribution, Tag("float")], Annotated[IntDistribution, Tag("int")],
          Annotated[CategoricalDistribution, Tag("categorical")]],
    Discriminator(_distribution_kind, custom_error_type="distribution_kind",
                  custom_error_message="a distribution is one of {float: [low, high]}, "
                                       "{int: [low, high]} or {categorical: [choices]}"),
]


class SamplerSpec(SpecModel):
    """How trials choose parameters."""

    name: Literal["tpe", "random", "cmaes", "grid", "qmc"] = d("Optuna sampler.", default="tpe")
    seed: Optional[int] = d("Sampler seed; default: training.seed.", default=None, ge=0)
    startup_trials: int = d("Random trials before TPE/CMA-ES model the space.", default=10, ge=0)


class PrunerSpec(SpecModel):
    """How unpromising trials are stopped, from the metric reported every epoch."""

    name: Literal["median", "hyperband", "successive_halving", "none"] = d("Optuna pruner.",
                                                                           default="median")
    startup_trials: int = d("Trials that finish before pruning starts.", default=5, ge=0)
    warmup_epochs: int = d("Epochs of each trial that are never pruned.", default=5, ge=0)
    min_resource: int = d("Hyperband/successive halving: fewest epochs of a trial.", default=1,
                          ge=1)
    reduction_factor: int = d("Hyperband/successive halving: reduction factor.", default=3, ge=2)


class SearchSpec(SpecModel):
    """An Optuna study: trials apply suggestions at the 'space' paths and train."""

    n_trials: int = d("Trials to run (a resumed study runs only the missing ones).", default=20,
                      ge=1)
    timeout: Optional[float] = d("Stop starting trials after this many seconds.", default=None,
                                 gt=0)
    sampler: Annotated[SamplerSpec, shorthand(SamplerSpec, "name")] = section(
        "Sampler: a name, or a mapping with options.")
    pruner: Annotated[PrunerSpec, shorthand(PrunerSpec, "name")] = section(
        "Pruner: a name, or a mapping with options.")
    parallelism: int = d("Trials run at a time (processes locally, Spark tasks on Spark).",
                         default=1, ge=1)
    metric: str = d("Metric the study optimises, reported every epoch.", default="val_loss")
    direction: Literal["auto", "minimize", "maximize"] = d(
        "Optimisation direction; auto: from the metric name.", default="auto")
    space: dict[str, Distribution] = d(
        "Dotted spec paths (training.optimizer.lr, vars.hidden, model.layers.0.linear.out) "
        "mapped to distributions.", min_length=1)
    final_model: Literal["retrain", "best_trial"] = d(
        "After the study: retrain with the best parameters, or reuse the best trial's model.",
        default="retrain")
    study_name: Optional[str] = d("Optuna study name; default: the spec name.", default=None)
    storage: Optional[str] = d("Optuna storage URL; default: a SQLite file next to the "
                               "tracking store.", default=None)
