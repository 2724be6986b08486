"""``dbspec models``, ``promote`` and ``rollback``: the registry from the command line."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Optional

from dbspec.registry import (DECIDED, DECISION_TAG, GATES_TAG, AliasDecision, GateResult,
                             Registry, RegistryError, RegistrySnapshot, check_gates)


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
    """Versions (newest first) with aliases, decision, gate results and test metrics."""
    seen = registry.snapshot(name)
    aliases: dict[str, list[str]] = {}
    for alias, version in seen.aliases.items():
        aliases.setdefault(str(version), []).append(alias)
    versions = []
    for version in registry.versions(name):
        tags = version.tags or {}
        gates = [json.loads(tags[k]) for k in sorted(tags) if k.startswith("dbspec.gate.")]
        versions.append({
            "version": str(version.version), "aliases": sorted(aliases.get(str(version.version),
                                                                            [])),
            "run_id": version.run_id, "created": version.creation_timestamp,
            "decision": tags.get("dbspec.decision"),
            "gates": [GateResult(**g).describe() for g in gates],
            "metrics": {k[7:]: float(v) for k, v in tags.items() if k.startswith("metric.")},
        })
    # an alias deleted outside dbspec keeps its history, ending on the deletion
    history = {alias: moves for alias in seen.history_aliases()
               if (moves := seen.history(alias)) or alias in seen.aliases}
    return {"name": name, "versions": versions, "alias_history": history}


def render_models(described: dict[str, Any]) -> str:
    """A text listing of :func:`describe_models`."""
    lines = [f"{described['name']}: {len(described['versions'])} version(s)"]
    for version in described["versions"]:
        aliases = " ".join(f"@{a}" for a in version["aliases"])
        tests = ", ".join(f"{k}={v:.4g}" for k, v in sorted(version["metrics"].items())
                          if k.startswith("test_"))
        lines.append(f"  v{version['version']:<4} {aliases:<20} {version['decision'] or '-':<9} "
                     f"{tests}")
        lines.extend(f"        gate {g}" for g in version["gates"])
    for alias, moves in described["alias_history"].items():
        trail = " -> ".join(_describe_move(m) for m in moves[-5:])
        lines.append(f"  history @{alias}: {trail}")
        last = moves[-1] if moves else {}
        if last.get("recorded") is False:
            lines.append(f"        @{alias} was {last['reason']} ({_shown(last['previous'])} -> "
                         f"{_shown(last['version'])}), first seen now; the next promote or "
                         "rollback of it records that")
    return "\n".join(lines)


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
    """Point ``alias`` at ``version``; the version's gates are re-checked first.

    The re-check compares the metrics logged for each version (the champion's own test
    metrics), since the command has no data split of its own. It runs under the registry lock,
    against the holder seen there (see :meth:`Registry.guarded_move`). A version without a
    decision (its run died before gating it) is gated here, from the gates and metrics its
    register recorded, and the decision recorded; without those it needs ``force``.

    Raises:
        RegistryError: unknown model or version, a gate fails, or nothing to re-check with,
            without ``force``.
    """
    from dbspec.spec.sections.lifecycle import Gate

    alias_argument(alias)
    version = str(version)
    candidate = registry.version(name, version)
    tags = candidate.tags or {}
    decision = tags.get(DECISION_TAG)
    undecided = decision not in DECIDED
    metrics = {k[7:]: float(v) for k, v in tags.items() if k.startswith("metric.")}
    if undecided and not force and (GATES_TAG not in tags or not metrics):
        missing = "gates" if GATES_TAG not in tags else "metrics"
        raise RegistryError(f"{name} v{version} has no gate decision ({decision or 'none'}) and "
                            f"no {missing} recorded to re-run its gates: check it, then use "
                            "--force to promote it anyway")
    gates = [Gate.model_validate(g) for g in json.loads(tags.get(GATES_TAG, "[]"))]

    def decide(seen: RegistrySnapshot) -> AliasDecision:
        def logged(alias_name: str, metric: str) -> Optional[float]:
            reference = seen.reference(alias_name, version)
            if reference is None:
                return None
            value = (registry.version(name, reference).tags or {}).get(f"metric.{metric}")
            return float(value) if value is not None else None

        results = [] if force else check_gates(gates, metrics, logged)
        failed = [r for r in results if not r.passed]
        if failed:
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
    return {"name": name, "alias": alias, "version": version,
            "previous": outcome.previous if outcome.moved else None,
            "gates": [r.describe() for r in results], "forced": force}


def rollback(registry: Registry, name: str, alias: str, to: Optional[str]) -> dict:
    """Point ``alias`` back at ``to``, by default the version that held it before.

    "Before" comes from the moves that happened (an entry whose move was killed is skipped),
    read under the registry lock; rollbacks are skipped too, so repeated rollbacks step
    further back. A move made outside dbspec counts as a move (recorded here first, see
    :meth:`Registry.guarded_move`): rolling it back returns to the holder before it, and an
    alias deleted outside dbspec is set again on its last holder.

    Raises:
        RegistryError: the alias has no earlier holder (or was set outside dbspec without
            one), ``to`` is not a version, or the alias already points at it.
    """
    if to is not None:
        registry.version(name, str(to))

    def decide(seen: RegistrySnapshot) -> AliasDecision:
        current = seen.holder(alias)
        target = str(to) if to is not None else seen.replaced(alias, current)
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
    return {"name": name, "alias": alias, "version": outcome.decision.version,
            "previous": outcome.previous}
