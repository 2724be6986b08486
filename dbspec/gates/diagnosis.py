"""Diagnosis gates: the learning curves of the new version's training run
(``{diagnosis: not_overfitting | not_underfitting | converged}``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, FrozenSet

from dbspec.seams.gates import DIAGNOSIS, GateInputs, GateResult

if TYPE_CHECKING:
    from dbspec.spec.sections.lifecycle import Gate

#: The diagnoses each condition refuses (``converged`` accepts only ``converged``).
_CONTRADICTS = {"not_overfitting": {"overfitting"}, "not_underfitting": {"underfitting"}}


class DiagnosisGate:
    """An unknown or undetermined diagnosis fails every such gate (fail closed: nothing says
    the curves were fine)."""

    name = "diagnosis"
    needs: FrozenSet[str] = frozenset({DIAGNOSIS})

    def applies(self, gate: Gate) -> bool:
        return gate.diagnosis is not None

    def evaluate(self, gate: Gate, inputs: GateInputs) -> GateResult:
        condition, label = str(gate.diagnosis), inputs.diagnosis
        words = condition.replace("_", " ")
        if label in (None, "undetermined"):
            why = "no learning-curve diagnosis recorded" if label is None else \
                "the learning curves were undetermined"
            return GateResult("diagnosis", words, None, None, False,
                              f"{why}; an unknown diagnosis fails the gate", inputs.stage, label)
        passed = label == "converged" if condition == "converged" else \
            condition in _CONTRADICTS and label not in _CONTRADICTS[condition]
        return GateResult("diagnosis", words, None, None, passed, "", inputs.stage, label)


KIND = DiagnosisGate()
