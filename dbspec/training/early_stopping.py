"""Early stopping: the best epoch of the monitored metric, patience, and restore-best."""

from __future__ import annotations

import copy
from typing import Any, Optional

from torch import nn

from dbspec.spec.sections.training import TrainingSpec
from dbspec.spec.semantics import lower_is_better

#: What a checkpoint keeps of an :class:`EarlyStopping`.
_STATE = ("best_value", "best_epoch", "wait", "best_state", "should_stop")


class EarlyStopping:
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
        """Take an epoch's metrics; returns whether the monitored one improved."""
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
        """Put the best epoch's weights back, when they were kept."""
        if self.best_state is not None:
            network.load_state_dict(self.best_state)

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps of it."""
        return {name: getattr(self, name) for name in _STATE}

    def load(self, state: dict[str, Any]) -> None:
        """Continue from a checkpoint's :meth:`state`."""
        for name in _STATE:
            setattr(self, name, state[name])
