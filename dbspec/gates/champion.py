"""Champion gates: the new version against the version an alias holds (``better_than``),
in the direction its metric improves (:mod:`dbspec.spec.metrics`), within ``tolerance``."""

from __future__ import annotations

from typing import TYPE_CHECKING, FrozenSet, Optional

from dbspec.registry.errors import RegistryError
from dbspec.seams.gates import CHAMPION, METRICS, Champion, GateInputs, GateResult
from dbspec.spec.metrics import at_least_as_good, no_worse_sign

if TYPE_CHECKING:
    from dbspec.spec.sections.lifecycle import Gate


class ChampionGate:
    """``{metric: test_rmse, better_than: production, tolerance: 2}``: at least as good as
    the holder of ``@production``, give or take the tolerance. No holder (confirmed) passes; a
    holder that cannot be read, or lacks the metric, fails: never taken for "no champion"."""

    name = "champion"
    needs: FrozenSet[str] = frozenset({METRICS, CHAMPION})

    def applies(self, gate: Gate) -> bool:
        return gate.metric is not None and gate.better_than is not None

    def evaluate(self, gate: Gate, inputs: GateInputs) -> GateResult:
        metric, alias = str(gate.metric), str(gate.better_than)
        value = inputs.metrics.get(metric)
        condition = f"{no_worse_sign(metric)} @{alias}" + \
            (f" ± {gate.tolerance:g}" if gate.tolerance else "")
        if inputs.champion is None:
            return GateResult(metric, condition, value, None, False,
                              f"no champion lookup for @{alias}", inputs.stage)
        try:
            champion = inputs.champion(alias, metric)
        except RegistryError as exc:
            return GateResult(metric, condition, value, None, False,
                              f"cannot compare with @{alias}: {exc}", inputs.stage)
        return _versus(gate, condition, value, champion, inputs.stage)


def _versus(gate: Gate, condition: str, value: Optional[float], champion: Champion,
            stage: str) -> GateResult:
    metric, alias = str(gate.metric), gate.better_than
    if champion.version is None:
        return GateResult(metric, condition, value, None, value is not None,
                          champion.note or f"no version holds @{alias} yet", stage)
    who = f"v{champion.version}" + (f", {champion.note}" if champion.note else "")
    if champion.value is None:
        return GateResult(metric, condition, value, None, False,
                          f"@{alias} ({who}) has no {metric} to compare with", stage)
    if value is None:
        return GateResult(metric, condition, None, champion.value, False, stage=stage)
    passed = at_least_as_good(metric, value, champion.value, gate.tolerance)
    return GateResult(metric, condition, value, champion.value, passed,
                      f"@{alias} has {champion.value:.6g} ({who})", stage)


KIND = ChampionGate()
