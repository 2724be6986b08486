"""MLflow model registry: versions, promotion gates, aliases and their history."""

from __future__ import annotations

import getpass
import json
import re
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Optional

from dbspec.errors import DbspecError
from dbspec.spec.models.lifecycle import Gate
from dbspec.spec.semantics import lower_is_better

HISTORY_TAG = "dbspec.alias_history.{alias}"
_HISTORY_LIMIT = 50
_MODEL_VERSIONS_TAG = "mlflow.modelVersions"
# MLflow 3's URI of a logged model: one path segment, no alias (models:/NAME/1 is a version)
_LOGGED_MODEL_URI = re.compile(r"^models:/(?P<model_id>[^/@]+)$")


class RegistryError(DbspecError):
    """A registry operation cannot be done (unknown model, version or alias)."""


@dataclass(frozen=True)
class GateResult:
    """The outcome of one gate for one version."""

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
            the alias is unset.
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
            results.append(_versus(gate, value, reference(gate.better_than, gate.metric)))
    return results


def _versus(gate: Gate, value: Optional[float], champion: Optional[float]) -> GateResult:
    minimize = lower_is_better(gate.metric)
    sign = "<=" if minimize else ">="
    condition = f"{sign} @{gate.better_than}" + (f" ± {gate.tolerance:g}" if gate.tolerance else "")
    if champion is None:
        return GateResult(gate.metric, condition, value, None, value is not None,
                          f"no version holds @{gate.better_than} yet")
    if value is None:
        return GateResult(gate.metric, condition, None, champion, False)
    passed = value <= champion + gate.tolerance if minimize else value >= champion - gate.tolerance
    return GateResult(gate.metric, condition, value, champion, passed,
                      f"@{gate.better_than} has {champion:.6g}")


class Registry:
    """Registered versions, gate records and aliases of one MLflow registry."""

    def __init__(self, client):
        self.client = client

    def register(self, name: str, model_uri: str, run_id: str, tags: dict[str, str]) -> str:
        """Create a version of ``name`` from ``model_uri``; returns the version number.

        Args:
            name: The registered model (created if missing).
            model_uri: What :meth:`Tracker.log_model` returned, ``models:/<model_id>``.
            run_id: The training run, linked from the version.
            tags: Version tags.
        """
        from mlflow.exceptions import MlflowException

        try:
            self.client.get_registered_model(name)
        except MlflowException:
            self.client.create_registered_model(name)
        model_id = logged_model_id(model_uri)
        # a REST store (mlflow server, Databricks) refuses a models:/<id> source without its
        # model_id; the SQLite store accepts it either way
        version = self.client.create_model_version(name, model_uri, run_id=run_id, tags=tags,
                                                   model_id=model_id)
        deadline = time.monotonic() + 300
        while version.status == "PENDING_REGISTRATION" and time.monotonic() < deadline:
            time.sleep(0.2)
            version = self.client.get_model_version(name, version.version)
        if model_id is not None:
            self._link_logged_model(model_id, name, str(version.version))
        return str(version.version)

    def _link_logged_model(self, model_id: str, name: str, version: str) -> None:
        """Record the version on the logged model, as ``mlflow.register_model`` does (the UI
        links the two through this tag). A tracking server records it itself; the SQLite
        store does not."""
        model = self.client.get_logged_model(model_id)
        linked = json.loads(model.tags.get(_MODEL_VERSIONS_TAG, "[]"))
        if any(entry.get("name") == name and str(entry.get("version")) == version
               for entry in linked):
            return
        linked.append({"name": name, "version": version})
        self.client.set_logged_model_tags(model_id, {_MODEL_VERSIONS_TAG: json.dumps(linked)})

    def holder(self, name: str, alias: str) -> Optional[Any]:
        """The version holding ``alias``, or None."""
        from mlflow.exceptions import MlflowException

        try:
            return self.client.get_model_version_by_alias(name, alias)
        except MlflowException:
            return None

    def record_gates(self, name: str, version: str, results: list[GateResult], decision: str) -> None:
        """Store each gate result and the decision as tags on the version."""
        for index, result in enumerate(results):
            self.client.set_model_version_tag(name, version, f"dbspec.gate.{index}",
                                              json.dumps(asdict(result)))
        self.client.set_model_version_tag(name, version, "dbspec.decision", decision)

    def move_alias(self, name: str, alias: str, version: str, *, reason: str) -> Optional[str]:
        """Point ``alias`` at ``version`` and append to its history; returns the old holder."""
        from mlflow.exceptions import MlflowException

        previous = self.holder(name, alias)
        old = str(previous.version) if previous is not None else None
        try:
            self.client.set_registered_model_alias(name, alias, version)
        except MlflowException as exc:
            raise RegistryError(f"cannot set @{alias} on {name} v{version}: "
                                f"{exc.message.splitlines()[0]}") from None
        history = self.history(name, alias)
        history.append({"version": version, "previous": old, "at": _now(),
                        "by": getpass.getuser(), "reason": reason})
        self.client.set_registered_model_tag(name, HISTORY_TAG.format(alias=alias),
                                             json.dumps(history[-_HISTORY_LIMIT:]))
        return old

    def history(self, name: str, alias: str) -> list[dict[str, Any]]:
        """Every recorded move of ``alias``, oldest first."""
        model = self._model(name)
        raw = model.tags.get(HISTORY_TAG.format(alias=alias))
        return json.loads(raw) if raw else []

    def versions(self, name: str) -> list[Any]:
        """Every version of ``name``, newest first."""
        self._model(name)
        found = self.client.search_model_versions(f"name = '{name}'")
        return sorted(found, key=lambda v: int(v.version), reverse=True)

    def version(self, name: str, version: str) -> Any:
        from mlflow.exceptions import MlflowException

        self._model(name)
        try:
            return self.client.get_model_version(name, version)
        except MlflowException:
            raise RegistryError(f"{name} has no version {version}") from None

    def _model(self, name: str) -> Any:
        from mlflow.exceptions import MlflowException

        try:
            return self.client.get_registered_model(name)
        except MlflowException:
            names = [m.name for m in self.client.search_registered_models()]
            from dbspec.errors import did_you_mean

            raise RegistryError(f"no registered model '{name}'{did_you_mean(name, names)}; "
                                f"known: {', '.join(names) or 'none'}") from None


def logged_model_id(model_uri: str) -> Optional[str]:
    """The model id in an MLflow 3 logged model URI (``models:/m-...``); None for any other
    URI (``runs:/...``, a path), which a registry takes without a model id."""
    found = _LOGGED_MODEL_URI.match(model_uri)
    return found["model_id"] if found else None


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
