"""Everything that watches a training run: the resource monitor, TensorBoard, the diagnosis.

``TrainingObserver`` wraps one training (a run, a search trial, rank 0 of a distributed run):
its epoch callback adds the latest resource sample to the epoch's metrics (so they reach MLflow
and the progress line with the training step) and writes TensorBoard events; at the end it
diagnoses the run.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Optional

from dbspec.observability.diagnosis import Finding, RunFacts, diagnose
from dbspec.observability.resources import ResourceMonitor, sample_metrics
from dbspec.observability.tensorboard import TensorboardLog, settings_of

_TOLD = False  # whether this process said that GPU metrics are unavailable


def gpu_expected(compute) -> bool:
    """Whether the spec's compute asks for a GPU outright (its kind decides: ``single_gpu``,
    ``device: cuda``, ``use_gpu: true``); ``auto`` is content with a CPU."""
    from dbspec.seams.compute import COMPUTE

    return COMPUTE.get(compute.kind).gpu_expected(compute)


def training_flops_per_row(network, example) -> Optional[float]:
    """Arithmetic of one training row: the forward pass counted by torch's ``FlopCounterMode``
    on ``example`` (no gradients, eval mode: dropout draws no random numbers, batch norm keeps
    its statistics), times 3 for the backward pass. None where it cannot be counted."""
    if example is None or len(example) == 0:
        return None
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    modes = [(module, module.training) for module in network.modules()]
    try:
        network.eval()
        example = example.to(next(network.parameters()).device)  # it may have moved since
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            network(example)
        return 3.0 * counter.get_total_flops() / len(example)
    except Exception:  # a custom or wrapped network the counter cannot run: no estimate
        return None
    finally:
        for module, training in modes:
            module.training = training


class TrainingObserver:
    """Monitor + TensorBoard for one training; use as a context manager around the training."""

    def __init__(self, spec, *, log_dir: Optional[Path] = None, say=None):
        self.spec = spec
        self.tensorboard_settings = settings_of(spec.tracking) if log_dir is not None else None
        self.log_dir = log_dir
        self.monitor: Optional[ResourceMonitor] = None
        if spec.tracking.monitor:
            self.monitor = ResourceMonitor(spec.tracking.monitor_interval)
        self.tensorboard: Optional[TensorboardLog] = None
        self.history: list[dict[str, float]] = []
        self.oom_batch_sizes: list[int] = []
        self.findings: list[Finding] = []
        self.parameters: Optional[int] = None
        self.flops_per_row: Optional[float] = None
        self._counted: Optional[tuple] = None  # (network, example) whose FLOPs finish() counts
        self._say = say or (lambda text: print(text, file=sys.stderr))

    def __enter__(self) -> "TrainingObserver":
        global _TOLD
        if self.monitor is not None:
            self.monitor.start()
            if self.monitor.gpu_unavailable and not _TOLD and gpu_expected(self.spec.compute):
                # once per process, not per sample; on a CPU run there is nothing to miss
                self._say(f"  monitor: GPU metrics unavailable: {self.monitor.gpu_unavailable}")
                _TOLD = True
        return self

    def attach(self, network, example=None) -> None:
        """Start TensorBoard for ``network`` (again after an out-of-memory retry) and measure
        the model's size for the diagnosis. Its FLOPs are counted by :meth:`finish`, the only
        reader: torch's first count takes seconds, which search trials (never diagnosed) skip."""
        self.parameters = sum(p.numel() for p in network.parameters())
        self._counted = (network, example)
        if self.tensorboard is not None:
            self.tensorboard.close()
        if self.tensorboard_settings is not None and self.log_dir is not None:
            self.tensorboard = TensorboardLog(self.log_dir, self.tensorboard_settings, network,
                                              example)

    def callback(self, *, epoch: int, metrics: dict[str, float], **_: Any) -> None:
        if self.monitor is not None:
            sample = self.monitor.latest() or self.monitor.sample()
            metrics.update(sample_metrics(sample))
        self.history.append(dict(metrics))
        if self.tensorboard is not None:
            self.tensorboard(epoch=epoch, metrics=metrics)

    def count_flops(self) -> None:
        """Count the attached network's arithmetic a row now (:func:`training_flops_per_row`)
        rather than in :meth:`finish`: a forward pass that, under ZeRO-3, every rank must run
        at the same time."""
        if self._counted is not None:
            self.flops_per_row = training_flops_per_row(*self._counted)
            self._counted = None

    def finish(self, *, device: str, threads: int, batch_size: int) -> list[Finding]:
        """Stop sampling, close TensorBoard, and diagnose the run."""
        self.__exit__()
        self.count_flops()
        samples = self.monitor.samples if self.monitor is not None else []
        facts = RunFacts(device=device, threads=threads, cpu_count=os.cpu_count() or 1,
                         batch_size=batch_size, oom_batch_sizes=tuple(self.oom_batch_sizes),
                         gpu_unavailable=self.monitor.gpu_unavailable if self.monitor else None,
                         parameters=self.parameters, flops_per_row=self.flops_per_row)
        self.findings = diagnose(samples, self.history, facts)
        return self.findings

    def __exit__(self, *exc: Any) -> None:
        if self.monitor is not None:
            self.monitor.stop()
        if self.tensorboard is not None:
            self.tensorboard.close()
            self.tensorboard = None
