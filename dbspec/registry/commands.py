"""``dbspec models``, ``promote`` and ``rollback``: the registry from the command line."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Optional

from dbspec.registry import GateResult, Registry, RegistryError, check_gates


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
    check_tracking_server(uri)
    mlflow.set_tracking_uri(uri)
    return Registry(mlflow.MlflowClient())


def describe_models(registry: Registry, name: str) -> dict[str, Any]:
    """Versions (newest first) with aliases, decision, gate results and test metrics."""
    model = registry._model(name)
    aliases: dict[str, list[str]] = {}
    for alias, version in (model.aliases or {}).items():
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
    history = {alias: registry.history(name, alias) for alias in model.aliases or {}}
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
        trail = " -> ".join(f"v{m['version']} ({m['at']}, {m['reason']})" for m in moves[-5:])
        lines.append(f"  history @{alias}: {trail}")
    return "\n".join(lines)


def alias_argument(alias: str) -> str:
    """``alias`` unless MLflow reserves the name (``latest``, ``v<number>``).

    Raises:
        RegistryError: a reserved name.
    """
    from dbspec.spec.models.lifecycle import check_alias

    try:
        return check_alias(alias)
    except ValueError as exc:
        raise RegistryError(f"--alias {exc}") from None


def promote(registry: Registry, name: str, version: str, alias: str, *, force: bool) -> dict:
    """Point ``alias`` at ``version``; the gates recorded at registration are re-checked.

    The re-check compares the metrics logged for each version (the champion's own test
    metrics), since the command has no data split of its own.

    Raises:
        RegistryError: unknown model or version, or a gate fails without ``force``.
    """
    from dbspec.spec.models.lifecycle import Gate

    alias_argument(alias)
    candidate = registry.version(name, version)
    tags = candidate.tags or {}
    gates = [Gate.model_validate(g) for g in json.loads(tags.get("dbspec.gates", "[]"))]
    metrics = {k[7:]: float(v) for k, v in tags.items() if k.startswith("metric.")}

    def logged(alias_name: str, metric: str) -> Optional[float]:
        holder = registry.holder(name, alias_name)
        if holder is None or str(holder.version) == str(version):
            return None
        value = (holder.tags or {}).get(f"metric.{metric}")
        return float(value) if value is not None else None

    results = [] if force else check_gates(gates, metrics, logged)
    failed = [r for r in results if not r.passed]
    if failed:
        raise RegistryError(f"{name} v{version} fails its gates: "
                            + "; ".join(r.describe() for r in failed)
                            + " (use --force to promote anyway)")
    reason = "promoted by hand" + (" with --force" if force else "")
    previous = registry.move_alias(name, alias, str(version), reason=reason)
    return {"name": name, "alias": alias, "version": str(version), "previous": previous,
            "gates": [r.describe() for r in results], "forced": force}


def _earlier_holder(history: list[dict], current) -> Optional[str]:
    """The version the alias held before the current holder was first promoted to it.

    Rollback moves are skipped, so repeated rollbacks step further back instead of flipping
    between the last two versions.
    """
    if current is None:
        return None
    version = str(current.version)
    for move in reversed(history):
        if move["version"] == version and move["reason"] != "rollback":
            return move.get("previous")
    return None


def rollback(registry: Registry, name: str, alias: str, to: Optional[str]) -> dict:
    """Point ``alias`` back at ``to``, by default the version that held it before.

    Raises:
        RegistryError: the alias has no earlier holder, or ``to`` is not a version.
    """
    current = registry.holder(name, alias)
    if to is None:
        to = _earlier_holder(registry.history(name, alias), current)
        if to is None:
            raise RegistryError(f"@{alias} of {name} has no earlier holder recorded; give "
                                "--to VERSION")
    registry.version(name, str(to))
    previous = registry.move_alias(name, alias, str(to), reason="rollback")
    return {"name": name, "alias": alias, "version": str(to), "previous": previous}
