"""Promotion gates: a version's metrics against fixed bounds and against an alias's holder."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from dbspec.registry.errors import RegistryError
from dbspec.spec.sections.lifecycle import Gate
from dbspec.spec.semantics import lower_is_better


@dataclass(frozen=True)
class GateResult:
    """The outcome of one gate for one version (recorded as JSON in a ``dbspec.gate.N`` tag)."""

    metric: str
    condition: str
    value: Optional[float]
    reference: Optional[float]
    passed: bool
    note: str = ""

    def describe(self) -> str:
        """``test_rmse=54.21 <= 65: pass``."""
        shown = "missing" if self.value is None else f"{self.value:.6g}"
        verdict = "pass" if self.passed else "FAIL"
        note = f" ({self.note})" if self.note else ""
        return f"{self.metric}={shown} {self.condition}: {verdict}{note}"


def check_gates(gates: list[Gate], metrics: dict[str, float],
                reference: Callable[[str, str], Optional[float]]) -> list[GateResult]:
    """Evaluate every gate against a version's metrics.

    Args:
        gates: The spec's promotion gates.
        metrics: The candidate's metrics (``test_rmse``...).
        reference: ``(alias, metric) -> value`` of the alias's current holder, or None when
            the alias is unset. A :class:`RegistryError` it raises fails that gate, with the
            error as its note: a champion that cannot be read is never "no champion".
    """
    results = []
    for gate in gates:
        value = metrics.get(gate.metric)
        if gate.min is not None or gate.max is not None:
            bounds = " and ".join(part for part in (
                f">= {gate.min:g}" if gate.min is not None else "",
                f"<= {gate.max:g}" if gate.max is not None else "") if part)
            passed = value is not None and (gate.min is None or value >= gate.min) and \
                (gate.max is None or value <= gate.max)
            results.append(GateResult(gate.metric, bounds, value, None, passed))
        if gate.better_than is not None:
            try:
                champion = reference(gate.better_than, gate.metric)
            except RegistryError as exc:
                results.append(GateResult(gate.metric, _condition(gate), value, None, False,
                                          f"cannot compare with @{gate.better_than}: {exc}"))
                continue
            results.append(_versus(gate, value, champion))
    return results


def _condition(gate: Gate) -> str:
    sign = "<=" if lower_is_better(gate.metric) else ">="
    return f"{sign} @{gate.better_than}" + (f" ± {gate.tolerance:g}" if gate.tolerance else "")


def _versus(gate: Gate, value: Optional[float], champion: Optional[float]) -> GateResult:
    condition = _condition(gate)
    if champion is None:
        return GateResult(gate.metric, condition, value, None, value is not None,
                          f"no version holds @{gate.better_than} yet")
    if value is None:
        return GateResult(gate.metric, condition, None, champion, False)
    passed = value <= champion + gate.tolerance if lower_is_better(gate.metric) \
        else value >= champion - gate.tolerance
    return GateResult(gate.metric, condition, value, champion, passed,
                      f"@{gate.better_than} has {champion:.6g}")
