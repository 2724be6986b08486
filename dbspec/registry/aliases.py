"""The one lookup of an alias's holder: dbspec's promotions and its serving both use it."""

from __future__ import annotations

from typing import Any, Optional

from dbspec.registry.errors import from_registry, is_not_found, unavailable


def alias_holder(client: Any, name: str, alias: str) -> Optional[Any]:
    """The model version holding ``alias`` of registered model ``name``.

    None only when the registry confirms nothing holds it: "not found" (no such alias or
    model), or, as MLflow's SQL stores say of an unset alias, an invalid-parameter error that a
    read of the model confirms.

    Args:
        client: An ``mlflow.MlflowClient``, or anything with its two reads whose errors carry
            MLflow's ``error_code`` (serving's SQLite reader): errors are told apart by it.

    Raises:
        RegistryUnavailable: any other error (5xx, no connection, a refusal): never "no holder".
    """
    what = f"@{alias} of '{name}'"
    try:
        return client.get_model_version_by_alias(name, alias)
    except Exception as exc:
        if not from_registry(exc):
            raise  # a bug here, not an answer
        if is_not_found(exc):
            return None
        if getattr(exc, "error_code", None) != "INVALID_PARAMETER_VALUE":
            raise unavailable(exc, what) from None
        first = exc
    try:  # an unset alias, or a request the registry found invalid? The model's aliases say
        model = client.get_registered_model(name)
    except Exception as exc:
        if not from_registry(exc):
            raise
        if is_not_found(exc):
            return None
        raise unavailable(exc, what) from None
    if alias in (model.aliases or {}):
        raise unavailable(first, what)  # it is set, yet the lookup failed
    return None


