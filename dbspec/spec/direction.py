"""Which way a metric improves: the one place dbspec decides it.

Early stopping, the LR scheduler, the Optuna study's direction, promotion gates
(``better_than``) and drift monitoring's quality drops all ask here, so that a metric never
counts as better in one and worse in another.
"""

from __future__ import annotations

#: Metric name endings whose lower values are better; any other metric improves upwards.
_LOWER_IS_BETTER = ("loss", "rmse", "mae", "mse", "mape", "log_loss")


def lower_is_better(metric: str) -> bool:
    """Direction of a metric from its name (``val_rmse`` down, ``val_accuracy`` up)."""
    return metric.endswith(_LOWER_IS_BETTER)


def no_worse_sign(metric: str) -> str:
    """``<=`` for a metric that improves downwards, else ``>=``: how "at least as good as"
    reads for it."""
    return "<=" if lower_is_better(metric) else ">="


def at_least_as_good(metric: str, value: float, reference: float,
                     tolerance: float = 0.0) -> bool:
    """Whether ``value`` is no worse than ``reference`` by more than ``tolerance`` (absolute),
    in the direction ``metric`` improves."""
    if lower_is_better(metric):
        return value <= reference + tolerance
    return value >= reference - tolerance
