"""The spec's roles as MLflow permissions, on a server with MLflow's auth (``mlflow server
--app-name basic-auth``: users and per-user permissions on experiments and registered models).

``admin`` -> MANAGE, ``data_scientist`` -> EDIT, ``analyst`` -> READ, for each ``user:``
principal (its e-mail is the MLflow username); groups and service principals have no
counterpart there and are skipped, said once. MLflow asks READ to read, EDIT for tags, versions
and setting an alias, MANAGE to delete or grant; that only an admin deploys is dbspec's rule
(:func:`require_deployer`: MANAGE). A caller who is no MLflow admin cannot read other users'
permissions and never lowers its own; both are said in the report, not guessed.
"""

from __future__ import annotations

import getpass
import os
from dataclasses import dataclass, field
from typing import Any, Optional

from dbspec.registry.errors import (RegistryError, first_line, is_not_found,
                                    is_permission_denied, refused, unavailable)

ROLE_PERMISSIONS = {"admin": "MANAGE", "data_scientist": "EDIT", "analyst": "READ"}
_RANK = {"DENY": -1, "NO_PERMISSIONS": 0, "READ": 1, "USE": 2, "EDIT": 3, "MANAGE": 4}
# AuthServiceClient (3.17) has no call for these two reads
_CURRENT_USER = "/api/2.0/mlflow/users/current"
_USER_PERMISSIONS = "/api/3.0/mlflow/users/permissions/list"
DEPLOY_RULE = "only roles.admin deploys and approves"


@dataclass(frozen=True)
class ServerUser:
    """The caller, as a server with auth knows it."""

    name: str
    is_admin: bool


@dataclass(frozen=True)
class Identity:
    """Who acts: the server's user when the store authenticates (``verified``), else the
    claimed ``MLFLOW_TRACKING_USERNAME`` (or the OS user) with the OS user beside it."""

    name: str
    verified: bool
    os_user: str

    def __str__(self) -> str:
        if self.verified:
            return self.name
        beside = "" if self.name == self.os_user else f"; OS user {self.os_user}"
        return f"{self.name} (unverified: the store has no authentication{beside})"

    def record(self) -> dict[str, Any]:
        """As recorded in a tag."""
        return {"by": self.name, "verified": self.verified, "os_user": self.os_user}


def acting_identity(tracking_uri: str) -> Identity:
    """The caller as the store vouches for it (:func:`server_user`), else as it claims."""
    try:
        os_user = getpass.getuser()
    except (OSError, KeyError):  # no login name and no passwd entry (a bare container)
        os_user = "unknown"
    user = server_user(tracking_uri)
    if user is not None and user.name:
        return Identity(user.name, True, os_user)
    return Identity(os.environ.get("MLFLOW_TRACKING_USERNAME") or os_user, False, os_user)


@dataclass(frozen=True)
class Resource:
    """An experiment (by id) or a registered model (by name) that roles apply to."""

    kind: str  # MLflow's resource_type: experiment, registered_model
    id: str
    label: str  # "experiment 'diabetes' (id 3)"


@dataclass
class RolesReport:
    """What :func:`apply_roles` did, one line per user and resource."""

    user: Optional[ServerUser] = None
    lines: list[str] = field(default_factory=list)
    changed: int = 0
    missing_users: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # groups, service principals
    absent: list[str] = field(default_factory=list)  # resources that do not exist (yet)

    @property
    def auth(self) -> bool:
        """Whether the tracking server has MLflow's auth (else nothing was done)."""
        return self.user is not None


def server_user(tracking_uri: str) -> Optional[ServerUser]:
    """Who dbspec acts as on ``tracking_uri``; None when the store has no auth.

    Raises:
        RegistryUnavailable: the server answered with an error (a refused login: its
            RegistryPermissionError).
    """
    if not tracking_uri.lower().startswith(("http://", "https://")):
        return None
    response = _get(tracking_uri, _CURRENT_USER, {})
    if response.status_code == 404:
        return None  # no auth app: the route does not exist
    if response.status_code == 401:
        raise refused("use the tracking server", "a login", unauthenticated=True)
    from mlflow.utils.rest_utils import verify_rest_response

    try:
        body = verify_rest_response(response, _CURRENT_USER).json()
    except Exception as exc:
        raise unavailable(exc, "the caller's user") from None
    user = body.get("user") or {}
    return ServerUser(str(user.get("username", "")), bool(user.get("is_admin", False)))


def _get(tracking_uri: str, endpoint: str, params: dict[str, str]):
    from mlflow.utils.credentials import get_default_host_creds
    from mlflow.utils.rest_utils import http_request

    try:
        return http_request(get_default_host_creds(tracking_uri), endpoint, "GET",
                            params=params, max_retries=0)
    except Exception as exc:  # a refused connection, a timeout
        raise unavailable(exc, endpoint) from None


def roles_resources(client: Any, experiment: Optional[str],
                    model: Optional[str]) -> tuple[list[Resource], list[str]]:
    """The experiment and registered model that exist, and a line for each that does not."""
    from mlflow.exceptions import MlflowException

    found, absent = [], []
    if experiment is not None:
        try:
            got = client.get_experiment_by_name(experiment)
        except MlflowException as exc:
            raise unavailable(exc, f"experiment '{experiment}'") from None
        if got is None:
            absent.append(f"experiment '{experiment}'")
        else:
            found.append(Resource("experiment", str(got.experiment_id),
                                  f"experiment '{experiment}' (id {got.experiment_id})"))
    if model is not None:
        try:
            client.get_registered_model(model)
            found.append(Resource("registered_model", model, f"registered model '{model}'"))
        except MlflowException as exc:
            if not is_not_found(exc):
                raise unavailable(exc, f"registered model '{model}'") from None
            absent.append(f"registered model '{model}'")
    return found, absent


def apply_roles(tracking_uri: str, roles: Any, resources: list[Resource]) -> RolesReport:
    """Give each ``user:`` principal of ``roles`` its role's permission on each resource.

    Idempotent: an exact permission is left alone; another is revoked and granted again (MLflow
    has no update). Unknown users are reported after every other grant. Without auth on the
    server nothing is done (``report.auth`` False). RegistryPermissionError: no MANAGE.
    """
    report = RolesReport(user=server_user(tracking_uri))
    if report.user is None:
        return report
    from mlflow.server.auth.client import AuthServiceClient

    auth = AuthServiceClient(tracking_uri)
    report.skipped = [str(p) for _, p in roles.members() if not p.is_user]
    if report.skipped:
        report.lines.append(f"  skipped {', '.join(report.skipped)}: MLflow's own auth has users "
                            "only (no groups or service principals); dbspec jobs grants them in "
                            "Unity Catalog")
    known: dict[str, Optional[dict]] = {}
    for role, principal in roles.members():
        if not principal.is_user:
            continue
        user, target = principal.name, ROLE_PERMISSIONS[role]
        if user not in known:
            known[user] = _explicit(tracking_uri, user)
        if known[user] is _MISSING:
            report.missing_users.append(user)
            continue
        for resource in resources:
            outcome = _grant_one(auth, report, user, target, resource, known[user])
            if outcome == "missing":
                report.missing_users.append(user)
                break
            report.lines.append(f"  {user} ({role}): {target} on {resource.label}: {outcome}")
    for user in report.missing_users:
        report.lines.append(f"  {user}: no such user on the tracking server; an MLflow admin "
                            "creates it first")
    return report


_MISSING: dict = {}  # sentinel: the server does not know the user


def _explicit(tracking_uri: str, user: str) -> Optional[dict]:
    """``{(resource_type, pattern): permission}`` of the user's own grants; None when the
    caller may not read them (only admins and the user may); :data:`_MISSING`: no such user."""
    response = _get(tracking_uri, _USER_PERMISSIONS, {"username": user})
    if response.status_code == 403:
        return None
    from mlflow.utils.rest_utils import verify_rest_response

    try:
        body = verify_rest_response(response, _USER_PERMISSIONS).json()
    except Exception as exc:
        if is_not_found(exc):
            return _MISSING
        raise unavailable(exc, f"the permissions of {user}") from None
    return {(row["resource_type"], row["resource_pattern"]): row["permission"]
            for row in body.get("permissions", [])
            if str(row.get("role_name", "")).startswith("__user_")}  # the user's own grants


def _grant_one(auth: Any, report: RolesReport, user: str, target: str, resource: Resource,
               known: Optional[dict]) -> str:
    """Give ``user`` ``target`` on ``resource``; the outcome's words for the report."""
    from mlflow.exceptions import MlflowException

    current = None if known is None else known.get((resource.kind, resource.id), "")
    if current == target:
        return "unchanged"
    caller = report.user
    assert caller is not None  # apply_roles grants nothing on a server without auth
    if user == caller.name and not caller.is_admin:
        # revoking first would take the caller's MANAGE, and with it the right to grant again
        return (f"left as {current or 'it is'} (dbspec does not change its caller's own "
                "permission; an MLflow admin's dbspec grant sets it)")
    action = f"grant permissions on {resource.label}"

    def set_level(revoke: bool) -> None:  # MLflow grants one row per user: revoke another
        if revoke:
            auth.revoke_user_permission(user, resource.kind, resource.id)
        auth.grant_user_permission(user, resource.kind, resource.id, target)

    try:
        set_level(bool(current))
    except MlflowException as exc:
        if is_permission_denied(exc):
            raise refused(action, f"MANAGE on the {resource.kind.replace('_', ' ')}",
                          user=caller.name) from None
        if is_not_found(exc) and "user" in str(exc).lower():
            return "missing"
        if getattr(exc, "error_code", None) != "RESOURCE_ALREADY_EXISTS":
            raise RegistryError(f"cannot {action} to {user}: {first_line(exc)}") from None
        # a grant the caller could not read: set it anew (its earlier level stays unknown)
        try:
            set_level(True)
        except MlflowException as again:
            raise RegistryError(f"cannot {action} to {user}: {first_line(again)}") from None
        report.changed += 1
        return f"set (its earlier level is not readable by {caller.name})"
    report.changed += 1
    return f"changed from {current}" if current else "granted"


def require_deployer(tracking_uri: str, name: str, action: str) -> None:
    """Refuse ``action`` (deploying or approving a version of ``name``) with a
    RegistryPermissionError unless the caller holds MANAGE on the model or is an MLflow admin
    (nothing is checked without auth)."""
    user = server_user(tracking_uri)
    if user is None or user.is_admin:
        return
    from mlflow.exceptions import MlflowException
    from mlflow.server.auth.client import AuthServiceClient

    try:
        held = AuthServiceClient(tracking_uri).get_user_permission(
            user.name, "registered_model", name).permission
    except MlflowException as exc:
        raise unavailable(exc, f"the permission of {user.name} on {name}") from None
    if _RANK.get(held, 0) < _RANK["MANAGE"]:
        raise refused(action, f"MANAGE on the registered model ({DEPLOY_RULE})",
                      hint="ask an admin (roles.admin) to do it")


def grant_spec(spec: Any, tracking_uri: str, *, smoke: bool = False) -> RolesReport:
    """``dbspec grant``: the spec's roles on its experiment and registered model.

    Raises:
        RegistryError: no roles, no auth, neither the experiment nor the model exists yet, or
            (RegistryPermissionError) the caller may not grant.
    """
    import mlflow

    from dbspec.tracking.stores import check_tracking_server, quiet_mlflow

    if spec.roles is None:
        raise RegistryError(f"spec '{spec.name}' has no roles section: nothing to grant")
    quiet_mlflow()
    if not tracking_uri.lower().startswith(("http://", "https://")):
        raise RegistryError(f"{tracking_uri} is no tracking server: roles become permissions "
                            "on an `mlflow server --app-name basic-auth`; give --tracking-uri "
                            "or MLFLOW_TRACKING_URI")
    check_tracking_server(tracking_uri)
    if server_user(tracking_uri) is None:
        raise RegistryError(f"the tracking server at {tracking_uri} has no auth: start it as "
                            "`mlflow server --app-name basic-auth` (see docs/howto/roles.md)")
    client = mlflow.MlflowClient(tracking_uri, registry_uri=spec.tracking.registry_uri)
    model = spec.registry.name + ("_smoke" if smoke else "") if spec.registry else None
    resources, absent = roles_resources(client, spec.tracking.experiment or spec.name, model)
    if not resources:
        raise RegistryError(f"neither {' nor '.join(absent)} exists on {tracking_uri} yet: run "
                            "the spec first (dbspec run grants the roles once it registered)")
    # MLflow's auth guards its own server's registry (Unity Catalog's: dbspec jobs grants)
    report = apply_roles(tracking_uri, spec.roles, resources)
    report.absent = absent
    return report


def grant_after_register(tracker: Any, spec: Any, name: str) -> list[str]:
    """``dbspec run``, after registering ``name``: the spec's roles as permissions, when the
    server has auth and the spec has roles; the lines to show. Never fails the run: a refusal
    or an error is said in a line that points at ``dbspec grant``.
    """
    if spec.roles is None:
        return []
    uri = tracker.client.tracking_uri
    try:
        resources = [Resource("experiment", str(tracker.experiment_id),
                              f"experiment '{tracker.experiment_name}' (id "
                              f"{tracker.experiment_id})"),
                     Resource("registered_model", name, f"registered model '{name}'")]
        report = apply_roles(uri, spec.roles, resources)
    except RegistryError as exc:
        return [f"  roles not applied: {exc} (an admin runs: dbspec grant SPEC)"]
    if not report.auth:
        return []
    if not report.changed and not report.missing_users:
        return [f"  roles: permissions on {name} and its experiment already as the spec says"]
    return ["  roles:"] + report.lines
