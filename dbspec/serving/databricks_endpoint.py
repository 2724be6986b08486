"""``dbspec endpoint``: keep a Databricks Model Serving endpoint on the version the spec's alias
holds.

A bundle deploys the endpoint with a fixed version; promotion moves the alias in the registry
and nothing else. This command (the generated job's ``update_endpoint`` task) reads the alias
holder from MLflow's registry and the endpoint through databricks-sdk, and changes the
endpoint's config only when the two differ: every other served-entity setting (workload size
and type, scale to zero, environment variables), the traffic split and the legacy inference
table stay as they are. Databricks rolls the new version out without downtime; the old one
keeps serving if the new one fails to start.
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any, NamedTuple, Optional

from dbspec.errors import DbspecError
from dbspec.serving.source import ModelTarget, resolve_version

#: How long ``--wait`` waits for Databricks to build and start the new version.
WAIT = datetime.timedelta(minutes=40)


class EndpointUpdate(NamedTuple):
    """What :func:`follow_alias` found and did."""

    endpoint: str
    target: ModelTarget
    served: str
    version: str
    updated: bool
    dry_run: bool = False

    def describe(self) -> str:
        """``endpoint X serves v3 = @champion: nothing to do`` or ``endpoint X: v2 -> v3
        (@champion moved)``."""
        holder = f"@{self.target.alias}" if self.target.alias else "the latest version"
        if self.served == self.version:
            return f"endpoint {self.endpoint} serves v{self.version} = {holder}: nothing to do"
        why = f"@{self.target.alias} moved" if self.target.alias else "a newer version"
        return (f"endpoint {self.endpoint}: v{self.served} -> v{self.version} ({why})"
                + (" [dry run: not changed]" if self.dry_run else ""))


def workspace_client():
    """databricks-sdk's ``WorkspaceClient`` from the environment: in a job the run's identity,
    elsewhere DATABRICKS_HOST with a token, or a configuration profile.

    Raises:
        DbspecError: no credentials.
    """
    from databricks.sdk import WorkspaceClient

    try:
        return WorkspaceClient()
    except ValueError as exc:  # the SDK's way of saying it found no credentials
        raise DbspecError(f"not authenticated to a Databricks workspace: "
                          f"{str(exc).splitlines()[0]} (set DATABRICKS_HOST and "
                          "DATABRICKS_TOKEN, or DATABRICKS_CONFIG_PROFILE)") from None


def follow_alias(workspace, client, target: ModelTarget, endpoint: str, *,
                 dry_run: bool = False, wait: Optional[datetime.timedelta] = None
                 ) -> EndpointUpdate:
    """Point ``endpoint``'s served version of ``target.name`` at the version ``target`` holds.

    Args:
        workspace: A ``WorkspaceClient`` (or anything with its ``serving_endpoints``).
        client: An ``MlflowClient`` on the registry the model lives in.
        target: The model and alias to follow (no alias: its latest version).
        endpoint: The serving endpoint's name.
        dry_run: Report what would change; change nothing.
        wait: Wait this long for the new version to serve, and fail if it does not.

    Raises:
        DbspecError: no alias holder, no such endpoint, an endpoint that does not serve exactly
            one version of the model, an update in progress, a refused or failed update.
    """
    try:
        version = resolve_version(client, target)
    except DbspecError as exc:
        raise DbspecError(f"endpoint {endpoint}: nothing to serve: {exc}") from None
    detail = _call(endpoint, "read", workspace.serving_endpoints.get, endpoint)
    state = getattr(detail.state, "config_update", None)
    if getattr(state, "value", state) == "IN_PROGRESS":
        pending = _served_version(endpoint, target, detail.pending_config)
        if pending == version:
            return EndpointUpdate(endpoint, target, version, version, False, dry_run)
        raise DbspecError(f"endpoint {endpoint} is being updated (to v{pending}); rerun once "
                          "the update has finished")
    served = _served_version(endpoint, target, detail.config)
    if served == version or dry_run:
        return EndpointUpdate(endpoint, target, served, version, False, dry_run)
    entities, traffic = _moved(detail.config, target.name, served, version)
    capture = _capture(detail.config)
    waiter = _call(endpoint, "update", workspace.serving_endpoints.update_config, endpoint,
                   served_entities=entities, traffic_config=traffic, auto_capture_config=capture)
    if wait is not None:
        _wait(waiter, endpoint, served, version, wait)
    return EndpointUpdate(endpoint, target, served, version, True)


def _served_version(endpoint: str, target: ModelTarget, config) -> str:
    """The version of ``target.name`` that ``config`` serves (exactly one)."""
    entities = list(getattr(config, "served_entities", None) or [])
    ours = [e for e in entities if e.entity_name == target.name]
    if not ours:
        shown = ", ".join(f"{e.entity_name} v{e.entity_version}" for e in entities) or "nothing"
        raise DbspecError(f"endpoint {endpoint} serves no version of {target.name} (it serves "
                          f"{shown}); check --endpoint and the spec's registry.name")
    if len(ours) > 1:
        shown = ", ".join(f"v{e.entity_version}" for e in ours)
        raise DbspecError(f"endpoint {endpoint} serves {len(ours)} versions of {target.name} "
                          f"({shown}, a traffic split); dbspec moves a single served version "
                          "only: change this endpoint by hand")
    return str(ours[0].entity_version)


def _moved(config, name: str, served: str, version: str):
    """(served entities, traffic config) of ``config`` with ``name`` at ``version``.

    A served entity named after its version (Databricks' default, ``<model>-<version>``) is
    renamed with it, and the traffic routes follow the new name.
    """
    from databricks.sdk.service.serving import ServedEntityInput, TrafficConfig

    renamed: dict[str, str] = {}
    entities = []
    for entity in config.served_entities:
        given = _as(ServedEntityInput, entity)
        if entity.entity_name == name:
            given.entity_version = version
            if given.name and given.name.endswith(f"-{served}"):
                renamed[given.name] = given.name[:-len(served)] + version
                given.name = renamed[given.name]
        entities.append(given)
    traffic = None
    if config.traffic_config is not None:
        traffic = TrafficConfig.from_dict(config.traffic_config.as_dict())
        for route in traffic.routes or []:
            route.served_entity_name = renamed.get(route.served_entity_name,
                                                   route.served_entity_name)
            route.served_model_name = renamed.get(route.served_model_name,
                                                  route.served_model_name)
    return entities, traffic


def _capture(config):
    """The legacy inference table, sent again so that an update keeps it on."""
    from databricks.sdk.service.serving import AutoCaptureConfigInput

    capture = getattr(config, "auto_capture_config", None)
    if capture is None or not capture.enabled:
        return None
    return _as(AutoCaptureConfigInput, capture)


def _as(cls, output: Any):
    """``output`` (an SDK ``...Output`` object) as ``cls``, the matching input class: the
    fields the two share (so settings added to the SDK later are kept too)."""
    names = {f.name for f in dataclasses.fields(cls)}
    return cls.from_dict({k: v for k, v in output.as_dict().items() if k in names})


def _call(endpoint: str, verb: str, method, *args, **kwargs):
    """``method(*args, **kwargs)``, its SDK errors as messages that say what to do."""
    from databricks.sdk.errors import (
        DatabricksError,
        NotFound,
        PermissionDenied,
        ResourceConflict,
        Unauthenticated,
    )

    try:
        return method(*args, **kwargs)
    except NotFound:
        raise DbspecError(f"endpoint {endpoint} does not exist in this workspace: deploy the "
                          "bundle first (databricks bundle deploy), or check --endpoint") from None
    except PermissionDenied as exc:
        raise DbspecError(f"not allowed to {verb} endpoint {endpoint}: {_first(exc)} (the job "
                          "runs as its owner, who needs CAN_MANAGE on the endpoint)") from None
    except Unauthenticated as exc:
        raise DbspecError(f"not authenticated to the Databricks workspace: {_first(exc)}") \
            from None
    except ResourceConflict as exc:
        raise DbspecError(f"endpoint {endpoint} is busy: {_first(exc)}; rerun once its "
                          "current update has finished") from None
    except (DatabricksError, ValueError) as exc:
        raise DbspecError(f"cannot {verb} endpoint {endpoint}: {_first(exc)}") from None


def _wait(waiter, endpoint: str, served: str, version: str,
          timeout: datetime.timedelta) -> None:
    from databricks.sdk.errors import DatabricksError, OperationFailed

    try:
        waiter.result(timeout=timeout)
    except OperationFailed as exc:
        raise DbspecError(f"endpoint {endpoint}: the update to v{version} failed "
                          f"({_first(exc)}); it still serves v{served}: see the endpoint's "
                          "events in the Serving UI") from None
    except TimeoutError:
        raise DbspecError(f"endpoint {endpoint}: v{version} was not serving after "
                          f"{timeout}; Databricks goes on with the update (see the endpoint's "
                          "events)") from None
    except DatabricksError as exc:
        raise DbspecError(f"endpoint {endpoint}: cannot follow the update to v{version}: "
                          f"{_first(exc)}") from None


def _first(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def run_endpoint(args) -> int:
    """The ``endpoint`` command: the spec's alias holder onto ``--endpoint``."""
    import os
    from pathlib import Path

    import mlflow

    from dbspec.registry.commands import open_registry
    from dbspec.serving.source import spec_target, tracking_uri_for
    from dbspec.spec.loader import load_spec

    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")
    spec = load_spec(args.file, target=args.target, assignments=args.assignments).spec
    target = spec_target(spec, alias=args.alias)
    client = open_registry(tracking_uri_for(spec, args.tracking_uri), Path(args.state_dir)).client
    if spec.tracking.registry_uri and not os.environ.get("MLFLOW_REGISTRY_URI"):
        client = mlflow.MlflowClient(registry_uri=spec.tracking.registry_uri)
    result = follow_alias(workspace_client(), client, target, args.endpoint,
                          dry_run=args.dry_run, wait=WAIT if args.wait else None)
    print(result.describe())
    return 0
