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
from dbspec.registry import RegistryError, alias_holder
from dbspec.registry.errors import from_registry, is_not_found, unavailable

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
    """The model a spec serves: ``serving.model_alias``, else its last promotion alias, else latest.

    Raises:
        UsageError: the spec registers no model.
    """
    if spec.registry is None:
        raise UsageError(f"spec '{spec.name}' has no registry section, so there is no registered "
                         "model to serve; give a models:/ URI instead")
    alias = alias or spec.serving.model_alias or spec.registry.final_alias()
    return ModelTarget(spec.registry.name, alias)


def tracking_uri_for(spec, given: Optional[str]) -> Optional[str]:
    """``--tracking-uri`` > ``MLFLOW_TRACKING_URI`` > the spec's ``tracking.tracking_uri``."""
    return given or os.environ.get("MLFLOW_TRACKING_URI") or (
        spec.tracking.tracking_uri if spec is not None else None)


def open_client(tracking_uri: Optional[str], state_dir: Path):
    """The registry as serving reads it (:class:`~dbspec.serving.registry_reader.ServingRegistry`).

    Raises:
        RegistryError: no store at the default location.
    """
    from dbspec.serving.registry_reader import ServingRegistry

    default = state_dir / "mlflow.db"
    if not (tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")) and not default.exists():
        raise RegistryError(f"no tracking store at {default}: run a spec first, or give "
                            "--tracking-uri / MLFLOW_TRACKING_URI")
    return ServingRegistry(tracking_uri, state_dir, resolve_here=resolve_version)


def resolve_version(client, target: ModelTarget) -> str:
    """The version number ``target`` points at now, asked of an ``mlflow.MlflowClient`` or of
    :func:`open_client`'s registry (registry errors are told from bugs by their ``error_code``).

    Raises:
        RegistryError: no such model, version or alias.
    """
    from dbspec.serving.registry_reader import ServingRegistry

    if isinstance(client, ServingRegistry):
        return client.resolve(target)
    if target.alias:  # the one alias lookup, which never takes an error for "not set"
        holder = alias_holder(client, target.name, target.alias)
        if holder is None:
            raise RegistryError(_no_holder(client, target))
        return str(holder.version)
    try:
        if target.version:
            return str(client.get_model_version(target.name, target.version).version)
        versions = client.search_model_versions(f"name = '{target.name}'")
    except Exception as exc:
        if not from_registry(exc):
            raise
        raise RegistryError(_registry_problem(client, target, exc)) from None
    if not versions:
        raise RegistryError(f"registered model '{target.name}' does not exist or has no "
                            "versions: run its spec first")
    return str(max(int(v.version) for v in versions))


def _no_holder(client, target: ModelTarget) -> str:
    """Why nothing holds ``target``'s alias: no such model, or the alias is not set."""
    try:
        client.get_registered_model(target.name)
    except Exception as exc:
        if not from_registry(exc):
            raise
        if not is_not_found(exc):  # an error is not "nothing holds it"
            raise unavailable(exc, f"registered model '{target.name}'") from None
        return f"registered model '{target.name}' does not exist: run its spec first"
    latest = max((int(v.version) for v in
                  client.search_model_versions(f"name = '{target.name}'")), default=None)
    return (f"no version of '{target.name}' holds the alias '{target.alias}': promote one, "
            f"e.g. the latest: dbspec promote {target.name} {latest} --alias {target.alias}"
            if latest is not None else f"registered model '{target.name}' has no versions: "
            "run its spec first")


def _registry_problem(client, target: ModelTarget, exc: Exception) -> str:
    if getattr(exc, "error_code", "") not in ("RESOURCE_DOES_NOT_EXIST", "NOT_FOUND",
                                              "INVALID_PARAMETER_VALUE"):
        return f"the registry did not answer: {str(exc).splitlines()[0]}"
    try:
        client.get_registered_model(target.name)
    except Exception as missing:
        if not from_registry(missing):
            raise
        if getattr(missing, "error_code", "") != "RESOURCE_DOES_NOT_EXIST":
            return f"the registry did not answer: {str(missing).splitlines()[0]}"
        return f"registered model '{target.name}' does not exist: run its spec first"
    if target.version:
        return f"registered model '{target.name}' has no version {target.version}"
    return str(exc).splitlines()[0]


def load_version(client, target: ModelTarget, version: str, *, without_torch: bool = False):
    """A version's served model (a ``LoadedModel``), from its artifacts; ``without_torch``: on
    ONNX Runtime where it was logged with its ONNX export (``dbspec serve`` never imports torch).

    Raises:
        RegistryError: no such version, not a dbspec model, or an ONNX file that cannot load.
    """
    from dbspec.serving.app import LoadedModel

    local = version_artifacts(client, target, version)
    cards = sorted(local.glob("artifacts/*/model.json"))
    if not cards:
        raise RegistryError(f"models:/{target.name}/{version} was not logged by dbspec (no "
                            "served model among its artifacts); serve it with mlflow models "
                            "serve instead")
    model = None
    if without_torch:
        from dbspec.serving.onnx_model import load_onnx_model

        model = load_onnx_model(cards[0].parent)
    if model is None:
        from dbspec.models.served import load_served_model

        model = load_served_model(cards[0].parent)
    return LoadedModel(model, target.name, version, target.uri)


def version_artifacts(client, target: ModelTarget, version: str) -> Path:
    """The version's files: in place when on this disk, else downloaded through MLflow."""
    from dbspec.serving.registry_reader import local_artifacts

    where = f"models:/{target.name}/{version}"
    try:
        uri = client.get_model_version_download_uri(target.name, version)
    except Exception as exc:
        if not from_registry(exc):
            raise
        raise RegistryError(f"cannot download {where}: {str(exc).splitlines()[0]}") from None
    local = local_artifacts(uri)
    if local is not None:
        if not local.is_dir():
            raise RegistryError(f"cannot download {where}: its files are not at {local}")
        return local
    import mlflow

    from mlflow.exceptions import MlflowException

    from dbspec.tracking.mlflow_tracking import artifact_progress_bars_off

    try:
        with artifact_progress_bars_off():
            return Path(mlflow.artifacts.download_artifacts(artifact_uri=uri,
                                                            tracking_uri=client.tracking_uri))
    except (MlflowException, OSError) as exc:
        raise RegistryError(f"cannot download {where}: {str(exc).splitlines()[0]}") from None
