"""``training``: optimizer, schedule, loss, epochs and the safety nets around them."""

from typing import Annotated, Literal, Optional, Union

from pydantic import Field

from dbspec.spec.sections.base import SpecModel, d, section


class _OptimizerBase(SpecModel):
    lr: float = d("Learning rate.", default=1e-3, gt=0)
    weight_decay: float = d("L2 penalty (decoupled for adamw).", default=0.0, ge=0)


class AdamOptimizer(_OptimizerBase):
    name: Literal["adam", "adamw"] = d("Adam, or AdamW with decoupled weight decay.")
    betas: tuple[Annotated[float, Field(ge=0, lt=1)], Annotated[float, Field(ge=0, lt=1)]] = d("Coefficients of the running averages.", default=(0.9, 0.999))
    eps: float = d("Added to the denominator.", default=1e-8, gt=0)
    amsgrad: bool = d("Use the AMSGrad variant.", default=False)


class SgdOptimizer(_OptimizerBase):
    name: Literal["sgd"] = d("Stochastic gradient descent.")
    momentum: float = d("Momentum factor.", default=0.0, ge=0)
    nesterov: bool = d("Nesterov momentum (needs momentum > 0).", default=False)
    dampening: float = d("Dampening for momentum.", default=0.0, ge=0)


class RmspropOptimizer(_OptimizerBase):
    name: Literal["rmsprop"] = d("RMSprop.")
    alpha: float = d("Smoothing constant.", default=0.99, gt=0, lt=1)
    momentum: float = d("Momentum factor.", default=0.0, ge=0)
    eps: float = d("Added to the denominator.", default=1e-8, gt=0)
    centered: bool = d("Normalise by the estimated variance of the gradient.", default=False)


class AdagradOptimizer(_OptimizerBase):
    name: Literal["adagrad"] = d("Adagrad.")
    lr_decay: float = d("Learning-rate decay.", default=0.0, ge=0)


Optimizer = Annotated[
    Union[AdamOptimizer, SgdOptimizer, RmspropOptimizer, AdagradOptimizer],
    Field(discriminator="name"),
]


class StepScheduler(SpecModel):
    name: Literal["step"] = d("Multiply the rate by gamma every step_size epochs.")
    step_size: int = d("Epochs between decays.", ge=1)
    gamma: float = d("Decay factor.", default=0.1, gt=0)


class MultiStepScheduler(SpecModel):
    name: Literal["multistep"] = d("Multiply the rate by gamma at the given epochs.")
    milestones: list[Annotated[int, Field(ge=1)]] = d("Epochs at which to decay.", min_length=1)
    gamma: float = d("Decay factor.", default=0.1, gt=0)


class ExponentialScheduler(SpecModel):
    name: Literal["exponential"] = d("Multiply the rate by gamma every epoch.")
    gamma: float = d("Decay factor per epoch.", gt=0)


class CosineScheduler(SpecModel):
    name: Literal["cosine"] = d("Cosine annealing.")
    t_max: Optional[int] = d("Epochs of one half cycle; default: training.epochs.",
                             default=None, ge=1)
    eta_min: float = d("Lowest learning rate.", default=0.0, ge=0)


class PlateauScheduler(SpecModel):
    name: Literal["plateau"] = d("Reduce the rate when a metric stops improving.")
    monitor: str = d("Metric to watch.", default="val_loss")
    factor: float = d("Decay factor.", default=0.1, gt=0, lt=1)
    patience: int = d("Epochs without improvement before decaying.", default=5, ge=0)


class OneCycleScheduler(SpecModel):
    name: Literal["onecycle"] = d("One-cycle policy, stepped every batch.")
    max_lr: float = d("Peak learning rate.", gt=0)
    pct_start: float = d("Fraction of the cycle spent increasing.", default=0.3, gt=0, lt=1)


Scheduler = Annotated[
    Union[StepScheduler, MultiStepScheduler, ExponentialScheduler, CosineScheduler,
          PlateauScheduler, OneCycleScheduler],
    Field(discriminator="name"),
]

#: The losses each task accepts, its default (``training.loss: auto``) first. The one list of
#: loss names: ``LossName``, the semantic check and the torch classes in
#: :mod:`dbspec.training.components` are checked against it.
TASK_LOSSES: dict[str, tuple[str, ...]] = {
    "regression": ("mse", "mae", "huber", "smooth_l1"),
    "binary": ("bce", "cross_entropy", "nll"),
    "multiclass": ("cross_entropy", "nll"),
}
#: Every loss name, in the order the schema lists them.
LOSS_NAMES: tuple[str, ...] = tuple(dict.fromkeys(n for names in TASK_LOSSES.values()
                                                  for n in names))
# a Literal keeps the schema's enum and the type checker; a test holds it to LOSS_NAMES
LossName = Literal["auto", "mse", "mae", "huber", "smooth_l1", "bce", "cross_entropy", "nll"]

#: The loss a task gets when ``training.loss`` is ``auto``.
DEFAULT_LOSS = {task: names[0] for task, names in TASK_LOSSES.items()}


class EarlyStopping(SpecModel):
    """Stop when a validation metric stops improving."""

    monitor: str = d("Metric to watch, e.g. val_loss or val_accuracy.", default="val_loss")
    patience: int = d("Epochs without improvement before stopping.", default=10, ge=1)
    min_delta: float = d("Smallest change that counts as improvement.", default=0.0, ge=0)
    mode: Literal["auto", "min", "max"] = d("Whether lower or higher is better; auto: from the "
                                            "metric name.", default="auto")
    restore_best: bool = d("Restore the best epoch's weights at the end.", default=True)


class GradientClipping(SpecModel):
    """Clip the gradient norm before each optimizer step."""

    max_norm: float = d("Largest allowed gradient norm.", gt=0)
    norm_type: float = d("Order of the norm (2 = Euclidean).", default=2.0, gt=0)


class Checkpointing(SpecModel):
    """Checkpoints written atomically during training, for --resume."""

    enabled: bool = d("Write checkpoints.", default=True)
    every_n_epochs: int = d("Epochs between checkpoints.", default=1, ge=1)
    every_n_steps: Optional[int] = d(
        "Also checkpoint inside an epoch every this many batches (at the first optimizer "
        "step on or after it, with gradient accumulation), with the data loader's position, "
        "so a killed run resumes mid-epoch (streamed data only; ignored in memory).",
        default=None, ge=1)
    keep_last: int = d("How many checkpoints to keep.", default=2, ge=1)


class TrainingSpec(SpecModel):
    """How the network is trained."""

    optimizer: Optimizer = section("Optimizer, selected by 'name'.", name="adam")
    scheduler: Optional[Scheduler] = d("Learning-rate schedule, selected by 'name'.", default=None)
    loss: LossName = d("Loss; auto: mse for regression, bce for binary, cross_entropy for "
                       "multiclass.", default="auto")
    epochs: int = d("Passes over the training split.", default=10, ge=1, le=1_000_000)
    batch_size: int = d("Rows per step (per process in distributed runs).", default=32, ge=1)
    gradient_accumulation: int = d("Steps whose gradients are summed before an update.",
                                   default=1, ge=1)
    early_stopping: Optional[EarlyStopping] = d("Stop early on a validation metric.", default=None)
    gradient_clipping: Optional[GradientClipping] = d("Clip gradients.", default=None)
    precision: Literal["auto", "fp32", "bf16", "fp16"] = d(
        "Numeric precision (bf16/fp16 through autocast); auto: bf16 on a CUDA GPU that "
        "supports it, else fp32.", default="auto")
    seed: int = d("Seed for weights, shuffling and dropout.", default=42, ge=0, le=2**32 - 1)
    num_threads: Union[Annotated[int, Field(ge=1)], Literal["auto"]] = d(
        "Intra-op torch threads; auto picks 1 for small models, where more threads only add "
        "contention.", default="auto")
    auto_batch_size: bool = d("On CUDA out-of-memory, retry at half the batch size.",
                              default=False)
    checkpointing: Checkpointing = section("Checkpoints for resume.")

    def precision_on(self, cuda: bool, bf16_supported: bool = True) -> str:
        """The precision actually used (resolves ``auto`` for the device)."""
        if self.precision != "auto":
            return self.precision
        return "bf16" if cuda and bf16_supported else "fp32"

    def loss_for(self, task: str) -> str:
        """The loss actually used for ``task`` (resolves ``auto``)."""
        return DEFAULT_LOSS[task] if self.loss == "auto" else self.loss
