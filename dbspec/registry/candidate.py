"""The typed candidate of a promotion: a registered version with what its gates read, from a
run (champions re-scored on its own test split) or from the registry
(:func:`recorded_candidate`: what the run recorded, champions' logged figures)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional

from dbspec.registry.client import DECISION_TAG, GATES_TAG, RUN_TAG, Registry
from dbspec.registry.errors import RegistryError
from dbspec.registry.lifecycle import APPROVAL_TAG, STAGES_TAG, load_json, version_stages

if TYPE_CHECKING:
    from dbspec.spec.sections.lifecycle import Gate, PromotionSpec

DIAGNOSIS_TAG = "dbspec.diagnosis"  # the learning-curve label of the version's run
METRIC_PREFIX = "metric."  # version tags metric.<name>: what the run logged

#: ``(holder version, metric) -> its figure`` (None when it has none): how a champion is scored.
Score = Callable[[str, str], Optional[float]]
_REMEDY = "rerun the spec to record them again (dbspec promote --force moves it without gates)"


@dataclass(frozen=True)
class StageRecord:
    """One promotion stage a version is gated through: the alias it moves, its gates as the
    user wrote them, ``approval`` (``required``: a version that passes waits for it) and
    ``four_eyes`` (its approver is not who trained or requested it)."""

    alias: str
    gates: tuple[Gate, ...] = ()
    approval: str = "none"
    four_eyes: bool = False

    @property
    def needs_approval(self) -> bool:
        return self.approval == "required"

    @classmethod
    def from_spec(cls, stage: PromotionSpec) -> StageRecord:
        return cls(stage.alias, tuple(stage.gates), stage.approval, stage.four_eyes)

    def to_json(self) -> dict[str, Any]:
        """As recorded in the ``dbspec.stages`` tag."""
        return {"alias": self.alias, "approval": self.approval,
                "gates": gate_records(self.gates), **({"four_eyes": True} if self.four_eyes
                                                      else {})}


def gate_records(gates: tuple[Gate, ...]) -> list[dict[str, Any]]:
    """Gates as recorded in tags (what the user wrote, defaults left out)."""
    return [g.model_dump(mode="json", exclude_none=True) for g in gates]


def parse_gates(raw: Any, where: str) -> tuple[Gate, ...]:
    """Recorded gates back as spec gates.

    Raises:
        RegistryError: not a list of gates (edited by hand), saying ``where``.
    """
    from pydantic import ValidationError

    from dbspec.spec.sections.lifecycle import Gate

    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise RegistryError(f"{where}: recorded gates are not a list ({str(raw)[:80]}); "
                            f"{_REMEDY}")
    try:
        return tuple(Gate.model_validate(g) for g in raw)
    except ValidationError as exc:
        problem = exc.errors()[0]
        raise RegistryError(f"{where}: a recorded gate is not a gate: {problem['msg']} "
                            f"({json.dumps(problem.get('input'))[:80]}); {_REMEDY}") from None


@dataclass(frozen=True)
class Candidate:
    """A version up for promotion, and everything its gates read.

    Attributes:
        gates: Its recorded gates (``dbspec.gates``, the first stage's); None when none are.
        approvals: Alias -> its approval record (``{state, at, ...}``).
        decision: Its recorded decision (``pending``, ``promoted``...), None when none.
    """

    name: str
    version: str
    metrics: Mapping[str, float]
    score: Score
    diagnosis: Optional[str] = None
    stages: tuple[StageRecord, ...] = ()
    gates: Optional[tuple[Gate, ...]] = None
    approvals: Mapping[str, dict[str, Any]] = field(default_factory=dict)
    decision: Optional[str] = None
    run_id: Optional[str] = None

    def stage(self, alias: str) -> Optional[StageRecord]:
        return next((s for s in self.stages if s.alias == alias), None)

    @property
    def final_alias(self) -> Optional[str]:
        return self.stages[-1].alias if self.stages else None


def recorded_candidate(registry: Registry, name: str, version: str, *,
                       lenient: bool = False) -> Candidate:
    """``name`` v``version`` as the registry records it; champions scored by their logged
    figures.

    Args:
        lenient: Unreadable recorded gates count as none (``promote --force`` checks none).

    Raises:
        RegistryError: no such model or version, or (unless ``lenient``) unreadable gates.
    """
    tags = dict(registry.version(name, version).tags or {})
    where = f"{name} v{version}"
    try:
        stages = tuple(_stage(raw, where) for raw in version_stages(tags))
        gates = parse_gates(load_json(tags[GATES_TAG], []), f"{where} {GATES_TAG}") \
            if GATES_TAG in tags else None
    except RegistryError:
        if not lenient:
            raise
        stages = tuple(StageRecord(str(s["alias"]), (), str(s.get("approval") or "none"),
                                   s.get("four_eyes") is True) for s in version_stages(tags))
        gates = ()
    prefix = APPROVAL_TAG.format(alias="")
    approvals = {key[len(prefix):]: record for key in sorted(tags) if key.startswith(prefix)
                 and isinstance(record := load_json(tags[key]), dict)}
    return Candidate(name, str(version), recorded_metrics(tags), logged_score(registry, name),
                     diagnosis=tags.get(DIAGNOSIS_TAG), stages=stages, gates=gates,
                     approvals=approvals, decision=tags.get(DECISION_TAG),
                     run_id=tags.get(RUN_TAG))


def _stage(raw: dict[str, Any], where: str) -> StageRecord:
    gates = parse_gates(raw.get("gates", []), f"{where} {STAGES_TAG} @{raw['alias']}")
    return StageRecord(str(raw["alias"]), gates, str(raw.get("approval") or "none"),
                       raw.get("four_eyes") is True)


def recorded_metrics(tags: Mapping[str, str]) -> dict[str, float]:
    """The ``metric.<name>`` tags of a version as figures (unreadable ones left out)."""
    found = {}
    for key, value in tags.items():
        if key.startswith(METRIC_PREFIX):
            try:
                found[key[len(METRIC_PREFIX):]] = float(value)
            except ValueError:
                continue  # edited by hand: a gate on it fails as "missing"
    return found


def logged_score(registry: Registry, name: str) -> Score:
    """Champions scored by the figures logged with them (the commands have no data split)."""
    def score(holder: str, metric: str) -> Optional[float]:
        return recorded_metrics(registry.version(name, holder).tags or {}).get(metric)

    return score


def promotion_tags(stages: list[StageRecord], *, staged: bool) -> dict[str, str]:
    """Version tags of a promotion: its (first stage's) gates, and the stages where there are
    several or one needs approval."""
    if not stages:
        return {}
    tags = {GATES_TAG: json.dumps(gate_records(stages[0].gates))}
    if staged or any(s.needs_approval for s in stages):
        tags[STAGES_TAG] = json.dumps([s.to_json() for s in stages])
    return tags
