"""The promotion service's gates: inputs gathered once, every gate kind asked, and the typed
decision the service returns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

from dbspec.errors import DbspecError
from dbspec.plugins import KindRegistry
from dbspec.registry.candidate import Candidate
from dbspec.registry.errors import RegistryError
from dbspec.registry.history import RegistrySnapshot
from dbspec.seams.gates import (CHAMPION, DIAGNOSIS, GATES, INPUTS, METRICS, Champion,
                                ChampionLookup, GateInputs, GateKind, GateResult)

PROMOTED, REJECTED, AWAITING_APPROVAL = "promoted", "rejected", "awaiting_approval"
#: A run's promotion left to the model's MLflow deployment job.
DEFERRED = "deferred"
ROLLED_BACK, UNCHANGED = "rolled_back", "unchanged"


@dataclass(frozen=True)
class Decision:
    """What the service decided for one alias.

    Attributes:
        version: The candidate; for a rollback the version returned to (None: nothing done).
        outcome: ``promoted`` (the alias is the version's), ``rejected``, ``awaiting_approval``,
            ``deferred`` (to the model's deployment job), ``rolled_back`` or ``unchanged``.
        results: Every gate's result, in the order of the spec's gates.
        previous: The holder it moved from (None when it did not move, or was unset).
        by: Who approved it; ``forced``: gates skipped (``promote --force``).
        warning: A record that could not be written after the move (the move stands).
    """

    name: str
    alias: str
    version: Optional[str]
    outcome: str
    results: tuple[GateResult, ...] = ()
    moved: bool = False
    previous: Optional[str] = None
    by: Optional[str] = None
    forced: bool = False
    warning: Optional[str] = None

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results)

    @property
    def gates(self) -> list[str]:
        return [r.describe() for r in self.results]

    @property
    def failures(self) -> str:
        return "; ".join(r.describe() for r in self.results if not r.passed)

    def stage_report(self) -> dict[str, Any]:
        """The stage as the run's promote output lists it."""
        return {"alias": self.alias, "moved": self.moved, "previous": self.previous,
                "outcome": self.outcome, "gates": self.gates}


class GatesFailed(RegistryError):
    """A version's gates failed: nothing moved; :attr:`decision` holds the results."""

    def __init__(self, message: str, decision: Decision):
        super().__init__(message)
        self.decision = decision


def alias_argument(alias: str) -> str:
    """``alias``, unless MLflow reserves the name (``latest``, ``v<number>``): RegistryError."""
    from dbspec.spec.sections.lifecycle import check_alias

    try:
        return check_alias(alias)
    except ValueError as exc:
        raise RegistryError(f"--alias {exc}") from None


def applying_kinds(gate: Any, kinds: KindRegistry[GateKind] = GATES) -> list[tuple[str, GateKind]]:
    """The gate kinds that evaluate ``gate``, in the registry's order (built-ins first)."""
    return [(name, kind) for name, kind in kinds.load_all().items() if kind.applies(gate)]


def gate_inputs(candidate: Candidate, seen: RegistrySnapshot, gates: Sequence[Any], *,
                moving: str, stage: str = "",
                kinds: KindRegistry[GateKind] = GATES) -> GateInputs:
    """What the kinds evaluating ``gates`` read about ``candidate`` while ``moving`` is decided
    on ``seen``: the one place gate inputs are gathered (only those the kinds need).

    Raises:
        RegistryError: a kind needs an input the service does not gather.
    """
    needs: set[str] = set()
    for gate in gates:
        for name, kind in applying_kinds(gate, kinds):
            unknown = set(kind.needs) - INPUTS
            if unknown:
                raise RegistryError(
                    f"{kinds.noun} {name!r} ({kinds.origin(name)}) needs "
                    f"{', '.join(sorted(unknown))}, which the promotion service does not "
                    f"gather (it gathers {', '.join(sorted(INPUTS))}); fix that kind")
            needs |= set(kind.needs)
    return GateInputs(
        metrics=dict(candidate.metrics) if METRICS in needs else {},
        diagnosis=candidate.diagnosis if DIAGNOSIS in needs else None,
        champion=_champions(candidate, seen, moving) if CHAMPION in needs else None,
        stage=stage)


def _champions(candidate: Candidate, seen: RegistrySnapshot, moving: str) -> ChampionLookup:
    """``(alias, metric) -> Champion``: the holder ``seen`` shows, scored by the candidate. A
    candidate holding the alias being moved already (a move killed before its records) is
    compared with the version it replaced there; holding another alias, with itself (said)."""
    version = candidate.version

    def champion(alias: str, metric: str) -> Champion:
        holder, note = seen.holder(alias), ""
        if holder == version and alias != moving:
            note = f"v{version} itself"
        elif holder == version:
            holder = seen.replaced(alias, version)
            if holder is None:
                return Champion(None, note=f"v{version} holds @{alias} already and replaced "
                                           "no version there")
            note = f"the version v{version} replaced"
        if holder is None:
            return Champion(None)
        return Champion(holder, candidate.score(holder, metric), note)

    return champion


def evaluate_gates(gates: Sequence[Any], inputs: GateInputs,
                   kinds: KindRegistry[GateKind] = GATES) -> list[GateResult]:
    """Every gate's results: one per kind that evaluates it; a gate no kind evaluates fails.

    Raises:
        RegistryError: a kind raised something other than a dbspec error, or returned no
            :class:`GateResult` (its name and origin said).
    """
    results = []
    for gate in gates:
        applying = applying_kinds(gate, kinds)
        if not applying:
            results.append(GateResult(gate.metric or "gate", "?", None, None, False,
                                      f"no {kinds.noun} evaluates "
                                      f"{gate.model_dump(exclude_none=True)}", inputs.stage))
        for name, kind in applying:
            try:
                result = kind.evaluate(gate, inputs)
            except DbspecError:
                raise
            except Exception as exc:  # a plugin's bug, said with where it comes from
                raise RegistryError(f"{kinds.noun} {name!r} ({kinds.origin(name)}) failed: "
                                    f"{type(exc).__name__}: {exc}") from None
            if not isinstance(result, GateResult):
                raise RegistryError(f"{kinds.noun} {name!r} ({kinds.origin(name)}) returned "
                                    f"{type(result).__name__}, not a GateResult")
            results.append(result)
    return results


def check_stage(candidate: Candidate, seen: RegistrySnapshot, gates: Sequence[Any], *,
                moving: str, label: str = "") -> list[GateResult]:
    """``gates`` on ``candidate`` while ``moving`` is decided on ``seen``; ``label``: the stage
    recorded with each result (empty for a single promotion)."""
    inputs = gate_inputs(candidate, seen, gates, moving=moving, stage=label)
    return evaluate_gates(gates, inputs)
