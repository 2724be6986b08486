"""TensorBoard event files of a training run: per-epoch scalars and, when asked, weight and
gradient histograms and the model graph (``torch.utils.tensorboard``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Optional

_TAGS = {"train_loss": "loss/train", "val_loss": "loss/val", "lr": "optim/lr"}
_SPEED = ("samples_per_second", "epoch_seconds", "step_time_ms", "data_seconds",
          "compute_seconds", "input_stall_seconds", "step_time_cv")


def settings_of(tracking) -> Optional[Any]:
    """The spec's ``tracking.tensorboard`` as a TensorboardSpec, or None when off."""
    from dbspec.spec.sections.lifecycle import TensorboardSpec

    value = tracking.tensorboard
    if value is True:
        return TensorboardSpec()
    if value is False or value is None or not value.enabled:
        return None
    return value


def tag_of(name: str) -> str:
    """Where a metric goes in TensorBoard's tag tree."""
    if name in _TAGS:
        return _TAGS[name]
    if name.startswith("val_"):
        return f"val/{name[4:]}"
    if name in _SPEED:
        return f"speed/{name}"
    return f"system/{name}"


class TensorboardLog:
    """An epoch callback writing event files under ``log_dir``."""

    def __init__(self, log_dir: Path, settings, network, example=None):
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = Path(log_dir)
        self.settings = settings
        self.network = network
        self.writer = SummaryWriter(str(self.log_dir))
        self.grads: dict[str, Any] = {}
        if settings.histograms:
            for name, parameter in network.named_parameters():
                if parameter.requires_grad:  # keeps a reference to the last gradient, no copy
                    parameter.register_post_accumulate_grad_hook(
                        lambda p, name=name: self.grads.__setitem__(name, p.grad))
        if settings.graph and example is not None:
            try:
                self.writer.add_graph(network, example)
            except Exception as exc:  # tracing fails on some models; the scalars still matter
                print(f"  tensorboard: no model graph ({type(exc).__name__}: "
                      f"{str(exc).splitlines()[0][:120]})", file=sys.stderr)

    def __call__(self, *, epoch: int, metrics: dict[str, float], **_: Any) -> None:
        step = epoch + 1
        for name, value in metrics.items():
            self.writer.add_scalar(tag_of(name), value, step)
        if self.settings.histograms:
            for name, parameter in self.network.named_parameters():
                self.writer.add_histogram(f"weights/{name}", parameter.detach().float().cpu(),
                                          step)
                grad = self.grads.get(name)
                if grad is not None:
                    self.writer.add_histogram(f"gradients/{name}", grad.detach().float().cpu(),
                                              step)

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()
