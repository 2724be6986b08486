"""``roles``: who may read, change and deploy what the spec produces on Databricks.

``dbspec jobs`` turns the roles into Unity Catalog grants and permission levels
(``dbspec.jobs.resources``); on an ``mlflow server --app-name basic-auth``, ``dbspec grant``
and ``dbspec run`` make the users MANAGE / EDIT / READ (``dbspec.registry.access``).
"""

import re
from typing import Annotated, NamedTuple

from pydantic import AfterValidator, ValidationInfo, field_validator

from dbspec.errors import did_you_mean
from dbspec.spec.sections.base import SpecModel, d

ROLE_NAMES = ("admin", "data_scientist", "analyst")
PRINCIPAL_KINDS = ("user", "group", "service_principal")
_EMAIL = re.compile(r"^[^@\s:]+@[^@\s]+\.[^@\s]+$")
_UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
_KIND = re.compile(r"^([A-Za-z_]+):(.*)$")


class Principal(NamedTuple):
    """A user (e-mail), group (name) or service principal (application id)."""

    kind: str
    name: str

    def __str__(self) -> str:
        return f"{self.kind}:{self.name}"

    @property
    def is_user(self) -> bool:
        """A person (MLflow's own auth knows users only: no groups or service principals)."""
        return self.kind == "user"


def parse_principal(text: str) -> Principal:
    """The principal a normalised ``kind:name`` string (as :class:`RolesSpec` holds) names."""
    kind, _, name = text.partition(":")
    return Principal(kind, name)


def normalize_principal(value: str) -> str:
    """``value`` as ``kind:name``.

    Raises:
        ValueError: an unknown kind, an empty name, a user that is no e-mail address, a
            service principal that is no application id, or a bare application id.
    """
    text = value.strip()
    if not text:
        raise ValueError("a principal must not be empty; write user:<email>, group:<name> or "
                         "service_principal:<application-id>")
    prefixed = _KIND.match(text)
    if prefixed and not _EMAIL.match(text):
        kind, name = prefixed.group(1), prefixed.group(2).strip()
        if kind not in PRINCIPAL_KINDS:
            raise ValueError(f"unknown principal kind '{kind}' in '{value}'"
                             f"{did_you_mean(kind, PRINCIPAL_KINDS)}; write user:<email>, "
                             "group:<name> or service_principal:<application-id>")
    elif _EMAIL.match(text):
        kind, name = "user", text
    elif _UUID.match(text):
        raise ValueError(f"'{value}' looks like a service principal's application id; write "
                         f"service_principal:{text} (a bare name is read as a group)")
    else:
        kind, name = "group", text
    if not name:
        raise ValueError(f"'{value}' names no {kind.replace('_', ' ')}")
    if kind == "user" and not _EMAIL.match(name):
        raise ValueError(f"'{value}': a user is named by its e-mail address (user:<email>)")
    if kind == "service_principal" and not _UUID.match(name):
        raise ValueError(f"'{value}': a service principal is named by its application id, a "
                         "UUID such as 6f1c3c1e-2b0d-4f55-9a7e-0c1d2e3f4a5b")
    if kind == "group" and any(ch in name for ch in "\n\r\t`"):
        raise ValueError(f"'{value}': a group name has no tabs, line breaks or backticks")
    return f"{kind}:{name}"


PrincipalText = Annotated[str, AfterValidator(normalize_principal)]
_PRINCIPALS_HELP = ("user:<email>, group:<name> or service_principal:<application-id>; a bare "
                    "e-mail address is a user, any other bare name a group.")


class RolesSpec(SpecModel):
    """Principals by role; ``dbspec jobs`` grants each role its access on the registered model,
    the job, the experiment and the serving endpoint. A principal holds one role."""

    admin: list[PrincipalText] = d(
        "Read, write and deploy: manage the job, the experiment, the endpoint and the "
        "registered model (its grants included). " + _PRINCIPALS_HELP, default=[])
    data_scientist: list[PrincipalText] = d(
        "Read and write: run the job, edit the experiment, query the endpoint, use and tag the "
        "registered model. " + _PRINCIPALS_HELP, default=[])
    analyst: list[PrincipalText] = d(
        "Read only: view the job, the experiment and the endpoint, use the registered model. "
        + _PRINCIPALS_HELP, default=[])

    @field_validator("admin", "data_scientist", "analyst")
    @classmethod
    def _one_role_each(cls, value: list[str], info: ValidationInfo) -> list[str]:
        earlier = ROLE_NAMES[:ROLE_NAMES.index(info.field_name)]
        seen = {p: role for role in earlier for p in info.data.get(role, [])}
        for index, principal in enumerate(value):
            if principal in value[:index]:
                raise ValueError(f"'{principal}' is listed twice")
            if principal in seen:
                raise ValueError(f"'{principal}' is already {seen[principal]}; give each "
                                 "principal one role, the one with the access it needs")
        return value

    def members(self) -> list[tuple[str, Principal]]:
        """(role, principal) for every principal, roles in :data:`ROLE_NAMES` order."""
        return [(role, parse_principal(p)) for role in ROLE_NAMES for p in getattr(self, role)]
