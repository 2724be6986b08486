"""Promotion gates: a version's metrics against fixed bounds and against an alias's holder, and
its learning-curve diagnosis against what a gate asks of it."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable, Optional

from dbspec.registry.errors import RegistryError
from dbspec.spec.sections.lifecycle import Gate
from dbspec.spec.semantics import lower_is_better

#: Version tag with the learning-curve diagnosis of the version's training run.
DIAGNOSIS_TAG = "dbspec.diagnosis"
#: Labels a diagnosis gate knows; anything else (None, ``undetermined``) fails every such gate.
_CONTRADICTS = {"not_overfitting": {"overfitting"}, "not_underfitting": {"underfitting"}}


@dataclass(frozen=True)
class GateResult:
    """The outcome of one gate for one version (recorded as JSON in a ``dbspec.gate.N`` tag).

    Attributes:
        stage: The promotion stage (alias) the gate belongs to; empty for a single promotion.
        label: A diagnosis gate's diagnosis (None: unknown).
    """

    metric: str
    condition: str
    value: Optional[float]
    reference: Optional[float]
    passed: bool
    note: str = ""
    stage: str = ""
    label: Optional[str] = None

    def describe(self) -> str:
        """``test_rmse=54.21 <= 65: pass``; a stage's gate starts with ``@staging:``."""
        if self.metric == "diagnosis":
            shown = self.label or "unknown"
        else:
            shown = "missing" if self.value is None else f"{self.value:.6g}"
        verdict = "pass" if self.passed else "FAIL"
        note = f" ({self.note})" if self.note else ""
        where = f"@{self.stage}: " if self.stage else ""
        return f"{where}{self.metric}={shown} {self.condition}: {verdict}{note}"

    def to_tag(self) -> dict[str, Any]:
        """The JSON recorded for it (``stage`` and ``label`` only where set, so a single
        promotion's records read as before)."""
        return {k: v for k, v in asdict(self).items()
                if k not in ("stage", "label") or v not in ("", None)}


@dataclass(frozen=True)
class Champion:
    """What a ``better_than`` gate compares with.

    Attributes:
        version: The version compared with; None when the registry confirmed that nothing
            holds the alias (the gate then passes).
        value: Its metric; None when it has none that can be compared (the gate then fails).
        note: Said instead of the default (who holds the alias, and how it was found).
    """

    version: Optional[str]
    value: Optional[float] = None
    note: str = ""


def check_gates(gates: list[Gate], metrics: dict[str, float],
                reference: Callable[[str, str], Champion], *,
                diagnosis: Optional[str] = None, stage: str = "") -> list[GateResult]:
    """Evaluate every gate against a version's metrics and diagnosis.

    Args:
        gates: The gates of one promotion stage.
        metrics: The candidate's metrics (``test_rmse``...).
        reference: ``(alias, metric) -> Champion``: the alias's holder and its metric. A
            :class:`RegistryError` it raises fails that gate, with the error as its note: a
            champion that cannot be read is never "no champion".
        diagnosis: The candidate's learning-curve label (``overfitting``, ``underfitting``,
            ``converged``, ``undetermined``), None when unknown. Unknown or undetermined fails
            every diagnosis gate (fail closed: nothing says the curves were fine).
        stage: The stage's alias, recorded with each result (empty for a single promotion).
    """
    results = []
    for gate in gates:
        if gate.diagnosis is not None:
            results.append(_diagnosed(gate.diagnosis, diagnosis, stage))
            continue
        value = metrics.get(gate.metric)
        if gate.min is not None or gate.max is not None:
            bounds = " and ".join(part for part in (
                f">= {gate.min:g}" if gate.min is not None else "",
                f"<= {gate.max:g}" if gate.max is not None else "") if part)
            passed = value is not None and (gate.min is None or value >= gate.min) and \
                (gate.max is None or value <= gate.max)
            results.append(GateResult(gate.metric, bounds, value, None, passed, stage=stage))
        if gate.better_than is not None:
            try:
                champion = reference(gate.better_than, gate.metric)
            except RegistryError as exc:
                results.append(GateResult(gate.metric, _condition(gate), value, None, False,
                                          f"cannot compare with @{gate.better_than}: {exc}",
                                          stage=stage))
                continue
            results.append(_versus(gate, value, champion, stage))
    return results


def _diagnosed(condition: str, label: Optional[str], stage: str) -> GateResult:
    words = condition.replace("_", " ")
    if label in (None, "undetermined"):
        why = "no learning-curve diagnosis recorded" if label is None else \
            "the learning curves were undetermined"
        return GateResult("diagnosis", words, None, None, False,
                          f"{why}; an unknown diagnosis fails the gate", stage, label)
    passed = label == "converged" if condition == "converged" else \
        label not in _CONTRADICTS[condition]
    return GateResult("diagnosis", words, None, None, passed, "", stage, label)


def _condition(gate: Gate) -> str:
    sign = "<=" if lower_is_better(gate.metric) else ">="
    return f"{sign} @{gate.better_than}" + (f" ± {gate.tolerance:g}" if gate.tolerance else "")


def _versus(gate: Gate, value: Optional[float], champion: Champion, stage: str) -> GateResult:
    condition, alias = _condition(gate), gate.better_than
    if champion.version is None:
        return GateResult(gate.metric, condition, value, None, value is not None,
                          champion.note or f"no version holds @{alias} yet", stage)
    who = f"v{champion.version}" + (f", {champion.note}" if champion.note else "")
    if champion.value is None:
        return GateResult(gate.metric, condition, value, None, False,
                          f"@{alias} ({who}) has no {gate.metric} to compare with", stage)
    if value is None:
        return GateResult(gate.metric, condition, None, champion.value, False, stage=stage)
    passed = value <= champion.value + gate.tolerance if lower_is_better(gate.metric) \
        else value >= champion.value - gate.tolerance
    return GateResult(gate.metric, condition, value, champion.value, passed,
                      f"@{alias} has {champion.value:.6g} ({who})", stage)
