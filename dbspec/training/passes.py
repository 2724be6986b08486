"""One pass over an epoch's batches: the training steps (plain, or under DeepSpeed's engine) and
validation; per batch, what a hand-written loop does plus two clock reads. What an epoch is
(batches, optimizer, early stopping, checkpoints) is :mod:`dbspec.training.loop`'s."""

from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Iterable, Iterator, Optional

import torch
from torch import nn

from dbspec.spec.sections.training import TrainingSpec

#: Called after an optimizer step with (epoch, batches done, the epoch's summed loss so far).
UpdateHook = Callable[[int, int, torch.Tensor], None]
#: Called with no argument, the context a forward pass runs in (autocast, or nothing).
Autocast = Callable[[], ContextManager[Any]]
ScoreFn = Callable[[torch.Tensor, torch.Tensor], dict[str, float]]
#: A batch of inputs and targets.
Batch = tuple[torch.Tensor, torch.Tensor]
#: One training step on a batch, told whether it ends an accumulation; returns the batch's
#: loss, or None for a batch it skipped.
StepFn = Callable[[torch.Tensor, torch.Tensor, bool], Optional[torch.Tensor]]


class StepTiming:
    """Where an epoch's time went: gathering batches vs the rest of each step.

    Two clock reads per step (~0.1 us); on CUDA the split is of launch time, since kernels run
    asynchronously, so GPU runs are diagnosed from the GPU's own utilisation instead.
    """

    __slots__ = ("data", "steps")

    def __init__(self) -> None:
        self.data = 0.0
        self.steps: list[float] = []

    def metrics(self) -> dict[str, float]:
        if not self.steps:
            return {}
        total, mean = sum(self.steps), statistics.fmean(self.steps)
        spread = statistics.pstdev(self.steps, mean)
        return {"data_seconds": self.data, "compute_seconds": max(total - self.data, 0.0),
                "step_time_ms": mean * 1000, "step_time_cv": spread / mean if mean else 0.0}


@dataclass
class Batches:
    """One epoch's training batches, from memory (index slicing) or streamed from shards.

    Attributes:
        steps: Batches (and ``rows``: rows) in the whole epoch.
        start: The first batch this pass trains (after a mid-epoch resume, else 0).
        total: The summed loss of the batches before ``start``.
        iterator: The ``(x, y)`` batches from ``start`` on.
    """

    epoch: int
    steps: int
    start: int
    rows: int
    total: float
    iterator: Iterator[Batch]

    def close(self) -> None:
        """Stop a stream's prefetch thread now (an error left the epoch early)."""
        close = getattr(self.iterator, "close", None)
        if close is not None:
            close()


@dataclass
class Updates:
    """How a pass without DeepSpeed turns losses into weight updates: the optimizer, the
    scheduler (stepped per update only for ``onecycle``) and the fp16 gradient scaler."""

    optimizer: Any
    scheduler: Any = None
    scaler: Optional[torch.amp.GradScaler] = None


def run_epoch(network: nn.Module, batches: Batches, step: StepFn, accumulate: int,
              on_update: Optional[UpdateHook] = None) -> tuple[float, StepTiming]:
    """One pass over the training rows; returns the summed loss and the step timing.

    The accumulation boundaries follow the epoch: every ``accumulate`` batches and at its last
    (left to DeepSpeed's own micro-step count they ran across epochs, so a checkpoint could
    fall inside an accumulation and a resumed run lost its partial gradient).
    """
    device = device_of(network)
    total = torch.full((), batches.total, device=device)
    timing, clock = StepTiming(), time.perf_counter
    iterator = batches.iterator
    for index in range(batches.start, batches.steps):
        began = clock()
        xb, yb = next(iterator)
        if xb.device != device:
            xb, yb = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
        gathered = clock()
        boundary = (index + 1) % accumulate == 0 or index + 1 == batches.steps
        loss = step(xb, yb, boundary)
        if loss is None:
            continue
        total += loss.detach().float() * len(xb)
        if on_update is not None and boundary:
            on_update(batches.epoch, index + 1, total)
        timing.data += gathered - began
        timing.steps.append(clock() - began)
    return float(total), timing


def plain_step(network: nn.Module, training: TrainingSpec, loss_fn: nn.Module,
               autocast: Autocast, updates: Updates, rows: int) -> StepFn:
    """A step without DeepSpeed: forward, backward (scaled under fp16, divided over the
    accumulated batches), and at a boundary the update (:func:`_update`)."""
    accumulate = training.gradient_accumulation
    # batch norm cannot train on one row: a last batch of one is dropped (one row, one epoch)
    has_batch_norm = any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in network.modules())
    scaler = updates.scaler

    def step(xb: torch.Tensor, yb: torch.Tensor, boundary: bool) -> Optional[torch.Tensor]:
        if has_batch_norm and len(xb) == 1 and rows > 1:
            return None
        with autocast():
            loss = loss_fn(network(xb), yb)
        scaled = loss / accumulate if accumulate > 1 else loss
        if scaler is not None:
            scaler.scale(scaled).backward()
        else:
            scaled.backward()
        if boundary:
            _update(network, training, updates)
        return loss

    updates.optimizer.zero_grad(set_to_none=True)
    return step


def _update(network: nn.Module, training: TrainingSpec, updates: Updates) -> None:
    """One optimizer step over the accumulated gradients: unscale and clip, step, zero, and
    step a per-update scheduler."""
    optimizer, scaler, clipping = updates.optimizer, updates.scaler, training.gradient_clipping
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
    schedule = training.scheduler
    if updates.scheduler is not None and schedule is not None and schedule.name == "onecycle":
        updates.scheduler.step()


def engine_step(network: nn.Module, loss_fn: nn.Module, engine: Any, accumulate: int) -> StepFn:
    """A step where DeepSpeed's engine does backward and step (told the epoch's boundaries)."""

    def step(xb: torch.Tensor, yb: torch.Tensor, boundary: bool) -> torch.Tensor:
        if accumulate > 1:
            engine.set_gradient_accumulation_boundary(boundary)
        loss = loss_fn(network(xb), yb)
        engine.backward(loss)
        engine.step()
        return loss

    return step


def device_of(network: nn.Module) -> torch.device:
    return next(network.parameters()).device


def autocast_for(precision: str, device: torch.device) -> Autocast:
    """The forward pass's context for ``precision`` (``fp32``, ``bf16``, ``fp16``)."""
    if precision == "fp32":
        return contextlib.nullcontext
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return lambda: torch.autocast(device_type=device.type, dtype=dtype)


def validate(network: nn.Module, batches: Callable[[], Iterable[Batch]], loss_fn: nn.Module,
             autocast: Autocast, score: Optional[ScoreFn]) -> dict[str, float]:
    """``val_loss`` (weighted by rows) and the scorer's metrics of the validation batches
    (``batches()`` yields them: one batch held in memory, or a stream); the outputs, one small
    column per row, are kept for the scorer."""
    network.eval()
    device = device_of(network)
    outputs: list[torch.Tensor] = []
    targets: list[torch.Tensor] = []
    loss_sum, rows = 0.0, 0
    with torch.inference_mode(), autocast():
        for xb, yb in batches():
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
