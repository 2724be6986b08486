"""``dbspec endpoint``: keep a Databricks Model Serving endpoint on the version the spec's
alias holds (MLflow's registry for the holder, databricks-sdk for the endpoint).

The endpoint belongs to the job's ``update_endpoint`` task, not to the bundle (a deploy would
create it on a version that does not exist yet, and reset it on each redeploy). A new endpoint
gets the spec's settings (:func:`dbspec.jobs.resources.endpoint_config`); an existing one only
has its served version moved, when it differs: the other served-entity settings, the traffic
split and the legacy inference table stay, and Databricks rolls the version out without
downtime. With ``roles``, the permissions are *set* (``set_permissions`` replaces them, so a
principal removed from the roles loses access), the caller keeping CAN_MANAGE. No holder (no
model passed the gates yet) is nothing to serve, not a failure.
"""

from __future__ import annotations

import dataclasses
import datetime
import re
from typing import Any, Callable, NamedTuple, Optional

from dbspec.errors import DbspecError, UsageError
from dbspec.registry import RegistryError
from dbspec.serving.source import ModelTarget, resolve_version

#: How long ``--wait`` waits for Databricks to build and start the new version.
WAIT = datetime.timedelta(minutes=40)
#: Serving endpoint names: letters, digits, dashes and underscores, 63 at most.
NAME_LIMIT = 63
_NAME = re.compile(r"^[\w-]+$")
_UUID = re.compile(r"^[0-9a-fA-F]{8}-([0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}$")
_LEVEL_FIELDS = ("user_name", "group_name", "service_principal_name")


class EndpointUpdate(NamedTuple):
    """What :func:`follow_alias` found and did."""

    endpoint: str
    target: ModelTarget
    served: Optional[str]  #: the version the endpoint served; None: it did not exist
    version: Optional[str]  #: the alias holder; None: nothing to serve
    updated: bool  #: created or moved
    dry_run: bool = False
    problem: str = ""  #: why there is nothing to serve
    created: Optional[str] = None  #: what a new endpoint serves on (workload, inference table)
    permissions: Optional[tuple[str, ...]] = None  #: the levels set (None: not touched)
    notes: tuple[str, ...] = ()

    def describe(self) -> str:
        """``endpoint X: v2 -> v3 (@champion moved)`` and the like, with permissions and notes."""
        holder = f"@{self.target.alias}" if self.target.alias else "the latest version"
        dry = " [dry run: not changed]" if self.dry_run else ""
        if self.version is None:
            lines = [f"endpoint {self.endpoint}: nothing to serve: {self.problem}; "
                     "the endpoint is left as it is"]
        elif self.served is None:
            verb = "would create it" if self.dry_run else "created"
            lines = [f"endpoint {self.endpoint}: {verb} serving v{self.version} = {holder} "
                     f"({self.created})" + dry]
        elif self.served == self.version:
            lines = [f"endpoint {self.endpoint} serves v{self.version} = {holder}: nothing "
                     "to do"]
        else:
            why = f"@{self.target.alias} moved" if self.target.alias else "a newer version"
            lines = [f"endpoint {self.endpoint}: v{self.served} -> v{self.version} ({why})"
                     + dry]
        if self.permissions is not None:
            verb = "would set" if self.dry_run else "set"
            lines.append(f"endpoint {self.endpoint}: permissions {verb}: "
                         + (", ".join(self.permissions) or "none"))
        lines += [f"endpoint {self.endpoint}: {note}" for note in self.notes]
        return "\n".join(lines)


def workspace_client():
    """databricks-sdk's ``WorkspaceClient`` from the environment (a job's identity, a token or a
    profile).

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
                 config: Callable[[str], tuple[Any, Any]],
                 permissions: Optional[list] = None, dry_run: bool = False,
                 wait: Optional[datetime.timedelta] = None) -> EndpointUpdate:
    """Create ``endpoint`` on the version ``target`` holds, or point its served version of
    ``target.name`` there; then set its permissions.

    Args:
        workspace: A ``WorkspaceClient``.
        client: An ``MlflowClient`` on the model's registry.
        target: The model and alias to follow (no alias: its latest version).
        endpoint: The serving endpoint's name.
        config: version -> (``EndpointCoreConfigInput``, ``AiGatewayConfig`` or None) of a new
            endpoint.
        permissions: ``ServingEndpointAccessControlRequest`` entries to set (with the caller's
            CAN_MANAGE); None leaves them alone.
        dry_run: Report what would change; change nothing.
        wait: Wait this long for the new version to serve, and fail if it does not.

    Raises:
        DbspecError: a registry that does not answer, an endpoint that does not serve exactly
            one version of the model, an update in progress, a refused or failed update.
    """
    try:
        version = resolve_version(client, target)
    except RegistryError as exc:
        if str(exc).startswith("the registry did not answer"):  # a failure, not an answer
            raise DbspecError(f"endpoint {endpoint}: {exc}") from None
        return EndpointUpdate(endpoint, target, None, None, False, dry_run, problem=str(exc))
    detail = _existing(workspace, endpoint)
    if detail is None:
        return _create(workspace, target, endpoint, version, config(version), permissions,
                       dry_run=dry_run, wait=wait)
    notes = _gateway_notes(detail, config(version)[1])
    state = getattr(detail.state, "config_update", None)
    if getattr(state, "value", state) == "IN_PROGRESS":
        pending = _served_version(endpoint, target, detail.pending_config) \
            if getattr(detail.pending_config, "served_entities", None) else None
        if pending != version:
            to = f" (to v{pending})" if pending else ""
            raise DbspecError(f"endpoint {endpoint} is being updated{to}; rerun once the "
                              "update has finished")
        served = version  # by the update in progress
    else:
        served = _served_version(endpoint, target, detail.config)
    waiter = None
    if served != version and not dry_run:
        entities, traffic = _moved(detail.config, target.name, served, version)
        waiter = _call(endpoint, "update", workspace.serving_endpoints.update_config, endpoint,
                       served_entities=entities, traffic_config=traffic,
                       auto_capture_config=_capture(detail.config))
    acl = _permissions(workspace, endpoint, detail.id, permissions, dry_run)
    if waiter is not None and wait is not None:
        _wait(waiter, endpoint, served, version, wait)
    return EndpointUpdate(endpoint, target, served, version, waiter is not None, dry_run,
                          permissions=acl, notes=notes)


def _existing(workspace, endpoint: str):
    try:
        return _call(endpoint, "read", workspace.serving_endpoints.get, endpoint)
    except _Missing:
        return None


def _create(workspace, target: ModelTarget, endpoint: str, version: str, settings,
            permissions: Optional[list], *, dry_run: bool,
            wait: Optional[datetime.timedelta]) -> EndpointUpdate:
    """A new endpoint serving ``version`` with ``settings`` (config, AI Gateway)."""
    core, gateway = settings
    (entity,) = core.served_entities
    table = getattr(gateway, "inference_table_config", None)
    shown = (f"served entity {entity.name}, {entity.workload_size} "
             f"{getattr(entity.workload_type, 'value', entity.workload_type)}"
             + (", scale to zero" if entity.scale_to_zero_enabled else "")
             + (f", inference table {table.catalog_name}.{table.schema_name}."
                f"{table.table_name_prefix}_*" if table is not None else ""))
    if dry_run:
        return EndpointUpdate(endpoint, target, None, version, False, True, created=shown,
                              permissions=_permissions(workspace, endpoint, None, permissions,
                                                       True))
    waiter = _call(endpoint, "create", workspace.serving_endpoints.create, endpoint,
                   config=core, ai_gateway=gateway)
    created = getattr(waiter, "response", None)
    acl = _permissions(workspace, endpoint, getattr(created, "id", None), permissions, False)
    if wait is not None:
        _wait(waiter, endpoint, None, version, wait)
    return EndpointUpdate(endpoint, target, None, version, True, created=shown,
                          permissions=acl)


def _permissions(workspace, endpoint: str, endpoint_id: Optional[str],
                 permissions: Optional[list], dry_run: bool) -> Optional[tuple[str, ...]]:
    """Set the endpoint's permissions to ``permissions`` and the caller's CAN_MANAGE; the levels
    set, as text (None: ``permissions`` is None)."""
    from databricks.sdk.service.serving import (
        ServingEndpointAccessControlRequest,
        ServingEndpointPermissionLevel,
    )

    if permissions is None:
        return None
    me = _call(endpoint, "read the identity that manages", workspace.current_user.me)
    field = "service_principal_name" if _UUID.match(me.user_name or "") else "user_name"
    caller = ServingEndpointAccessControlRequest(
        **{field: me.user_name}, permission_level=ServingEndpointPermissionLevel.CAN_MANAGE)
    acl = [caller] + [p for p in permissions if _principal(p) != _principal(caller)]
    shown = tuple(f"{_principal(p)[1]} {p.permission_level.value}" for p in acl)
    if dry_run:
        return shown
    if endpoint_id is None:  # created without an id in the answer: read it back
        endpoint_id = _call(endpoint, "read", workspace.serving_endpoints.get, endpoint).id
    _call(endpoint, "set the permissions of", workspace.serving_endpoints.set_permissions,
          endpoint_id, access_control_list=acl)
    return shown


def _principal(entry) -> tuple[str, str]:
    """(field, name) of the one principal an access control entry names."""
    return next((f, getattr(entry, f)) for f in _LEVEL_FIELDS if getattr(entry, f))


def _gateway_notes(detail, gateway) -> tuple[str, ...]:
    """A note when the endpoint's inference table is not the spec's: an existing endpoint's AI
    Gateway is not changed (its rate limits, guardrails and usage tracking would go with it)."""
    want = getattr(gateway, "inference_table_config", None)
    have = getattr(getattr(detail, "ai_gateway", None), "inference_table_config", None)
    key = ("catalog_name", "schema_name", "table_name_prefix")

    def shown(table) -> str:
        if table is None or not table.enabled:
            return "none"
        return ".".join(str(getattr(table, k)) for k in key) + "_*"

    if shown(want) == shown(have):
        return ()
    return (f"inference table {shown(have)} is not the spec's ({shown(want)}); an existing "
            "endpoint's AI Gateway is left as it is: change it in the Serving UI",)


def _served_version(endpoint: str, target: ModelTarget, config) -> str:
    """The version of ``target.name`` that ``config`` serves (exactly one)."""
    entities = list(getattr(config, "served_entities", None) or [])
    if not entities:
        raise DbspecError(f"endpoint {endpoint} serves nothing (its creation failed, or its "
                          f"config was removed): delete it (databricks serving-endpoints delete "
                          f"{endpoint}) and rerun, which creates it again")
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
    """(served entities, traffic config) of ``config`` with ``name`` at ``version``; an entity
    named ``<model>-<version>`` (Databricks' default) is renamed, and its traffic routes too."""
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
    """An SDK ``...Output`` object as ``cls``, its input class: every field they share (so
    settings added to the SDK later are kept too)."""
    names = {f.name for f in dataclasses.fields(cls)}
    return cls.from_dict({k: v for k, v in output.as_dict().items() if k in names})


class _Missing(DbspecError):
    """The SDK's NotFound: no such endpoint (or, creating one, no such model version)."""


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
    except NotFound as exc:
        raise _Missing(f"cannot {verb} endpoint {endpoint}: {_first(exc)}") from None
    except PermissionDenied as exc:
        need = ("the workspace's permission to create serving endpoints" if verb == "create"
                else "CAN_MANAGE on the endpoint")
        raise DbspecError(f"not allowed to {verb} endpoint {endpoint}: {_first(exc)} (the job "
                          f"runs as its owner, who needs {need})") from None
    except Unauthenticated as exc:
        raise DbspecError(f"not authenticated to the Databricks workspace: {_first(exc)}") \
            from None
    except ResourceConflict as exc:
        raise DbspecError(f"endpoint {endpoint} is busy: {_first(exc)}; rerun once its "
                          "current update has finished") from None
    except (DatabricksError, ValueError) as exc:
        raise DbspecError(f"cannot {verb} endpoint {endpoint}: {_first(exc)}") from None


def _wait(waiter, endpoint: str, served: Optional[str], version: str,
          timeout: datetime.timedelta) -> None:
    """Wait for the rollout of ``version`` (``served`` None: of a new endpoint)."""
    from databricks.sdk.errors import DatabricksError, OperationFailed

    what = f"the update to v{version}" if served is not None else \
        f"starting the new endpoint on v{version}"
    try:
        waiter.result(timeout=timeout)
    except OperationFailed as exc:
        kept = f"it still serves v{served}" if served is not None else "it serves nothing"
        raise DbspecError(f"endpoint {endpoint}: {what} failed ({_first(exc)}); {kept}: see "
                          "the endpoint's events in the Serving UI") from None
    except TimeoutError:
        raise DbspecError(f"endpoint {endpoint}: v{version} was not serving after "
                          f"{timeout}; Databricks goes on with the update (see the endpoint's "
                          "events)") from None
    except DatabricksError as exc:
        raise DbspecError(f"endpoint {endpoint}: cannot follow {what}: "
                          f"{_first(exc)}") from None


def _first(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def checked_name(name: str) -> str:
    """``name`` cut to 63 characters (a development bundle's per-user prefix can make it longer).

    Raises:
        UsageError: characters other than letters, digits, dashes and underscores.
    """
    if not name or not _NAME.match(name):
        raise UsageError(f"--endpoint '{name}': a serving endpoint name has letters, digits, "
                         "dashes and underscores only")
    return name[:NAME_LIMIT]
