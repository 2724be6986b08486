"""Threshold gates: a metric of the new version within fixed bounds (``min`` / ``max``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, FrozenSet

from dbspec.seams.gates import METRICS, GateInputs, GateResult

if TYPE_CHECKING:
    from dbspec.spec.sections.lifecycle import Gate


class ThresholdGate:
    """``{metric: test_rmse, max: 65}``: the candidate's figure must lie within the bounds; a
    metric it did not log fails the gate."""

    name = "threshold"
    needs: FrozenSet[str] = frozenset({METRICS})

    def applies(self, gate: Gate) -> bool:
        return gate.metric is not None and (gate.min is not None or gate.max is not None)

    def evaluate(self, gate: Gate, inputs: GateInputs) -> GateResult:
        metric = str(gate.metric)
        value = inputs.metrics.get(metric)
        bounds = " and ".join(part for part in (
            f">= {gate.min:g}" if gate.min is not None else "",
            f"<= {gate.max:g}" if gate.max is not None else "") if part)
        passed = value is not None and (gate.min is None or value >= gate.min) and \
            (gate.max is None or value <= gate.max)
        return GateResult(metric, bounds, value, None, passed, stage=inputs.stage)


KIND = ThresholdGate()
