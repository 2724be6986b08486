"""The spec's roles as MLflow permissions, on a tracking server with MLflow's own auth.

``mlflow server --app-name basic-auth`` keeps users and per-user permissions on each
experiment and registered model. A spec's ``roles`` become those permissions
(:func:`apply_roles`): ``admin`` -> MANAGE, ``data_scientist`` -> EDIT, ``analyst`` -> READ, on
the spec's experiment and registered model, for each ``user:`` principal (its e-mail address is
the MLflow username). Groups and service principals have no counterpart in MLflow's own auth
and are skipped, said once.

What MLflow itself enforces (read from its auth plugin, checked against a real server):
reading needs READ; tags, new versions and setting an alias need EDIT; deleting an alias or a
version, and granting permissions, need MANAGE. So a data scientist (EDIT) may move any alias
as far as MLflow is concerned; the course's rule that only an admin deploys is dbspec's
(:func:`require_deployer`): promoting to the last stage and approving need MANAGE.

Granting needs MANAGE on the resource (or an MLflow admin). A caller who is no MLflow admin
cannot read other users' permissions, and never lowers its own (it would lose the right to
finish); both are said in the report, not guessed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from dbspec.registry.errors import (RegistryError, is_not_found, is_permission_denied, refused,
                                    unavailable)

#: The MLflow permission each role of the spec gets.
ROLE_PERMISSIONS = {"admin": "MANAGE", "data_scientist": "EDIT", "analyst": "READ"}
_RANK = {"DENY": -1, "NO_PERMISSIONS": 0, "READ": 1, "USE": 2, "EDIT": 3, "MANAGE": 4}
_CURRENT_USER = "/api/2.0/mlflow/users/current"
_USER_PERMISSIONS = "/api/3.0/mlflow/users/permissions/list"
#: Why promoting to the last stage and approving need MANAGE (MLflow asks only EDIT).
DEPLOY_RULE = "only roles.admin deploys and approves"


@dataclass(frozen=True)
class ServerUser:
    """The caller as a tracking server with auth knows it."""

    name: str
    is_admin: bool


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
    """Who dbspec acts as on ``tracking_uri`` (``MLFLOW_TRACKING_USERNAME``); None when the
    store has no auth (a file or database URI, or a server without the basic-auth app).

    Raises:
        RegistryPermissionError: the server has auth and refuses the login (401).
        RegistryUnavailable: the server answered with another error.
    """
    if not tracking_uri.lower().startswith(("http://", "https://")):
        return None
    response = _get(tracking_uri, _CURRENT_USER, {})
    if response.status_code == 404:
        return None  # no auth app: the route does not exist
    if response.status_code == 401:
        raise refused("use the tracking server", "a login", unauthenticated=True)
    try:
        body = _checked(response, _CURRENT_USER)
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


def _checked(response, endpoint: str) -> dict[str, Any]:
    """The JSON of a 200 answer; an MLflow error (with its code) for any other."""
    from mlflow.utils.rest_utils import verify_rest_response

    return verify_rest_response(response, endpoint).json()


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

    Idempotent: a user who already has exactly that permission is left alone ("unchanged"); one
    with another is changed (revoked and granted again, MLflow has no update for one user);
    nothing but permissions is created. Users the server does not know are reported in
    :attr:`RolesReport.missing_users`, after every other grant was made.

    Args:
        tracking_uri: The tracking server (its auth API).
        roles: The spec's :class:`~dbspec.spec.sections.roles.RolesSpec`.
        resources: From :func:`roles_resources`.

    Returns:
        The report; ``report.auth`` is False (and nothing done) without auth on the server.

    Raises:
        RegistryPermissionError: the caller may not grant on a resource (needs MANAGE).
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
    caller may not read them (only MLflow admins and the user may); :data:`_MISSING` when
    the server has no such user."""
    response = _get(tracking_uri, _USER_PERMISSIONS, {"username": user})
    if response.status_code == 403:
        return None
    try:
        body = _checked(response, _USER_PERMISSIONS)
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
    try:
        if current:  # another level: MLflow grants one row per user, so revoke it first
            auth.revoke_user_permission(user, resource.kind, resource.id)
        auth.grant_user_permission(user, resource.kind, resource.id, target)
    except MlflowException as exc:
        if is_permission_denied(exc):
            raise refused(action, f"MANAGE on the {resource.kind.replace('_', ' ')}",
                          user=caller.name) from None
        if is_not_found(exc) and "user" in str(exc).lower():
            return "missing"
        if getattr(exc, "error_code", None) != "RESOURCE_ALREADY_EXISTS":
            raise RegistryError(f"cannot {action} to {user}: {_first_line(exc)}") from None
        # a grant the caller could not read: set it anew (its earlier level stays unknown)
        try:
            auth.revoke_user_permission(user, resource.kind, resource.id)
            auth.grant_user_permission(user, resource.kind, resource.id, target)
        except MlflowException as again:
            raise RegistryError(f"cannot {action} to {user}: {_first_line(again)}") from None
        report.changed += 1
        return f"set (its earlier level is not readable by {caller.name})"
    report.changed += 1
    return f"changed from {current}" if current else "granted"


def _first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "message", None) or exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


def has_permission(tracking_uri: str, kind: str, resource_id: str, needed: str) -> bool:
    """Whether the caller holds at least ``needed`` on a resource (True without auth, and for
    an MLflow admin, whom nothing restricts)."""
    user = server_user(tracking_uri)
    if user is None or user.is_admin:
        return True
    from mlflow.exceptions import MlflowException
    from mlflow.server.auth.client import AuthServiceClient

    try:
        held = AuthServiceClient(tracking_uri).get_user_permission(user.name, kind,
                                                                   resource_id).permission
    except MlflowException as exc:
        raise unavailable(exc, f"the permission of {user.name} on {resource_id}") from None
    return _RANK.get(held, 0) >= _RANK[needed]


def require_deployer(tracking_uri: str, name: str, action: str) -> None:
    """Refuse ``action`` (promoting ``name`` to its last stage, approving a version of it)
    unless the caller holds MANAGE on the registered model: roles.admin, by the course's
    rule. MLflow itself lets EDIT (data_scientist) set any alias. Nothing is checked on a
    store without auth.

    Raises:
        RegistryPermissionError: the caller lacks MANAGE.
    """
    if not has_permission(tracking_uri, "registered_model", name, "MANAGE"):
        raise refused(action, f"MANAGE on the registered model ({DEPLOY_RULE})",
                      hint="ask an admin (roles.admin) to do it")


def registry_uri(client: Any) -> str:
    """The server whose auth guards the models of an ``MlflowClient``: its tracking server
    (MLflow's auth app guards the registry of the server it runs in; a registry elsewhere,
    such as Unity Catalog, has its own permissions, which dbspec jobs grants)."""
    return client.tracking_uri


def grant_spec(spec: Any, tracking_uri: str, *, smoke: bool = False) -> RolesReport:
    """``dbspec grant``: the spec's roles on its experiment and registered model.

    Raises:
        RegistryError: the spec has no roles, the store has no auth, or neither the experiment
            nor the registered model exists yet.
        RegistryPermissionError: the caller may not grant (needs MANAGE, or an MLflow admin).
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
                            "`mlflow server --app-name basic-auth` (see the README's Roles)")
    client = mlflow.MlflowClient(tracking_uri, registry_uri=spec.tracking.registry_uri)
    model = None
    if spec.registry is not None:
        model = spec.registry.name + ("_smoke" if smoke else "")
    resources, absent = roles_resources(client, spec.tracking.experiment or spec.name, model)
    if not resources:
        raise RegistryError(f"neither {' nor '.join(absent)} exists on {tracking_uri} yet: run "
                            "the spec first (dbspec run grants the roles once it registered)")
    report = apply_roles(registry_uri(client), spec.roles, resources)
    report.absent = absent
    return report


def grant_after_register(tracker: Any, spec: Any, name: str) -> list[str]:
    """``dbspec run``, after registering ``name``: the spec's roles as permissions, when the
    tracking server has auth and the spec has roles; the lines to show (none otherwise).

    Never fails the run: a caller who may not grant (no MANAGE), or a server that does not
    answer, is said in a line that points at ``dbspec grant``.
    """
    if spec.roles is None:
        return []
    uri = registry_uri(tracker.client)
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
