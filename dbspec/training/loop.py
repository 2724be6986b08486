"""The training loop: in-memory tensors batched by index slicing, not a per-sample DataLoader.

Measured with ``benchmarks/train_overhead.py`` (100,000 x 100 synthetic rows, MLP
100-256-128-1, batch 256, 1 thread; samples per CPU-second relative to a hand-written
``x[perm[i:i + bs]]`` loop, medians of 3 interleaved repeats on the shared 2-core machine):
this loop 1.03x; a ``DataLoader`` fed by a ``BatchSampler`` (``batch_size=None``, one gather
per batch, the documented fast way) 0.92x; Lightning's ``Trainer`` over that DataLoader
0.68x. A ``DataLoader`` that collates sample by sample is the slow way (0.21-0.25x for a
linear model). So the loop gathers each batch with one index operation on the device, which
also keeps it free of a DataLoader's per-batch machinery. Everything else a run needs — early
stopping with restore-best, schedulers, clipping, accumulation, autocast, atomic checkpoints
and resume — sits around that inner loop without adding work per step beyond what a
hand-written loop does.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Protocol, Sequence

import torch
from torch import nn

from dbspec.errors import DbspecError
from dbspec.faults import pause_point
from dbspec.spec.sections.training import TrainingSpec
from dbspec.spec.semantics import lower_is_better
from dbspec.training.checkpoints import CheckpointStore
from dbspec.training.components import build_loss, build_optimizer, build_scheduler


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
        train: The training split (a :class:`~dbspec.data.stream.StreamedSplit`): this rank's
            shuffled batches of each epoch, from any batch on.
        validation: Called with no argument, the validation split's ``(x, y)`` batches in
            stored order; None without a validation split.
        example: Two prepared training rows (observers trace the model with them).
    """

    train: Any
    validation: Optional[Callable[[], Any]] = None
    example: Any = None


def is_streamed(tensors) -> bool:
    """Whether ``tensors`` streams (:class:`StreamedTensors`) rather than holds the rows."""
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


ScoreFn = Callable[[torch.Tensor, torch.Tensor], dict[str, float]]
ReduceFn = Callable[[dict[str, float]], None]


@dataclass(frozen=True)
class TrainOptions:
    """How one :func:`train` call runs, beyond the spec's training section.

    Attributes:
        epochs: Override of ``training.epochs`` (smoke runs).
        score_validation: Metrics beyond ``val_loss`` from (network outputs, targets), called
            each epoch when a monitored metric needs them.
        checkpoints: Where to write checkpoints; None writes none.
        resume: Continue from the newest checkpoint when there is one.
        callbacks: Called with each epoch's metrics.
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
    """Train ``network`` in place and return its history.

    Args:
        network: The module to train (on ``device``).
        tensors: Inputs and targets on ``device``.
        training: The spec's training section.
        loss: The resolved loss name.
        device: Where the tensors live.
        options: Epoch override, validation scoring, checkpoints and resume, callbacks, and
            the hooks of a distributed rank.

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
        self.stopper = _EarlyStopping(training)
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
        self.autocast = _autocast("fp32" if self.engine is not None else precision, device)
        self.scaler = torch.amp.GradScaler("cuda") if precision == "fp16" and cuda else None
        self.device = device
        self.on_update: Optional[_UpdateHook] = None

    def run(self, state: _RunState, epoch: int) -> tuple[dict[str, float], float]:
        """Train one epoch; returns its metrics and this process's own training seconds."""
        tensors, rows = self.tensors, _train_rows(self.tensors, epoch)
        started = time.perf_counter()
        self.network.train()
        batches = _Batches.of(tensors, self.training.batch_size, state, epoch)
        stalled = tensors.train.stall_seconds if is_streamed(tensors) else 0.0
        try:
            if self.engine is not None:
                total, timing = _run_engine_epoch(self.network, batches, self.loss_fn,
                                                  self.engine,
                                                  self.training.gradient_accumulation,
                                                  self.on_update)
            else:
                total, timing = _run_epoch(self.network, batches, self.training, self.loss_fn,
                                           state.optimizer, state.scheduler, self.autocast,
                                           self.scaler, self.on_update)
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
            metrics.update(_validate(self.network, tensors, self.loss_fn, self.autocast,
                                     self.score, device=self.device))
        metrics["lr"] = float(state.optimizer.param_groups[0]["lr"])
        metrics["epoch_seconds"] = time.perf_counter() - started
        metrics["samples_per_second"] = rows / worked if worked else 0.0
        return metrics, worked


class StepTiming:
    """Where an epoch's time went: gathering batches vs the rest of each step.

    Two clock reads per step (~0.1 us); on CUDA the split is of launch time, since kernels run
    asynchronously, so GPU runs are diagnosed from the GPU's own utilisation instead.
    """

    __slots__ = ("data", "steps")

    def __init__(self):
        self.data = 0.0
        self.steps: list[float] = []

    def metrics(self) -> dict[str, float]:
        if not self.steps:
            return {}
        total = sum(self.steps)
        mean = total / len(self.steps)
        spread = (sum((t - mean) ** 2 for t in self.steps) / len(self.steps)) ** 0.5
        return {"data_seconds": self.data, "compute_seconds": max(total - self.data, 0.0),
                "step_time_ms": mean * 1000, "step_time_cv": spread / mean if mean else 0.0}


#: Called after an optimizer step with (epoch, batches done, the epoch's summed loss so far).
_UpdateHook = Callable[[int, int, torch.Tensor], None]


class _Batches:
    """One epoch's training batches, from memory (index slicing) or streamed from shards.

    Attributes:
        epoch: The epoch.
        steps: Batches in the whole epoch.
        start: The first batch this pass trains (after a mid-epoch resume, else 0).
        rows: Rows in the whole epoch.
        total: The summed loss of the batches before ``start``.
    """

    def __init__(self, epoch: int, steps: int, start: int, rows: int, total: float, iterator):
        self.epoch, self.steps, self.start, self.rows = epoch, steps, start, rows
        self.total, self.iterator = total, iterator

    @classmethod
    def of(cls, tensors, batch: int, state: _RunState, epoch: int) -> "_Batches":
        resumed = state.in_epoch if state.in_epoch and state.in_epoch["epoch"] == epoch else None
        state.in_epoch = None
        if not is_streamed(tensors):
            x, y = tensors.x_train, tensors.y_train
            n = len(x)
            order = torch.randperm(n, generator=state.generator).to(x.device)
            iterator = ((x[index], y[index]) for index in
                        (order[start:start + batch] for start in range(0, n, batch)))
            return cls(epoch, math.ceil(n / batch), 0, n, 0.0, iterator)
        start = resumed["step"] if resumed else 0
        stream = tensors.train
        total = resumed["loss_totals"][_rank()] if resumed else 0.0  # this rank's own sum
        return cls(epoch, stream.num_batches(epoch), start, stream.rows(epoch), total,
                   stream.batches(epoch, start))

    def close(self) -> None:
        """Stop a stream's prefetch thread now (an error left the epoch early)."""
        close = getattr(self.iterator, "close", None)
        if close is not None:
            close()


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


def _run_epoch(network, batches: _Batches, training, loss_fn, optimizer, scheduler, autocast,
               scaler, on_update: Optional[_UpdateHook] = None) -> tuple[float, StepTiming]:
    """One pass over the training rows; returns the summed loss and the step timing."""
    n, steps, device = batches.rows, batches.steps, _device_of(network)
    accumulate = training.gradient_accumulation
    clipping = training.gradient_clipping
    per_batch_scheduler = scheduler is not None and training.scheduler.name == "onecycle"
    # batch norm cannot train on one row: a last batch of one is dropped (one row, one epoch)
    has_batch_norm = any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in network.modules())
    total = torch.full((), batches.total, device=device)
    timing, clock = StepTiming(), time.perf_counter
    optimizer.zero_grad(set_to_none=True)
    iterator = batches.iterator
    for step in range(batches.start, steps):
        began = clock()
        xb, yb = next(iterator)
        if xb.device != device:
            xb, yb = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
        if has_batch_norm and len(xb) == 1 and n > 1:
            continue
        gathered = clock()
        with autocast():
            loss = loss_fn(network(xb), yb)
        scaled = loss / accumulate if accumulate > 1 else loss
        if scaler is not None:
            scaler.scale(scaled).backward()
        else:
            scaled.backward()
        total += loss.detach() * len(xb)
        if (step + 1) % accumulate == 0 or step + 1 == steps:
            if clipping is not None:
                if scaler is not None:
                    scaler.unscale_(optimizer)
                nn.utils.clip_grad_norm_(network.parameters(), clipping.max_norm,
                                         norm_type=clipping.norm_type)
            if scaler is not None:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if per_batch_scheduler:
                scheduler.step()
            if on_update is not None:
                on_update(batches.epoch, step + 1, total)
        timing.data += gathered - began
        timing.steps.append(clock() - began)
    return float(total), timing


def _run_engine_epoch(network, batches: _Batches, loss_fn, engine, accumulate: int,
                      on_update: Optional[_UpdateHook] = None) -> tuple[float, StepTiming]:
    """One pass where DeepSpeed's engine does backward and step (it counts accumulation)."""
    device = _device_of(network)
    total = torch.full((), batches.total, device=device)
    timing, clock = StepTiming(), time.perf_counter
    iterator = batches.iterator
    for step in range(batches.start, batches.steps):
        began = clock()
        xb, yb = next(iterator)
        if xb.device != device:
            xb, yb = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
        gathered = clock()
        # the boundaries follow the epoch, as in the loop without DeepSpeed: every
        # ``accumulate`` batches and at the epoch's last. Left to DeepSpeed's own micro-step
        # count they ran across epochs, so a checkpoint (at an epoch's end, or mid-epoch)
        # could fall inside an accumulation and a resumed run lost its partial gradient
        boundary = (step + 1) % accumulate == 0 or step + 1 == batches.steps
        if accumulate > 1:
            engine.set_gradient_accumulation_boundary(boundary)
        loss = loss_fn(network(xb), yb)
        engine.backward(loss)
        engine.step()
        total += loss.detach().float() * len(xb)
        if on_update is not None and boundary:
            on_update(batches.epoch, step + 1, total)
        timing.data += gathered - began
        timing.steps.append(clock() - began)
    return float(total), timing


def _device_of(network) -> torch.device:
    """Where the network's parameters are (the batches go there)."""
    return next(network.parameters()).device


def _step_checkpointer(state: _RunState, checkpoints, training: TrainingSpec,
                       tensors) -> Optional[_UpdateHook]:
    """The hook that writes a mid-epoch checkpoint every
    ``training.checkpointing.every_n_steps`` batches (streamed data only), with the loader's
    position and the epoch's loss so far."""
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


def _validate(network, tensors, loss_fn, autocast, score, *, device=None) -> dict[str, float]:
    network.eval()
    if is_streamed(tensors):
        return _validate_streamed(network, tensors, loss_fn, autocast, score, device)
    with torch.inference_mode(), autocast():
        out = network(tensors.x_val)
        metrics = {"val_loss": float(loss_fn(out, tensors.y_val))}
    if score is not None:
        metrics.update(score(out.float(), tensors.y_val))
    return metrics


def _validate_streamed(network, tensors, loss_fn, autocast, score, device) -> dict[str, float]:
    """The validation split batch by batch: the loss weighted by rows; the outputs (one small
    column per row) kept for the scorer."""
    outputs, targets, loss_sum, rows = [], [], 0.0, 0
    with torch.inference_mode(), autocast():
        for xb, yb in tensors.validation():
            xb, yb = xb.to(device), yb.to(device)
            out = network(xb)
            loss_sum += float(loss_fn(out, yb)) * len(xb)
            rows += len(xb)
            if score is not None:
                outputs.append(out.float())
                targets.append(yb)
    metrics = {"val_loss": loss_sum / max(rows, 1)}
    if score is not None and outputs:
        metrics.update(score(torch.cat(outputs), torch.cat(targets)))
    return metrics


def _autocast(precision: str, device: torch.device):
    import contextlib

    if precision == "fp32":
        return contextlib.nullcontext
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return lambda: torch.autocast(device_type=device.type, dtype=dtype)


class _EarlyStopping:
    """Tracks the best epoch of the monitored metric; keeps its weights when asked."""

    def __init__(self, training: TrainingSpec):
        spec = training.early_stopping
        self.spec = spec
        self.monitor = spec.monitor if spec else "val_loss"
        mode = spec.mode if spec else "auto"
        self.minimize = lower_is_better(self.monitor) if mode == "auto" else mode == "min"
        self.best_value: Optional[float] = None
        self.best_epoch = -1
        self.best_state: Optional[dict] = None
        self.wait = 0
        self.should_stop = False

    def update(self, epoch: int, metrics: dict[str, float], network: nn.Module) -> bool:
        value = metrics.get(self.monitor, metrics.get("val_loss", metrics["train_loss"]))
        delta = self.spec.min_delta if self.spec else 0.0
        better = self.best_value is None or (
            value < self.best_value - delta if self.minimize else value > self.best_value + delta)
        if better:
            self.best_value, self.best_epoch, self.wait = value, epoch, 0
            if self.spec is not None and self.spec.restore_best:
                self.best_state = copy.deepcopy(network.state_dict())
        else:
            self.wait += 1
            if self.spec is not None and self.wait >= self.spec.patience:
                self.should_stop = True
        return better

    def restore(self, network: nn.Module) -> None:
        if self.best_state is not None:
            network.load_state_dict(self.best_state)

    def state(self) -> dict[str, Any]:
        return {"best_value": self.best_value, "best_epoch": self.best_epoch, "wait": self.wait,
                "best_state": self.best_state, "should_stop": self.should_stop}

    def load(self, state: dict[str, Any]) -> None:
        self.best_value, self.best_epoch = state["best_value"], state["best_epoch"]
        self.wait, self.best_state = state["wait"], state["best_state"]
        self.should_stop = state.get("should_stop", False)
