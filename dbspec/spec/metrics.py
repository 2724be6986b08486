"""The metrics a spec logs, and which way each improves: the one place dbspec decides it.

Early stopping, the LR scheduler, the Optuna study's direction, promotion gates
(``better_than``), the scaffold's comments and drift monitoring's quality drops all ask here,
so that a metric never counts as better in one and worse in another.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from dbspec.errors import did_you_mean

if TYPE_CHECKING:
    from dbspec.spec.sections import Spec

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


def metric_names(spec: Spec) -> list[str]:
    """Metric names a run of this spec logs: losses plus ``val_``/``test_`` of each metric."""
    # the spec models only here: the direction rule above is imported without them
    from dbspec.spec.sections.lifecycle import DEFAULT_METRICS

    metrics = spec.evaluation.metrics or DEFAULT_METRICS[spec.data.task]
    return ["train_loss", "val_loss", "test_loss"] + [f"{split}_{m}" for split in ("val", "test")
                                                      for m in metrics]


def gate_metric_problems(spec: Spec) -> Iterator[tuple[tuple, str]]:
    """(dotted path, message) of each promotion gate on a metric the spec does not compute."""
    if spec.registry is None or spec.registry.promotion is None:
        return
    names = [n for n in metric_names(spec) if n != "train_loss"]
    for number, stage in enumerate(spec.registry.promotion_stages()):
        where = spec.registry.stage_location(number)
        for index, gate in enumerate(stage.gates):
            if gate.metric is not None and gate.metric not in names:
                yield ((*where, "gates", index, "metric"),
                       f"gate on '{gate.metric}'{did_you_mean(gate.metric, names)}, which this "
                       f"spec does not compute; it computes {', '.join(names)}")
