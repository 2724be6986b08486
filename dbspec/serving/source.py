"""Which registered model to serve, and loading it: ``SPEC``, ``models:/NAME@ALIAS``,
``models:/NAME/VERSION`` or ``models:/NAME`` (its latest version).

The model is loaded from its registered artifacts with the installed dbspec, not through
``mlflow.pyfunc.load_model``: that would put the copy of dbspec logged with the model first on
``sys.path`` of a long-lived server process.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import NamedTuple, Optional

from dbspec.errors import UsageError
from dbspec.registry import RegistryError

_URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:@(?P<alias>[^/@]+)|/(?P<version>\d+))?/?$")


class ModelTarget(NamedTuple):
    """A registered model and how to pick its version (alias, number, or the latest)."""

    name: str
    alias: Optional[str] = None
    version: Optional[str] = None

    @property
    def uri(self) -> str:
        if self.alias:
            return f"models:/{self.name}@{self.alias}"
        return f"models:/{self.name}" + (f"/{self.version}" if self.version else "")


def parse_model_uri(uri: str) -> ModelTarget:
    """``models:/NAME@ALIAS``, ``models:/NAME/VERSION`` or ``models:/NAME``.

    Raises:
        UsageError: anything else.
    """
    found = _URI.match(uri)
    if not found:
        raise UsageError(f"model URI '{uri}': expected models:/NAME@ALIAS, models:/NAME/VERSION "
                         "or models:/NAME")
    return ModelTarget(found["name"], found["alias"], found["version"])


def spec_target(spec, *, alias: Optional[str] = None) -> ModelTarget:
    """The model a spec serves: ``serving.model_alias``, else its promotion alias, else latest.

    Raises:
        UsageError: the spec registers no model.
    """
    if spec.registry is None:
        raise UsageError(f"spec '{spec.name}' has no registry section, so there is no registered "
                         "model to serve; give a models:/ URI instead")
    promotion = spec.registry.promotion
    alias = alias or spec.serving.model_alias or (promotion.alias if promotion else None)
    return ModelTarget(spec.registry.name, alias)


def tracking_uri_for(spec, given: Optional[str]) -> Optional[str]:
    """``--tracking-uri`` > ``MLFLOW_TRACKING_URI`` > the spec's ``tracking.tracking_uri``."""
    return given or os.environ.get("MLFLOW_TRACKING_URI") or (
        spec.tracking.tracking_uri if spec is not None else None)


def resolve_version(client, target: ModelTarget) -> str:
    """The version number ``target`` points at now.

    Raises:
        RegistryError: no such model, version or alias.
    """
    from mlflow.exceptions import MlflowException

    try:
        if target.alias:
            return str(client.get_model_version_by_alias(target.name, target.alias).version)
        if target.version:
            return str(client.get_model_version(target.name, target.version).version)
        versions = client.search_model_versions(f"name = '{target.name}'")
    except MlflowException as exc:
        raise RegistryError(_registry_problem(client, target, exc)) from None
    if not versions:
        raise RegistryError(f"registered model '{target.name}' does not exist or has no "
                            "versions: run its spec first")
    return str(max(int(v.version) for v in versions))


def _registry_problem(client, target: ModelTarget, exc: Exception) -> str:
    from mlflow.exceptions import MlflowException

    if getattr(exc, "error_code", "") not in ("RESOURCE_DOES_NOT_EXIST", "NOT_FOUND",
                                              "INVALID_PARAMETER_VALUE"):
        return f"the registry did not answer: {str(exc).splitlines()[0]}"
    try:
        client.get_registered_model(target.name)
    except MlflowException as missing:
        if getattr(missing, "error_code", "") != "RESOURCE_DOES_NOT_EXIST":
            return f"the registry did not answer: {str(missing).splitlines()[0]}"
        return f"registered model '{target.name}' does not exist: run its spec first"
    if target.alias:
        return (f"no version of '{target.name}' holds the alias '{target.alias}': promote one "
                f"(dbspec promote ... --version N --alias {target.alias})")
    if target.version:
        return f"registered model '{target.name}' has no version {target.version}"
    return str(exc).splitlines()[0]


def load_version(client, target: ModelTarget, version: str):
    """Download a version's artifacts and rebuild its served model; a ``LoadedModel``."""
    import mlflow

    from dbspec.models.served import load_served_model
    from dbspec.serving.app import LoadedModel
    from dbspec.tracking.mlflow_tracking import artifact_progress_bars_off

    from mlflow.exceptions import MlflowException

    try:
        with artifact_progress_bars_off():
            local = Path(mlflow.artifacts.download_artifacts(
                artifact_uri=client.get_model_version_download_uri(target.name, version),
                tracking_uri=client.tracking_uri))
    except (MlflowException, OSError) as exc:
        raise RegistryError(f"cannot download models:/{target.name}/{version}: "
                            f"{str(exc).splitlines()[0]}") from None
    cards = sorted(local.glob("artifacts/*/model.json"))
    if not cards:
        raise RegistryError(f"models:/{target.name}/{version} was not logged by dbspec (no "
                            "served model among its artifacts); serve it with mlflow models "
                            "serve instead")
    model = load_served_model(cards[0].parent)
    return LoadedModel(model, target.name, version, target.uri)
