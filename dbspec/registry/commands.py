"""``dbspec models``: the registry from the command line."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Optional

from dbspec.registry.candidate import DIAGNOSIS_TAG, recorded_metrics
from dbspec.registry.client import DECISION_TAG, Registry
from dbspec.registry.errors import RegistryError
from dbspec.registry.lifecycle import lifecycle_state, model_stages, version_history
from dbspec.registry.promotion import rollback as rollback_alias
from dbspec.seams.gates import GateResult


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
    """Versions (newest first) with aliases, decision, lifecycle, gates, metrics and history;
    the promotion stages; each alias's history."""
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
            "decision": tags.get(DECISION_TAG),
            "lifecycle": lifecycle_state(number, tags, seen, stages),
            "diagnosis": tags.get(DIAGNOSIS_TAG),
            "gates": [GateResult(**g).describe() for g in gates],
            "metrics": recorded_metrics(tags),
            "history": version_history(number, tags, seen),
        })
    # an alias deleted outside dbspec keeps its history, ending on the deletion
    history = {alias: moves for alias in seen.history_aliases()
               if (moves := seen.history(alias)) or alias in seen.aliases}
    return {"name": name, "stages": stages, "versions": versions, "alias_history": history}


def render_models(described: dict[str, Any]) -> str:
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
    where = lifecycle["stages"] or lifecycle["awaiting"]
    if lifecycle["state"] == "Staging" and where:
        return f"Staging/{where[-1]}"
    return lifecycle["state"]


def _describe_event(event: dict[str, Any]) -> str:
    by = f" by {event['by']}" if event.get("by") else ""
    reason = f" ({event['reason']})" if event.get("reason") else ""
    return f"{event.get('at') or '?'} {event['event']}{by}{reason}"


def _describe_move(move: dict[str, Any]) -> str:
    if move.get("outside"):
        return f"{_shown(move['version'])} ({move['reason'].upper()}, seen {move['at']})"
    return f"{_shown(move['version'])} ({move['at']}, {move['reason']})"


def _shown(version: Optional[str]) -> str:
    return "unset" if version is None else f"v{version}"


def rollback(registry: Registry, name: str, alias: str, to: Optional[str], *,
             expected: Optional[str] = None) -> dict[str, Any]:
    """:func:`dbspec.registry.promotion.rollback` as the dict ``dbspec monitor`` reads."""
    decision = rollback_alias(registry, name, alias, to, expected=expected)
    return {"name": name, "alias": alias, "version": decision.version,
            "previous": decision.previous, "moved": decision.moved,
            "warning": decision.warning}


def link_deployment_job(registry: Registry, name: str, job_id: str) -> None:
    """Set ``name``'s ``deployment_job_id`` (MLflow 3), creating the registered model when it
    does not exist yet, so that MLflow runs the deployment job on each new version.

    Raises:
        RegistryError: the registry refused or did not answer.
    """
    from mlflow.exceptions import MlflowException

    from dbspec.registry.errors import is_not_found, unavailable

    client = registry.client
    try:
        try:
            client.update_registered_model(name, deployment_job_id=job_id)
        except MlflowException as exc:
            if not is_not_found(exc):
                raise
            client.create_registered_model(name, deployment_job_id=job_id)
    except MlflowException as exc:
        raise unavailable(exc, f"registered model {name}") from None
