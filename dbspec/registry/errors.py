"""The registry's errors, apart so that every registry module (the lock too) can raise them."""

from __future__ import annotations

import functools
import inspect
import os
from typing import Callable, Optional

from dbspec.errors import DbspecError

NOT_FOUND_CODES = ("RESOURCE_DOES_NOT_EXIST", "NOT_FOUND")  # "no such model, version, alias"
PERMISSION_CODES = ("PERMISSION_DENIED", "UNAUTHENTICATED")
ASK_ADMIN = "ask an admin (roles.admin) to grant it (dbspec grant SPEC)"


class RegistryError(DbspecError):
    """A registry operation cannot be done (unknown model, version or alias)."""


class RegistryUnavailable(RegistryError):
    """The registry answered with an error, not with an answer: nothing is known, so nothing
    may be decided on it (a gate fails, an alias stays where it is)."""


class RegistryPermissionError(RegistryUnavailable):
    """The tracking server refused the caller (403, or 401: no valid login); nothing changed.

    A :class:`RegistryUnavailable`, so a refusal still reads as "nothing is known" (a gate
    fails closed).

    Attributes:
        user: The caller (``MLFLOW_TRACKING_USERNAME``), None when not logged in.
        action: What was refused, e.g. "move @production of diabetes".
        needs: The permission it takes, e.g. "EDIT or MANAGE on the registered model".
    """

    def __init__(self, message: str, *, user: Optional[str], action: str, needs: str):
        super().__init__(message)
        self.user, self.action, self.needs = user, action, needs


def is_not_found(exc: BaseException) -> bool:
    """Whether an MLflow error is the registry's confirmed "no such thing"."""
    return getattr(exc, "error_code", None) in NOT_FOUND_CODES


def is_permission_denied(exc: BaseException) -> bool:
    """Whether an MLflow error is a server's refusal of the caller (403 or 401)."""
    return getattr(exc, "error_code", None) in PERMISSION_CODES


def from_registry(exc: BaseException) -> bool:
    """An error from the registry or the way to it: one with MLflow's ``error_code`` (MLflow's
    own, or serving's SQLite reader's), or a failed connection; anything else is a bug here."""
    return isinstance(getattr(exc, "error_code", None), str) or isinstance(exc, OSError)


def unavailable(exc: BaseException, what: str) -> RegistryUnavailable:
    """A one-line :class:`RegistryUnavailable` for a failed read or write of ``what``.

    It starts "the registry did not answer", which callers show as a failure rather than as
    the registry's answer; a refusal of the caller (403/401) is a
    :class:`RegistryPermissionError` instead.
    """
    if is_permission_denied(exc):
        return denied(exc, f"read {what}", "READ on it")
    return RegistryUnavailable(f"the registry did not answer ({what}): {first_line(exc)}")


def first_line(exc: BaseException) -> str:
    """The first line of an error's message."""
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


def refused(action: str, needs: str, *, unauthenticated: bool = False,
            user: Optional[str] = None, hint: str = ASK_ADMIN) -> RegistryPermissionError:
    """The error for a refused ``action``: who, what, which permission, what to do next."""
    user = user or os.environ.get("MLFLOW_TRACKING_USERNAME") or None
    if user is None:
        text = (f"the tracking server requires a login to {action}: set "
                "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD")
    elif unauthenticated:
        text = (f"the tracking server did not accept the login of {user} to {action}: check "
                "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD")
    else:
        text = f"{user} may not {action}: needs {needs}; {hint}"
    return RegistryPermissionError(text, user=user, action=action, needs=needs)


def denied(exc: BaseException, action: str, needs: str) -> RegistryPermissionError:
    """:func:`refused` for an MLflow error that :func:`is_permission_denied` recognised."""
    return refused(action, needs,
                   unauthenticated=getattr(exc, "error_code", None) == "UNAUTHENTICATED")


def refusals_said_as(action: str, needs: str) -> Callable[[Callable], Callable]:
    """Decorator: a server's refusal (403/401) of any call inside becomes :func:`denied` for
    ``action``, formatted with the call's arguments (``"move @{alias} of {name}"``); a
    :class:`RegistryPermissionError` raised deeper keeps its own, narrower action."""
    def wrap(function: Callable) -> Callable:
        signature = inspect.signature(function)

        @functools.wraps(function)
        def wrapped(*args, **kwargs):
            try:
                return function(*args, **kwargs)
            except RegistryPermissionError:
                raise
            except Exception as exc:
                if not is_permission_denied(exc):
                    raise
                arguments = signature.bind(*args, **kwargs).arguments
                raise denied(exc, action.format(**arguments), needs) from None
        return wrapped
    return wrap
