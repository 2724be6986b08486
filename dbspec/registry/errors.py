"""The registry's errors, apart so that every registry module (the lock too) can raise them."""

from __future__ import annotations

from dbspec.errors import DbspecError

#: Error codes with which a registry says "there is no such thing" (a model, version, alias).
NOT_FOUND_CODES = ("RESOURCE_DOES_NOT_EXIST", "NOT_FOUND")


class RegistryError(DbspecError):
    """A registry operation cannot be done (unknown model, version or alias)."""


class RegistryUnavailable(RegistryError):
    """The registry answered with an error, not with an answer: nothing is known, so nothing
    may be decided on it (a gate fails, an alias stays where it is)."""


def is_not_found(exc: BaseException) -> bool:
    """Whether an MLflow error is the registry's confirmed "no such thing"."""
    return getattr(exc, "error_code", None) in NOT_FOUND_CODES


def unavailable(exc: BaseException, what: str) -> RegistryUnavailable:
    """A :class:`RegistryUnavailable` for a failed read or write of ``what``, one line long.

    The message starts with "the registry did not answer", which callers show as a failure
    rather than as the registry's answer.
    """
    text = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
    return RegistryUnavailable(f"the registry did not answer ({what}): {text}")


def from_registry(exc: BaseException) -> bool:
    """An error from the registry or the way to it: one with MLflow's ``error_code`` (MLflow's
    own, or serving's SQLite reader's), or a failed connection; anything else is a bug here."""
    return isinstance(getattr(exc, "error_code", None), str) or isinstance(exc, OSError)
