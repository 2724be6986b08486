"""The promotion service: typed candidates in, typed gate results and decisions out.

Every way an alias moves goes through here: the run's promote stage (:func:`promote_stages`,
also the Databricks job's ``promote`` task), ``dbspec promote``, ``approve`` and ``rollback``
(also ``dbspec monitor --on-alert rollback``). Gates are evaluated by :mod:`.gating`; each
decision is taken under the registry lock, on the holder seen there
(:meth:`Registry.guarded_move`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any, Optional

from dbspec.registry.access import Identity, acting_identity, require_deployer
from dbspec.registry.candidate import (Candidate, StageRecord, promotion_tags,
                                       recorded_candidate)
from dbspec.registry.client import DECIDED, AliasDecision, Registry
from dbspec.registry.errors import RegistryError, first_line, unavailable
from dbspec.registry.gating import (AWAITING_APPROVAL, DEFERRED, PROMOTED, REJECTED, ROLLED_BACK,
                                    UNCHANGED, Decision, GatesFailed, alias_argument,
                                    check_stage)
from dbspec.registry.history import RegistrySnapshot
from dbspec.registry.lifecycle import (MODEL_STAGES_TAG, PENDING_APPROVAL, StageKey,
                                       model_stages, record_approval,
                                       record_final_move, request_approval)
from dbspec.seams.gates import GateResult

_REASON = "rollback"
__all__ = ["Decision", "GatesFailed", "StagedPromotion", "alias_argument", "approve",
           "promote", "promote_stages", "rollback"]


def _final_alias(seen: RegistrySnapshot, candidate: Candidate) -> Optional[str]:
    """The last stage's alias, as the model or else the version records it."""
    stages = model_stages(seen)
    return stages[-1] if stages else candidate.final_alias


def promote(registry: Registry, name: str, version: str, alias: str, *,
            force: bool = False) -> Decision:
    """Point ``alias`` at ``version`` after re-checking its recorded gates for ``alias`` (the
    stage's, else the version's) on the metrics logged for each version. An undecided version
    is gated here and decided; without gates or metrics it needs ``force``, as does a stage that
    requires approval (else :func:`approve`). The version leaving the last stage's alias is
    archived.

    Raises:
        GatesFailed: a gate fails (nothing moved).
        RegistryError: unknown model or version, a stage that needs approval, or nothing to
            re-check with, without ``force``.
    """
    alias_argument(alias)
    candidate = recorded_candidate(registry, name, str(version), lenient=force)
    stage = _promotable(candidate, alias, force)
    gates = stage.gates if stage is not None else (candidate.gates or ())
    if alias == _final_alias(registry.snapshot(name), candidate):  # deploying: admins only
        require_deployer(registry.client.tracking_uri, name,
                         f"promote {name} v{candidate.version} to @{alias}, the last "
                         "promotion stage")
    final: list[Optional[str]] = []

    def decide(seen: RegistrySnapshot) -> AliasDecision:
        final[:] = [_final_alias(seen, candidate)]
        results = [] if force else check_stage(candidate, seen, gates, moving=alias,
                                               label=alias if stage is not None else "")
        move = all(r.passed for r in results)
        return AliasDecision(candidate.version if move else None, "promoted by hand"
                             + (" with --force" if force else ""), detail=results)

    outcome = registry.guarded_move(name, alias, decide)
    decision = _decided(candidate, alias, outcome, forced=force)
    if candidate.decision not in DECIDED:
        registry.record_gates(name, candidate.version, list(decision.results),
                              REJECTED if not decision.passed else "forced" if force
                              else PROMOTED)
    if not decision.passed:
        raise GatesFailed(f"{name} v{candidate.version} fails its gates: {decision.failures} "
                          "(use --force to promote anyway)", decision)
    return replace(decision, warning=record_final_move(registry.client, name, alias, outcome,
                                                       final=final[0] if final else None))


def _promotable(candidate: Candidate, alias: str, force: bool) -> Optional[StageRecord]:
    """The candidate's stage for ``alias`` (None: none recorded), if ``promote`` may move it
    (RegistryError: nothing to re-check an undecided version with, or approval required)."""
    name, version = candidate.name, candidate.version
    if candidate.decision not in DECIDED and not force and (
            candidate.gates is None or not candidate.metrics):
        missing = "gates" if candidate.gates is None else "metrics"
        raise RegistryError(f"{name} v{version} has no gate decision "
                            f"({candidate.decision or 'none'}) and no {missing} recorded to "
                            "re-run its gates: check it, then use --force to promote it anyway")
    stage = candidate.stage(alias)
    if stage is not None and stage.needs_approval and not force:
        raise RegistryError(f"@{alias} of {name} requires approval: dbspec approve {name} "
                            f"{version} --alias {alias} (or --force to move it without one)")
    return stage


def _decided(candidate: Candidate, alias: str, outcome: Any, *, forced: bool = False,
             by: Optional[str] = None) -> Decision:
    """The :class:`Decision` of a guarded move whose ``detail`` holds the gate results."""
    results = tuple(outcome.decision.detail or ())
    passed = all(r.passed for r in results)
    return Decision(candidate.name, alias, candidate.version, PROMOTED if passed else REJECTED,
                    results, moved=outcome.moved,
                    previous=outcome.previous if outcome.moved else None, by=by, forced=forced)


def approve(registry: Registry, name: str, version: str, alias: str) -> Decision:
    """Approve ``version`` for the stage ``alias``: its gates are re-checked on recorded
    metrics under the lock, the alias moves, who and when are recorded, and the version leaving
    the last stage's alias is archived.

    Raises:
        GatesFailed: a gate fails (nothing moved).
        RegistryError: ``alias`` is no stage of the version that needs approval, or the
            version neither awaits approval nor holds the stage before.
    """
    alias_argument(alias)
    candidate = recorded_candidate(registry, name, str(version))
    stage, before = _approvable(candidate, alias)
    require_deployer(registry.client.tracking_uri, name,
                     f"approve {name} v{candidate.version} for @{alias}")
    identity = acting_identity(registry.client.tracking_uri)
    if stage.four_eyes:
        _check_four_eyes(registry, candidate, (alias, before), identity)
    who = str(identity)

    def decide(seen: RegistrySnapshot) -> AliasDecision:
        _check_waiting(candidate, seen, alias, before)
        results = check_stage(candidate, seen, stage.gates, moving=alias, label=alias)
        move = all(r.passed for r in results)
        return AliasDecision(candidate.version if move else None, f"approved by {who}",
                             detail=results, by=identity.name)

    outcome = registry.guarded_move(name, alias, decide)
    decision = _decided(candidate, alias, outcome, by=who)
    if not decision.passed:
        raise GatesFailed(f"{name} v{candidate.version} fails its gates for @{alias}: "
                          f"{decision.failures}; nothing moved", decision)
    from mlflow.exceptions import MlflowException

    warning = None
    try:
        record_approval(registry.client, StageKey(name, candidate.version, alias),
                        decision.gates, identity.record(), candidate.approvals.get(alias))
    except MlflowException as exc:  # the move stands: its history entry names the approver
        warning = (f"@{alias} moved to v{candidate.version}, but the approval record could not "
                   "be written: "
                   f"{unavailable(exc, f'the approval of {name} v{candidate.version}')}")
    warning = record_final_move(registry.client, name, alias, outcome,
                                final=candidate.final_alias) or warning
    return replace(decision, warning=warning)


def _approvable(candidate: Candidate, alias: str) -> tuple[StageRecord, Optional[str]]:
    """The candidate's stage for ``alias`` and the alias of the stage before it
    (RegistryError: no such stage, or one that needs no approval)."""
    name, version = candidate.name, candidate.version
    names = [s.alias for s in candidate.stages]
    if alias not in names:
        known = f"its stages: {', '.join('@' + a for a in names)}" if names else \
            "its spec has no promotion stages"
        raise RegistryError(f"@{alias} is not a promotion stage of {name} v{version} ({known})")
    index = names.index(alias)
    if not candidate.stages[index].needs_approval:
        raise RegistryError(f"@{alias} of {name} needs no approval: a run moves it when its "
                            f"gates pass; use dbspec promote {name} {version} --alias {alias}")
    return candidate.stages[index], names[index - 1] if index > 0 else None


def _check_four_eyes(registry: Registry, candidate: Candidate,
                     stages: tuple[str, Optional[str]], identity: Identity) -> None:
    """Refuse (RegistryError) an approver who trained the version (its run's ``mlflow.user``)
    or requested the approval (the request's ``by``; without a request, who moved it to the
    stage before, ``stages[1]``); fail closed when the trainer is unknown."""
    from mlflow.exceptions import MlflowException

    name, version = candidate.name, candidate.version
    alias, before = stages
    request = candidate.approvals.get(alias) or {}
    requester = request.get("by")
    if requester is None and before is not None:
        moves = [m for m in registry.snapshot(name).history(before) if m.get("version") == version]
        requester = moves[-1].get("by") if moves else None
    run_id = candidate.run_id or request.get("run_id")
    rule = f"@{alias} of {name} requires four eyes (promotion four_eyes: true)"
    try:
        trainer = registry.client.get_run(run_id).data.tags.get("mlflow.user") if run_id \
            else None
    except MlflowException as exc:
        raise RegistryError(f"{rule}, but who trained v{version} cannot be read (run "
                            f"{run_id}: {first_line(exc)}); nothing moved") from None
    if not trainer:
        raise RegistryError(f"{rule}, but v{version} records no run user to tell its trainer "
                            "by; nothing moved")
    roles = [("trained", trainer), ("requested the approval of", requester)]
    for did, who in roles:
        if isinstance(who, str) and who.casefold() == identity.name.casefold():
            raise RegistryError(f"{rule}: {identity} {did} v{version}; someone else approves "
                                "it; nothing moved")


def _check_waiting(candidate: Candidate, seen: RegistrySnapshot, alias: str,
                   before: Optional[str]) -> None:
    """Refuse an approval the registry, as seen under the lock, does not wait for."""
    name, version = candidate.name, candidate.version
    if seen.holder(alias) == version:
        raise RegistryError(f"{name} v{version} already holds @{alias}")
    waiting = (candidate.approvals.get(alias) or {}).get("state") == PENDING_APPROVAL
    now_before = seen.holder(before) if before is not None else None
    if waiting and now_before not in (None, version):
        raise RegistryError(
            f"{name} v{version}'s request for @{alias} is superseded: v{now_before} holds "
            f"@{before} now; approve the version that holds it, or move this one back "
            f"there first (dbspec promote {name} {version} --alias {before})")
    if not waiting and (before is None or now_before != version):
        after = f" and does not hold @{before}, the stage before" if before else ""
        raise RegistryError(f"{name} v{version} is not awaiting approval for @{alias} (no "
                            f"pending request{after}); a run of its spec whose gates pass "
                            "asks for one" + (f", as does dbspec promote {name} {version} "
                                              f"--alias {before}" if before else ""))


@dataclass(frozen=True)
class StagedPromotion:
    """A run's walk through its promotion stages: one decision per stage entered, in order."""

    decisions: tuple[Decision, ...]
    #: The id of the deployment job the promotion was left to (outcome ``deferred``).
    deployment_job: Optional[str] = None

    @property
    def results(self) -> tuple[GateResult, ...]:
        return tuple(r for d in self.decisions for r in d.results)

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results)

    @property
    def outcome(self) -> str:
        """``rejected``, else the last stage's outcome (``promoted``, ``awaiting_approval``,
        ``deferred``)."""
        return REJECTED if not self.passed else self.decisions[-1].outcome


def promote_stages(registry: Registry, candidate: Candidate, *,
                   staged: bool) -> StagedPromotion:
    """A run's promotion: walk ``candidate.stages`` in order, checking each stage's gates as
    the version enters it; a stage that passes moves its alias, one with approval records the
    version as awaiting it and stops, a failing one stops. Results and decision are recorded.
    A model linked to an MLflow deployment job (``dbspec link-job``; Unity Catalog keeps the
    link) is left to that job, which MLflow runs on each new version: nothing moves here.

    Args:
        staged: Whether the spec lists stages (each result then names its stage).

    Raises:
        RegistryUnavailable: the registry did not answer (nothing is decided on it).
    """
    from mlflow.exceptions import MlflowException

    name, version = candidate.name, candidate.version
    try:  # the version's gates and stages, the model's stage aliases in order
        for key, value in promotion_tags(list(candidate.stages), staged=staged).items():
            registry.client.set_model_version_tag(name, version, key, value)
        registry.client.set_registered_model_tag(
            name, MODEL_STAGES_TAG, json.dumps([s.alias for s in candidate.stages]))
        # MLflow runs a linked model's deployment job on the new version: it decides there, one
        # version at a time; recorded as no longer pending (a later run would abandon it)
        job = registry.client.get_registered_model(name).deployment_job_id
        if job:
            registry.record_gates(name, version, [], DEFERRED)
    except MlflowException as exc:
        raise unavailable(exc, f"the promotion records of {name} v{version}") from None
    if job:
        final = candidate.stages[-1].alias
        return StagedPromotion((Decision(name, final, version, DEFERRED),), deployment_job=job)
    decisions: list[Decision] = []
    for index, stage in enumerate(candidate.stages):
        decision = _enter(registry, candidate, stage, last=index == len(candidate.stages) - 1,
                          label=stage.alias if staged else "")
        decisions.append(decision)
        if decision.outcome != PROMOTED:
            break
    walked = StagedPromotion(tuple(decisions))
    registry.record_gates(name, version, list(walked.results),
                          PROMOTED if walked.passed else REJECTED)
    return walked


def _enter(registry: Registry, candidate: Candidate, stage: StageRecord, *, last: bool,
           label: str) -> Decision:
    """Check ``stage``'s gates; move its alias, or ask for approval."""
    def decide(seen: RegistrySnapshot) -> AliasDecision:
        results = check_stage(candidate, seen, stage.gates, moving=stage.alias, label=label)
        move = all(r.passed for r in results) and not stage.needs_approval
        return AliasDecision(candidate.version if move else None,
                             f"gates passed in run {candidate.run_id}", detail=results)

    seen = registry.snapshot(candidate.name)
    first = decide(seen)  # scores the champion before taking the lock (slow; the score caches)
    if stage.needs_approval:
        return _ask_approval(registry, candidate, stage, seen, tuple(first.detail))
    outcome = registry.guarded_move(candidate.name, stage.alias, decide)
    decision = _decided(candidate, stage.alias, outcome)
    return replace(decision, warning=record_final_move(registry.client, candidate.name,
                                                       stage.alias, outcome,
                                                       final=stage.alias if last else None))


def _ask_approval(registry: Registry, candidate: Candidate, stage: StageRecord,
                  seen: RegistrySnapshot, results: tuple[GateResult, ...]) -> Decision:
    """A stage with approval: a version that passes is recorded as awaiting it."""
    passed = all(r.passed for r in results)
    held = seen.holder(stage.alias) == candidate.version
    if passed and not held:
        request_approval(registry.client, StageKey(candidate.name, candidate.version,
                                                   stage.alias),
                         [r.describe() for r in results], candidate.run_id,
                         acting_identity(registry.client.tracking_uri).record())
    outcome = REJECTED if not passed else PROMOTED if held else AWAITING_APPROVAL
    return Decision(candidate.name, stage.alias, candidate.version, outcome, results)


def rollback(registry: Registry, name: str, alias: str, to: Optional[str] = None, *,
             expected: Optional[str] = None) -> Decision:
    """Point ``alias`` back at ``to``, by default the version that held it before.

    "Before" comes from the moves that happened, read under the registry lock, rollbacks
    skipped (repeated rollbacks step further back); a move or deletion outside dbspec counts
    as a move. On the last stage's alias, the version left is archived, the one reached
    restored.

    Args:
        expected: Roll back only while this version holds the alias, else nothing moves
            (``unchanged``): ``dbspec monitor`` never rolls back a version promoted since.

    Raises:
        RegistryError: no earlier holder, ``to`` is no version or the holder already, or, on
            the last stage's alias, never held it (a new version goes through promote).
    """
    if to is not None:
        registry.version(name, str(to))
    final: list[Optional[str]] = []

    def decide(seen: RegistrySnapshot) -> AliasDecision:
        stages = model_stages(seen)
        final[:] = [stages[-1] if stages else None]
        current = seen.holder(alias)
        if expected is not None and current != str(expected):
            return AliasDecision(None, _REASON)
        target = str(to) if to is not None else seen.replaced(alias, current)
        _check_target(seen, name, alias, target, last=bool(stages) and stages[-1] == alias
                      and to is not None)
        return AliasDecision(target, _REASON)

    outcome = registry.guarded_move(name, alias, decide)
    if expected is not None and not outcome.moved:
        return Decision(name, alias, None, UNCHANGED, previous=outcome.previous)
    version = outcome.decision.version
    warning = record_final_move(registry.client, name, alias, outcome,
                                final=final[0] if final else None)
    return Decision(name, alias, None if version is None else str(version), ROLLED_BACK,
                    moved=outcome.moved, previous=outcome.previous, warning=warning)


def _check_target(seen: RegistrySnapshot, name: str, alias: str, target: Optional[str], *,
                  last: bool) -> None:
    """Refuse a rollback to nothing, to the holder, or (``last``) to a version that never held
    the alias."""
    current = seen.holder(alias)
    if last and not _held(seen, alias, str(target)):
        raise RegistryError(f"v{target} of {name} never held @{alias}: a rollback returns "
                            "to a version that was deployed; a new one goes through "
                            "dbspec promote / approve")
    if target is None:
        moves = seen.history(alias)
        if moves and moves[-1].get("outside") and current is not None:
            raise RegistryError(f"@{alias} of {name} was set to v{current} outside dbspec "
                                "and no earlier holder is recorded; give --to VERSION")
        raise RegistryError(f"@{alias} of {name} has no earlier holder recorded; give "
                            "--to VERSION")
    if target == current:
        raise RegistryError(f"@{alias} of {name} already points at v{target}: nothing to "
                            "roll back; give --to VERSION for another version")


def _held(seen: RegistrySnapshot, alias: str, version: str) -> bool:
    return any(version in (move.get("version"), move.get("previous"))
               for move in seen.history(alias))
