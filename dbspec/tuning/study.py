"""The study's parts named in ``search``: direction, sampler, pruner, suggestions, study name."""

from __future__ import annotations

import math
from typing import Any, Optional

from dbspec.spec.sections import Spec
from dbspec.spec.sections.search import CategoricalDistribution, FloatDistribution, SearchSpec
from dbspec.spec.semantics import lower_is_better


def direction(search: SearchSpec) -> str:
    """``minimize`` or ``maximize``: given, or from the metric name."""
    if search.direction != "auto":
        return search.direction
    return "minimize" if lower_is_better(search.metric) else "maximize"


def make_sampler(search: SearchSpec, seed: int):
    """The Optuna sampler named in ``search.sampler``."""
    import optuna

    name, startup = search.sampler.name, search.sampler.startup_trials
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "cmaes":
        return optuna.samplers.CmaEsSampler(seed=seed, n_startup_trials=startup,
                                            warn_independent_sampling=False)
    if name == "qmc":
        return optuna.samplers.QMCSampler(seed=seed, warn_independent_sampling=False)
    return optuna.samplers.GridSampler(grid_space(search), seed=seed)


def grid_space(search: SearchSpec) -> dict[str, list]:
    """Every value of each path, for the grid sampler (validation ensures it is finite)."""
    space: dict[str, list] = {}
    for path, dist in search.space.items():
        if isinstance(dist, CategoricalDistribution):
            space[path] = list(dist.choices)
        elif isinstance(dist, FloatDistribution):
            low, high = dist.low_high
            count = int(math.floor((high - low) / dist.step + 1e-9)) + 1
            space[path] = [round(low + i * dist.step, 12) for i in range(count)]
        else:
            low, high = dist.low_high
            space[path] = list(range(low, high + 1, dist.step))
    return space


def make_pruner(search: SearchSpec, epochs: int):
    """The Optuna pruner named in ``search.pruner``; it sees one report per epoch. The median
    pruner reads finished trials once per trial (:mod:`~dbspec.tuning.pruning`)."""
    import optuna

    from dbspec.tuning.pruning import FinishedTrialsPruner

    spec = search.pruner
    if spec.name == "median":
        return FinishedTrialsPruner(optuna.pruners.MedianPruner(
            n_startup_trials=spec.startup_trials, n_warmup_steps=spec.warmup_epochs))
    if spec.name == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=spec.min_resource,
                                              max_resource=max(epochs, spec.min_resource),
                                              reduction_factor=spec.reduction_factor)
    if spec.name == "successive_halving":
        # not wrapped: it lists every trial, which the list of finished trials cannot answer
        return optuna.pruners.SuccessiveHalvingPruner(
            min_resource=spec.min_resource, reduction_factor=spec.reduction_factor)
    return optuna.pruners.NopPruner()


def suggest(trial, search: SearchSpec) -> dict[str, Any]:
    """One value per space path, named by the path."""
    values: dict[str, Any] = {}
    for path, dist in search.space.items():
        if isinstance(dist, CategoricalDistribution):
            values[path] = trial.suggest_categorical(path, dist.choices)
        elif isinstance(dist, FloatDistribution):
            low, high = dist.low_high
            values[path] = trial.suggest_float(path, low, high, log=dist.log, step=dist.step)
        else:
            low, high = dist.low_high
            values[path] = trial.suggest_int(path, low, high, log=dist.log,
                                             step=1 if dist.log else dist.step)
    return values


def default_study_name(spec: Spec, target: Optional[str], fingerprint: str, smoke: bool) -> str:
    """The spec's name, target and search fingerprint: a changed search starts a new study."""
    if spec.search.study_name:
        return spec.search.study_name + ("-smoke" if smoke else "")
    base = spec.name + (f"@{target}" if target else "")
    return f"{base}-{fingerprint[:8]}" + ("-smoke" if smoke else "")
