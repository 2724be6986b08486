"""``dbspec models``, ``promote``, ``approve`` and ``rollback``: the registry from the command
line."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Optional

from dbspec.registry import (DECIDED, DECISION_TAG, GATES_TAG, AliasDecision, GateResult,
                             Registry, RegistryError, RegistrySnapshot, check_gates)
from dbspec.registry.access import registry_uri, require_deployer
from dbspec.registry.gates import DIAGNOSIS_TAG, Champion
from dbspec.registry.lifecycle import (PENDING_APPROVAL, acting_user, approval_of,
                                       lifecycle_state, load_json, model_stages,
                                       record_approval, record_final_move, version_history,
                                       version_stages)


def open_registry(tracking_uri: Optional[str], state_dir: Path) -> Registry:
    """A registry on ``tracking_uri``, else ``MLFLOW_TRACKING_URI``, else the local default."""
    import mlflow

    from dbspec.tracking.mlflow_tracking import check_tracking_server, quiet_mlflow

    quiet_mlflow()
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:
        database = state_dir / "mlflow.db"
        if not database.exists():
            raise RegistryError(f"no tracking store at {database}: run a spec first, or give "
                                "--tracking-uri / MLFLOW_TRACKING_URI")
        uri = f"sqlite:///{database.resolve()}"
    check_tracking_server(uri, must_exist=True)  # a reader needs the runs to be there
    mlflow.set_tracking_uri(uri)
    return Registry(mlflow.MlflowClient())


def describe_models(registry: Registry, name: str) -> dict[str, Any]:
    """Versions (newest first) with aliases, decision, lifecycle state and history, gate
    results and test metrics; the promotion stages; each alias's history."""
    seen = registry.snapshot(name)
    stages = model_stages(seen)
    aliases: dict[str, list[str]] = {}
    for alias, version in seen.aliases.items():
        aliases.setdefault(str(version), []).append(alias)
    versions = []
    for version in registry.versions(name):
        tags, number = version.tags or {}, str(version.version)
        gates = [json.loads(tags[k]) for k in sorted(tags) if k.startswith("dbspec.gate.")]
        versions.append({
            "version": number, "aliases": sorted(aliases.get(number, [])),
            "run_id": version.run_id, "created": version.creation_timestamp,
            "decision": tags.get("dbspec.decision"),
            "lifecycle": lifecycle_state(number, tags, seen, stages),
            "diagnosis": tags.get(DIAGNOSIS_TAG),
            "gates": [GateResult(**g).describe() for g in gates],
            "metrics": {k[7:]: float(v) for k, v in tags.items() if k.startswith("metric.")},
            "history": version_history(number, tags, seen),
        })
    # an alias deleted outside dbspec keeps its history, ending on the deletion
    history = {alias: moves for alias in seen.history_aliases()
               if (moves := seen.history(alias)) or alias in seen.aliases}
    return {"name": name, "stages": stages, "versions": versions, "alias_history": history}


def render_models(described: dict[str, Any]) -> str:
    """A text listing of :func:`describe_models`."""
    lines = [f"{described['name']}: {len(described['versions'])} version(s)"]
    if described.get("stages"):
        lines[0] += f"; stages {' -> '.join('@' + a for a in described['stages'])}"
    for version in described["versions"]:
        aliases = " ".join(f"@{a}" for a in version["aliases"])
        tests = ", ".join(f"{k}={v:.4g}" for k, v in sorted(version["metrics"].items())
                          if k.startswith("test_"))
        state = _state_text(version["lifecycle"])
        lines.append(f"  v{version['version']:<4} {state:<12} {aliases:<20} "
                     f"{version['decision'] or '-':<9} {tests}")
        if version["lifecycle"]["awaiting"]:
            lines.append("        awaits approval for "
                         + ", ".join(f"@{a}" for a in version["lifecycle"]["awaiting"])
                         + f": dbspec approve {described['name']} {version['version']} "
                         f"--alias {version['lifecycle']['awaiting'][-1]}")
        lines.extend(f"        gate {g}" for g in version["gates"])
        lines.extend(f"        {_describe_event(e)}" for e in version.get("history", [])[-6:])
    for alias, moves in described["alias_history"].items():
        trail = " -> ".join(_describe_move(m) for m in moves[-5:])
        lines.append(f"  history @{alias}: {trail}")
        last = moves[-1] if moves else {}
        if last.get("recorded") is False:
            lines.append(f"        @{alias} was {last['reason']} ({_shown(last['previous'])} -> "
                         f"{_shown(last['version'])}), first seen now; the next promote or "
                         "rollback of it records that")
    return "\n".join(lines)


def _state_text(lifecycle: dict[str, Any]) -> str:
    """``Production``, ``Staging/staging``, ``Archived``, ``Development``."""
    where = lifecycle["stages"] or lifecycle["awaiting"]
    if lifecycle["state"] == "Staging" and where:
        return f"Staging/{where[-1]}"
    return lifecycle["state"]


def _describe_event(event: dict[str, Any]) -> str:
    """``2026-01-02T00:00:00Z approved for @production by alice``."""
    by = f" by {event['by']}" if event.get("by") else ""
    reason = f" ({event['reason']})" if event.get("reason") else ""
    return f"{event.get('at') or '?'} {event['event']}{by}{reason}"


def _describe_move(move: dict[str, Any]) -> str:
    """``v2 (2026-01-02T00:00:00Z, promoted by hand)``; a move dbspec only saw says so first."""
    if move.get("outside"):
        return f"{_shown(move['version'])} ({move['reason'].upper()}, seen {move['at']})"
    return f"{_shown(move['version'])} ({move['at']}, {move['reason']})"


def _shown(version: Optional[str]) -> str:
    return "unset" if version is None else f"v{version}"


def alias_argument(alias: str) -> str:
    """``alias`` unless MLflow reserves the name (``latest``, ``v<number>``).

    Raises:
        RegistryError: a reserved name.
    """
    from dbspec.spec.sections.lifecycle import check_alias

    try:
        return check_alias(alias)
    except ValueError as exc:
        raise RegistryError(f"--alias {exc}") from None


def promote(registry: Registry, name: str, version: str, alias: str, *, force: bool) -> dict:
    """Point ``alias`` at ``version``; the version's gates for ``alias`` are re-checked first.

    The gates are those of the promotion stage ``alias`` (recorded with the version), else the
    version's recorded gates. The re-check compares the metrics logged for each version (the
    champion's own test metrics), since the command has no data split of its own. It runs
    under the registry lock, against the holder seen there (see
    :meth:`Registry.guarded_move`). A version without a decision (its run died before gating
    it) is gated here, from the gates and metrics its register recorded, and the decision
    recorded; without those it needs ``force``. A stage that requires approval is entered with
    ``dbspec approve`` (or ``force``). The version leaving the last stage's alias is archived.

    Raises:
        RegistryError: unknown model or version, a gate fails, a stage that needs approval, or
            nothing to re-check with, without ``force``.
    """
    alias_argument(alias)
    version = str(version)
    candidate = registry.version(name, version)
    tags = candidate.tags or {}
    decision = tags.get(DECISION_TAG)
    undecided = decision not in DECIDED
    metrics = _recorded_metrics(tags)
    if undecided and not force and (GATES_TAG not in tags or not metrics):
        missing = "gates" if GATES_TAG not in tags else "metrics"
        raise RegistryError(f"{name} v{version} has no gate decision ({decision or 'none'}) and "
                            f"no {missing} recorded to re-run its gates: check it, then use "
                            "--force to promote it anyway")
    stage = next((s for s in version_stages(tags) if s["alias"] == alias), None)
    if stage is not None and stage.get("approval") == "required" and not force:
        raise RegistryError(f"@{alias} of {name} requires approval: dbspec approve {name} "
                            f"{version} --alias {alias} (or --force to move it without one)")
    gates = _gates(stage["gates"] if stage is not None else load_json(tags.get(GATES_TAG), []))
    if alias == _final_alias(registry.snapshot(name), tags):  # deploying: roles.admin only
        require_deployer(registry_uri(registry.client), name,
                         f"promote {name} v{version} to @{alias}, the last promotion stage")
    final: list[Optional[str]] = []

    def decide(seen: RegistrySnapshot) -> AliasDecision:
        final[:] = [_final_alias(seen, tags)]
        results = [] if force else check_gates(
            gates, metrics, _logged_champion(registry, name, seen, version, alias),
            diagnosis=tags.get(DIAGNOSIS_TAG), stage=alias if stage is not None else "")
        if any(not r.passed for r in results):
            return AliasDecision(None, detail=results)
        return AliasDecision(version, "promoted by hand" + (" with --force" if force else ""),
                             detail=results)

    outcome = registry.guarded_move(name, alias, decide)
    results = outcome.decision.detail
    failed = [r for r in results if not r.passed]
    if undecided:
        registry.record_gates(name, version, results,
                              "rejected" if failed else "forced" if force else "promoted")
    if failed:
        raise RegistryError(f"{name} v{version} fails its gates: "
                            + "; ".join(r.describe() for r in failed)
                            + " (use --force to promote anyway)")
    warning = None
    if outcome.moved and final and final[0] == alias:
        warning = record_final_move(registry.client, name, outcome.previous, version, alias,
                                    outcome.decision.reason)
    return {"name": name, "alias": alias, "version": version,
            "previous": outcome.previous if outcome.moved else None,
            "gates": [r.describe() for r in results], "forced": force, "warning": warning}


def approve(registry: Registry, name: str, version: str, alias: str) -> dict:
    """Approve ``version`` for the promotion stage ``alias``: its gates for that stage are
    re-checked on recorded metrics under the registry lock, the alias moves, who and when are
    recorded on the version and in the alias history, and the version leaving the last stage's
    alias is archived.

    Only a version awaiting approval for ``alias`` (its run passed that stage's gates), or one
    that holds the alias of the stage before, can be approved.

    Raises:
        RegistryError: ``alias`` is not a stage of the version that requires approval, the
            version is not awaiting it, or a gate fails (nothing moved).
    """
    from mlflow.exceptions import MlflowException

    from dbspec.registry.errors import unavailable

    alias_argument(alias)
    version = str(version)
    tags = registry.version(name, version).tags or {}
    stages = version_stages(tags)
    names = [s["alias"] for s in stages]
    if alias not in names:
        known = f"its stages: {', '.join('@' + a for a in names)}" if names else \
            "its spec has no promotion stages"
        raise RegistryError(f"@{alias} is not a promotion stage of {name} v{version} ({known})")
    stage = stages[names.index(alias)]
    if stage.get("approval") != "required":
        raise RegistryError(f"@{alias} of {name} needs no approval: a run moves it when its "
                            f"gates pass; use dbspec promote {name} {version} --alias {alias}")
    before = names[names.index(alias) - 1] if names.index(alias) > 0 else None
    requested = approval_of(tags, alias)
    require_deployer(registry_uri(registry.client), name,
                     f"approve {name} v{version} for @{alias}")
    who = acting_user()
    gates = _gates(stage.get("gates", []))
    metrics = _recorded_metrics(tags)

    def decide(seen: RegistrySnapshot) -> AliasDecision:
        if seen.holder(alias) == version:
            raise RegistryError(f"{name} v{version} already holds @{alias}")
        waiting = (requested or {}).get("state") == PENDING_APPROVAL
        now_before = seen.holder(before) if before is not None else None
        if waiting and now_before not in (None, version):
            raise RegistryError(
                f"{name} v{version}'s request for @{alias} is superseded: v{now_before} holds "
                f"@{before} now; approve the version that holds it, or move this one back "
                f"there first (dbspec promote {name} {version} --alias {before})")
        if not waiting and (before is None or seen.holder(before) != version):
            after = f" and does not hold @{before}, the stage before" if before else ""
            raise RegistryError(f"{name} v{version} is not awaiting approval for @{alias} (no "
                                f"pending request{after}); a run of its spec whose gates pass "
                                "asks for one" + (f", as does dbspec promote {name} {version} "
                                                  f"--alias {before}" if before else ""))
        results = check_gates(gates, metrics,
                              _logged_champion(registry, name, seen, version, alias),
                              diagnosis=tags.get(DIAGNOSIS_TAG), stage=alias)
        if any(not r.passed for r in results):
            return AliasDecision(None, detail=results)
        return AliasDecision(version, f"approved by {who}", detail=results, by=who)

    outcome = registry.guarded_move(name, alias, decide)
    results = outcome.decision.detail
    failed = [r for r in results if not r.passed]
    if failed:
        raise RegistryError(f"{name} v{version} fails its gates for @{alias}: "
                            + "; ".join(r.describe() for r in failed) + "; nothing moved")
    described = [r.describe() for r in results]
    warning = None
    try:
        record_approval(registry.client, name, version, alias, described, who, requested)
    except MlflowException as exc:  # moved already: the history entry names the approver
        warning = f"@{alias} moved to v{version}, but the approval record could not be " \
                  f"written: {unavailable(exc, f'the approval of {name} v{version}')}"
    if alias == names[-1]:
        warning = record_final_move(registry.client, name, outcome.previous, version, alias,
                                    f"approved by {who}") or warning
    return {"name": name, "alias": alias, "version": version, "by": who,
            "previous": outcome.previous if outcome.moved else None, "gates": described,
            "warning": warning}


def _recorded_metrics(tags: dict[str, str]) -> dict[str, float]:
    return {k[7:]: float(v) for k, v in tags.items() if k.startswith("metric.")}


def _gates(raw: Any) -> list:
    from dbspec.spec.sections.lifecycle import Gate

    return [Gate.model_validate(g) for g in (raw if isinstance(raw, list) else [])]


def _final_alias(seen: RegistrySnapshot, tags: dict[str, str]) -> Optional[str]:
    """The last promotion stage's alias, as the model or else the version records it."""
    stages = model_stages(seen) or [s["alias"] for s in version_stages(tags)]
    return stages[-1] if stages else None


def _logged_champion(registry: Registry, name: str, seen: RegistrySnapshot, version: str,
                     moving: str):
    """``(alias, metric) -> Champion`` from recorded metrics: the holder ``seen`` shows; for
    the alias being moved, when ``version`` holds it already (a move killed before its
    records), the version it replaced there. A holder elsewhere that is ``version`` itself
    is compared with itself, and said so."""
    def champion(alias: str, metric: str) -> Champion:
        holder, note = seen.holder(alias), ""
        if holder == version:
            if alias == moving:
                holder = seen.replaced(alias, version)
                if holder is None:
                    return Champion(None, note=f"v{version} holds @{alias} already and "
                                               "replaced no version there")
                note = f"the version v{version} replaced"
            else:
                note = f"v{version} itself"
        if holder is None:
            return Champion(None)
        value = (registry.version(name, holder).tags or {}).get(f"metric.{metric}")
        return Champion(holder, float(value) if value is not None else None, note)

    return champion


def rollback(registry: Registry, name: str, alias: str, to: Optional[str], *,
             expected: Optional[str] = None) -> dict:
    """Point ``alias`` back at ``to``, by default the version that held it before.

    "Before" comes from the moves that happened (an entry whose move was killed is skipped),
    read under the registry lock; rollbacks are skipped too, so repeated rollbacks step
    further back. A move made outside dbspec counts as a move (recorded here first, see
    :meth:`Registry.guarded_move`): rolling it back returns to the holder before it, and an
    alias deleted outside dbspec is set again on its last holder. On the last promotion
    stage's alias, the version rolled back from is archived and the one returned to restored.

    ``expected``: roll back only while this version holds the alias (checked under the lock);
    otherwise nothing moves and the result's ``moved`` is False (``dbspec monitor`` rolls back
    the version that alerted, never one promoted since).

    Raises:
        RegistryError: the alias has no earlier holder (or was set outside dbspec without
            one), ``to`` is not a version, or the alias already points at it; on the last
            promotion stage's alias, ``to`` never held it (a rollback returns to a version
            that was deployed: a new one goes through promote and approve).
    """
    if to is not None:
        registry.version(name, str(to))
    final: list[Optional[str]] = []

    def decide(seen: RegistrySnapshot) -> AliasDecision:
        stages = model_stages(seen)
        final[:] = [stages[-1] if stages else None]
        current = seen.holder(alias)
        if expected is not None and current != str(expected):
            return AliasDecision(None, "rollback")
        target = str(to) if to is not None else seen.replaced(alias, current)
        if to is not None and stages and stages[-1] == alias and not _held(seen, alias, target):
            raise RegistryError(f"v{target} of {name} never held @{alias}: a rollback returns "
                                "to a version that was deployed; a new one goes through "
                                f"dbspec promote / approve")
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
        return AliasDecision(target, "rollback")

    outcome = registry.guarded_move(name, alias, decide)
    if expected is not None and not outcome.moved:
        return {"name": name, "alias": alias, "version": None, "previous": outcome.previous,
                "moved": False}
    warning = None
    if outcome.moved and final and final[0] == alias:
        warning = record_final_move(registry.client, name, outcome.previous,
                                    str(outcome.decision.version), alias, "rollback")
    return {"name": name, "alias": alias, "version": outcome.decision.version,
            "previous": outcome.previous, "warning": warning}


def _held(seen: RegistrySnapshot, alias: str, version: str) -> bool:
    """Whether ``version`` held ``alias`` at some point of its recorded history."""
    return any(version in (move.get("version"), move.get("previous"))
               for move in seen.history(alias))
