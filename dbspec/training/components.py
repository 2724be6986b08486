"""Losses, optimizers and schedulers named in the spec, as torch objects."""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from dbspec.spec.sections.training import LOSS_NAMES, TrainingSpec

#: The torch class of each of the spec's loss names (:data:`LOSS_NAMES` is the list; a test
#: holds the two to the same set).
LOSS_CLASSES: dict[str, type[nn.Module]] = {
    "mse": nn.MSELoss, "mae": nn.L1Loss, "huber": nn.HuberLoss, "smooth_l1": nn.SmoothL1Loss,
    "bce": nn.BCEWithLogitsLoss, "cross_entropy": nn.CrossEntropyLoss, "nll": nn.NLLLoss,
}


def build_loss(name: str) -> nn.Module:
    """The loss module for a resolved loss name (``auto`` is resolved before; another name
    is a ValueError)."""
    if name not in LOSS_CLASSES:
        raise ValueError(f"unknown loss {name!r}; the spec's losses are {', '.join(LOSS_NAMES)}")
    return LOSS_CLASSES[name]()


def build_optimizer(network: nn.Module, spec) -> torch.optim.Optimizer:
    """The optimizer of ``training.optimizer`` over the network's parameters."""
    params = network.parameters()
    common = {"lr": spec.lr, "weight_decay": spec.weight_decay}
    if spec.name in ("adam", "adamw"):
        cls = torch.optim.Adam if spec.name == "adam" else torch.optim.AdamW
        return cls(params, betas=spec.betas, eps=spec.eps, amsgrad=spec.amsgrad, **common)
    if spec.name == "sgd":
        return torch.optim.SGD(params, momentum=spec.momentum, nesterov=spec.nesterov,
                               dampening=spec.dampening, **common)
    if spec.name == "rmsprop":
        return torch.optim.RMSprop(params, alpha=spec.alpha, momentum=spec.momentum, eps=spec.eps,
                                   centered=spec.centered, **common)
    return torch.optim.Adagrad(params, lr_decay=spec.lr_decay, **common)


def build_scheduler(optimizer: torch.optim.Optimizer, training: TrainingSpec, epochs: int,
                    updates_per_epoch: int) -> Optional[object]:
    """The learning-rate scheduler, or None; ``onecycle`` steps per update, the rest per epoch."""
    spec = training.scheduler
    if spec is None:
        return None
    sched = torch.optim.lr_scheduler
    if spec.name == "step":
        return sched.StepLR(optimizer, step_size=spec.step_size, gamma=spec.gamma)
    if spec.name == "multistep":
        return sched.MultiStepLR(optimizer, milestones=spec.milestones, gamma=spec.gamma)
    if spec.name == "exponential":
        return sched.ExponentialLR(optimizer, gamma=spec.gamma)
    if spec.name == "cosine":
        return sched.CosineAnnealingLR(optimizer, T_max=spec.t_max or epochs, eta_min=spec.eta_min)
    if spec.name == "plateau":
        from dbspec.spec.semantics import lower_is_better

        return sched.ReduceLROnPlateau(optimizer, factor=spec.factor, patience=spec.patience,
                                       mode="min" if lower_is_better(spec.monitor) else "max")
    return sched.OneCycleLR(optimizer, max_lr=spec.max_lr, epochs=epochs,
                            steps_per_epoch=updates_per_epoch, pct_start=spec.pct_start)

