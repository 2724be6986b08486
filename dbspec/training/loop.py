"""The training loop: in-memory tensors batched by index slicing, not a per-sample DataLoader.

Measured with ``benchmarks/train_overhead.py`` (samples per CPU-second relative to a
hand-written ``x[perm[i:i + bs]]`` loop): this loop 1.03x; a ``DataLoader`` fed by a
``BatchSampler`` (the documented fast way) 0.92x; Lightning's ``Trainer`` over it 0.68x; a
``DataLoader`` collating sample by sample 0.21-0.25x. Early stopping, schedulers, clipping,
accumulation, autocast, checkpoints and resume sit around the inner loop
(:mod:`dbspec.training.passes`) without adding work per step.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Protocol, Sequence

import torch
from torch import nn

from dbspec.errors import DbspecError
from dbspec.faults import pause_point
from dbspec.spec.sections.training import TrainingSpec
from dbspec.training.checkpoints import CheckpointStore
from dbspec.training.components import build_loss, build_optimizer, build_scheduler
from dbspec.training.early_stopping import EarlyStopping
from dbspec.training.passes import (Batches, ScoreFn, UpdateHook, Updates, autocast_for,
                                    engine_step, plain_step, run_epoch, validate)


class TrainingError(DbspecError):
    """Training cannot go on (a non-finite loss, a device that is not there)."""


@dataclass
class Tensors:
    """Preprocessed inputs and training targets, already on the training device."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_val: Optional[torch.Tensor] = None
    y_val: Optional[torch.Tensor] = None


@dataclass
class StreamedTensors:
    """Training batches streamed from shards (``data.streaming``) instead of tensors in memory.

    Attributes:
        train: This rank's shuffled batches of each epoch, from any batch on (a
            :class:`~dbspec.data.stream.StreamedSplit`).
        validation: Called with no argument, the validation split's ``(x, y)`` batches (None
            without a validation split).
        example: Two prepared training rows (observers trace the model with them).
    """

    train: Any
    validation: Optional[Callable[[], Any]] = None
    example: Any = None


def is_streamed(tensors) -> bool:
    return isinstance(tensors, StreamedTensors)


def example_rows(tensors):
    """Two prepared training rows, for tracing the model."""
    return tensors.example if is_streamed(tensors) else tensors.x_train[:2]


def _train_rows(tensors, epoch: int) -> int:
    return tensors.train.rows(epoch) if is_streamed(tensors) else len(tensors.x_train)


def _has_validation(tensors) -> bool:
    if is_streamed(tensors):
        return tensors.validation is not None
    return tensors.x_val is not None and len(tensors.x_val) > 0


@dataclass
class TrainOutcome:
    """What a finished training run produced."""

    history: list[dict[str, float]]
    best_epoch: int
    best_value: Optional[float]
    stopped_early: bool
    epochs_run: int
    samples_per_second: float
    resumed_from: Optional[int] = None
    extra: dict[str, Any] = field(default_factory=dict)


class EpochCallback(Protocol):
    """Called after each epoch; may raise to stop training (a pruned search trial)."""

    def __call__(self, *, epoch: int, metrics: dict[str, float], **future: Any) -> None: ...


ReduceFn = Callable[[dict[str, float]], None]


@dataclass(frozen=True)
class TrainOptions:
    """How one :func:`train` call runs, beyond the spec's training section.

    Attributes:
        epochs: Override of ``training.epochs`` (smoke runs).
        score_validation: Metrics beyond ``val_loss`` from (network outputs, targets), called
            each epoch when a monitored metric needs them.
        engine: A DeepSpeed engine; it then owns backward, step, accumulation, clipping and
            precision (its optimizer and scheduler replace the spec-built ones).
        reduce: Called on each epoch's metrics before any decision uses them (distributed
            ranks average theirs here, so every rank stops and schedules alike).
    """

    epochs: Optional[int] = None
    score_validation: Optional[ScoreFn] = None
    checkpoints: Optional[CheckpointStore] = None
    resume: bool = False
    callbacks: Sequence[EpochCallback] = ()
    engine: Any = None
    reduce: Optional[ReduceFn] = None


def train(network: nn.Module, tensors: Tensors, training: TrainingSpec, *, loss: str,
          device: torch.device, options: TrainOptions = TrainOptions()) -> TrainOutcome:
    """Train ``network`` in place (it and ``tensors`` on ``device``) and return its history.

    ``loss`` is the resolved loss name; ``options`` adds the epoch override, validation
    scoring, checkpoints and resume, callbacks, and the hooks of a distributed rank.

    Raises:
        TrainingError: the loss became NaN or infinite.
    """
    epochs = options.epochs or training.epochs
    state = _RunState(network, tensors, training, options.engine, epochs)
    checkpoints = options.checkpoints
    if options.resume and checkpoints is not None:
        state.resume(checkpoints)
    passes = _EpochPass(network, tensors, training, build_loss(loss), device, options)
    passes.on_update = _step_checkpointer(state, checkpoints, training, tensors)
    samples, seconds = 0, 0.0
    for epoch in state.remaining_epochs():
        metrics, worked = passes.run(state, epoch)
        samples += _train_rows(tensors, epoch)
        seconds += worked
        state.step_scheduler(metrics)
        state.history.append(metrics)
        improved = state.stopper.update(epoch, metrics, network)
        for callback in options.callbacks:
            callback(epoch=epoch, metrics=metrics, improved=improved)
        if checkpoints is not None and checkpoints.due(epoch, last=epoch == epochs - 1):
            checkpoints.save(epoch, state.checkpoint(epoch))
        if state.stopper.should_stop:
            break
    state.stopper.restore(network)
    stopper = state.stopper
    return TrainOutcome(state.history, stopper.best_epoch, stopper.best_value,
                        stopper.should_stop, len(state.history),
                        samples / seconds if seconds else 0.0, state.resumed_from)


class _RunState:
    """What a training carries from epoch to epoch: optimizer, scheduler, early stopping,
    shuffling generator and history; what a checkpoint saves and a resume restores."""

    def __init__(self, network: nn.Module, tensors: Tensors, training: TrainingSpec,
                 engine: Any, epochs: int):
        self.network, self.training, self.epochs = network, training, epochs
        if engine is not None:
            self.optimizer, self.scheduler = engine.optimizer, None
        else:
            self.optimizer = build_optimizer(network, training.optimizer)
            steps_per_epoch = tensors.train.num_batches() if is_streamed(tensors) \
                else math.ceil(len(tensors.x_train) / training.batch_size)
            updates_per_epoch = math.ceil(steps_per_epoch / training.gradient_accumulation)
            self.scheduler = build_scheduler(self.optimizer, training, epochs, updates_per_epoch)
        self.stopper = EarlyStopping(training)
        self.generator = torch.Generator(device="cpu").manual_seed(training.seed)
        self.history: list[dict[str, float]] = []
        self.start_epoch = 0
        self.resumed_from: Optional[int] = None
        self.in_epoch: Optional[dict[str, Any]] = None  # where a mid-epoch checkpoint stopped

    def remaining_epochs(self) -> range:
        """The epochs still to train (none when a resumed run had stopped early)."""
        if self.stopper.should_stop:
            return range(0)
        return range(self.start_epoch, self.epochs)

    def resume(self, checkpoints: CheckpointStore) -> None:
        """Continue from the newest checkpoint, if there is one."""
        state = checkpoints.load_latest()
        if state is None:
            return
        if state.get("network") is not None:  # a DeepSpeed store restores these itself
            self.network.load_state_dict(state["network"])
            self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None and state.get("scheduler") is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        self.generator.set_state(state["generator"])
        if state.get("torch_rng") is not None:
            torch.set_rng_state(state["torch_rng"])  # dropout continues as if uninterrupted
        self.stopper.load(state["stopper"])
        self.history = state["history"]
        self.start_epoch = self.resumed_from = state["epoch"] + 1
        self.in_epoch = state.get("in_epoch")
        if self.in_epoch is not None:  # a mid-epoch checkpoint: that epoch goes on
            self.start_epoch = self.resumed_from = self.in_epoch["epoch"]

    def checkpoint(self, epoch: int, in_epoch: Optional[dict[str, Any]] = None
                   ) -> dict[str, Any]:
        """Everything :meth:`resume` needs to continue after ``epoch``, or, with
        ``in_epoch`` (``{"epoch", "step", "loss_totals"}``: the batches done and every rank's
        summed loss so far), inside the epoch after it."""
        scheduler = self.scheduler
        return {"epoch": epoch, "network": self.network.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "scheduler": scheduler.state_dict() if scheduler is not None else None,
                "generator": self.generator.get_state(), "stopper": self.stopper.state(),
                "torch_rng": torch.get_rng_state(), "history": self.history,
                "in_epoch": in_epoch}

    def step_scheduler(self, metrics: dict[str, float]) -> None:
        """The per-epoch schedulers step (``onecycle`` steps per update, in the epoch)."""
        scheduler, spec = self.scheduler, self.training.scheduler
        if scheduler is None or spec.name == "onecycle":
            return
        if spec.name == "plateau":
            scheduler.step(metrics.get(spec.monitor, metrics["train_loss"]))
        else:
            scheduler.step()


class _EpochPass:
    """One epoch: the training pass, the cross-rank reduction, validation, and the epoch's
    metrics (loss, timing, throughput, learning rate)."""

    def __init__(self, network: nn.Module, tensors: Tensors, training: TrainingSpec,
                 loss_fn: nn.Module, device: torch.device, options: TrainOptions):
        self.network, self.tensors, self.training = network, tensors, training
        self.loss_fn, self.engine, self.reduce = loss_fn, options.engine, options.reduce
        self.score = options.score_validation
        cuda = device.type == "cuda"
        precision = training.precision_on(cuda, cuda and torch.cuda.is_bf16_supported())
        self.autocast = autocast_for("fp32" if self.engine is not None else precision, device)
        self.scaler = torch.amp.GradScaler("cuda") if precision == "fp16" and cuda else None
        self.on_update: Optional[UpdateHook] = None

    def run(self, state: _RunState, epoch: int) -> tuple[dict[str, float], float]:
        """Train one epoch; returns its metrics and this process's own training seconds."""
        tensors, rows = self.tensors, _train_rows(self.tensors, epoch)
        started = time.perf_counter()
        self.network.train()
        batches = _epoch_batches(tensors, self.training.batch_size, state, epoch)
        stalled = tensors.train.stall_seconds if is_streamed(tensors) else 0.0
        accumulate = self.training.gradient_accumulation
        if self.engine is not None:
            step = engine_step(self.network, self.loss_fn, self.engine, accumulate)
        else:
            step = plain_step(self.network, self.training, self.loss_fn, self.autocast,
                              Updates(state.optimizer, state.scheduler, self.scaler), rows)
        try:
            total, timing = run_epoch(self.network, batches, step, accumulate, self.on_update)
        finally:
            batches.close()
        metrics = {"train_loss": total / rows, **timing.metrics()}
        if is_streamed(tensors):  # waiting for the next window of shards: an input stall
            metrics["input_stall_seconds"] = tensors.train.stall_seconds - stalled
        # this process's own training pass: not the epoch-end reduction, where a rank waits
        # for the slowest one, nor validation
        worked = time.perf_counter() - started
        if self.reduce is not None:
            self.reduce(metrics)
        if not math.isfinite(metrics["train_loss"]):
            raise TrainingError(f"training.loss: the loss became {metrics['train_loss']} at "
                                f"epoch {epoch + 1}; lower training.optimizer.lr or add "
                                "gradient_clipping")
        if _has_validation(tensors):
            metrics.update(self._validate())
        metrics["lr"] = float(state.optimizer.param_groups[0]["lr"])
        metrics["epoch_seconds"] = time.perf_counter() - started
        metrics["samples_per_second"] = rows / worked if worked else 0.0
        return metrics, worked

    def _validate(self) -> dict[str, float]:
        tensors = self.tensors
        batches = tensors.validation if is_streamed(tensors) \
            else lambda: [(tensors.x_val, tensors.y_val)]
        return validate(self.network, batches, self.loss_fn, self.autocast, self.score)


def validation_scorer(spec, served) -> Optional[ScoreFn]:
    """Per-epoch validation metrics, only when a monitored metric needs more than val_loss."""
    monitored = {spec.training.early_stopping.monitor if spec.training.early_stopping else "",
                 spec.training.scheduler.monitor if spec.training.scheduler is not None
                 and spec.training.scheduler.name == "plateau" else "",
                 spec.search.metric if spec.search is not None else ""}
    names = sorted(m[4:] for m in monitored if m.startswith("val_") and m != "val_loss")
    if not names:
        return None
    from dbspec.evaluation.metrics import task_metrics

    def score(out, y):
        with torch.inference_mode():
            predictions = served.head(out.cpu()).numpy()
        y_true = y.cpu().numpy().reshape(-1)
        if spec.data.task == "regression":
            y_true = y_true * served.card.target_std + served.card.target_mean
        found = task_metrics(spec.data.task, y_true, predictions, names,
                             threshold=spec.evaluation.threshold)
        return {f"val_{k}": v for k, v in found.items()}

    return score


def _epoch_batches(tensors, batch: int, state: _RunState, epoch: int) -> Batches:
    """The batches ``epoch`` trains: the rows in a fresh shuffle, or the stream's from where a
    mid-epoch checkpoint stopped."""
    resumed = state.in_epoch if state.in_epoch and state.in_epoch["epoch"] == epoch else None
    state.in_epoch = None
    if not is_streamed(tensors):
        x, y = tensors.x_train, tensors.y_train
        n = len(x)
        order = torch.randperm(n, generator=state.generator).to(x.device)
        iterator = ((x[index], y[index]) for index in
                    (order[start:start + batch] for start in range(0, n, batch)))
        return Batches(epoch, math.ceil(n / batch), 0, n, 0.0, iterator)
    start = resumed["step"] if resumed else 0
    stream = tensors.train
    total = resumed["loss_totals"][_rank()] if resumed else 0.0  # this rank's own sum
    return Batches(epoch, stream.num_batches(epoch), start, stream.rows(epoch), total,
                   stream.batches(epoch, start))


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _gathered(total: torch.Tensor) -> list[float]:
    """Every rank's summed loss so far (a collective: every rank calls it at the same step)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return [float(total)]
    mine = total.detach().double().reshape(1)
    every = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    return [float(value) for value in every]


def _step_checkpointer(state: _RunState, checkpoints, training: TrainingSpec,
                       tensors) -> Optional[UpdateHook]:
    """The hook that checkpoints every ``checkpointing.every_n_steps`` batches (streamed data
    only), with the stream's position and the epoch's loss so far."""
    every = training.checkpointing.every_n_steps
    if checkpoints is None or not every or not is_streamed(tensors):
        return None
    accumulate = training.gradient_accumulation  # batches between optimizer steps

    def save(epoch: int, step: int, total: torch.Tensor) -> None:
        pause_point(f"train.step.{epoch}.{step}")  # a test seam: kill here, between checkpoints
        if step // every == (step - accumulate) // every:
            return  # no multiple of every_n_steps since the last optimizer step
        if step >= tensors.train.num_batches(epoch):
            return  # the epoch's own checkpoint follows at its end
        in_epoch = {"epoch": epoch, "step": step, "loss_totals": _gathered(total)}
        checkpoints.save_step(epoch, step, state.checkpoint(epoch - 1, in_epoch))

    return save

