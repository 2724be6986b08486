"""Spec unions built from a seam's registry: the installed kinds are what a spec may name."""

from __future__ import annotations

from typing import Annotated, Any, Optional, Union

from pydantic import Field

from dbspec.plugins import KindRegistry

#: The registries whose kinds make up a spec union (for the messages of kinds that failed).
_UNION_REGISTRIES: list[KindRegistry[Any]] = []


def kind_union(registry: KindRegistry[Any]) -> Any:
    """The discriminated union (on ``kind``) of the spec models (each kind's ``model``) of every
    kind in ``registry`` that imports."""
    if registry not in _UNION_REGISTRIES:
        _UNION_REGISTRIES.append(registry)
    models = tuple(kind.model for kind in registry.load_all().values())
    if not models:  # a broken install (or a copy of dbspec missing its kind modules)
        failed = "; ".join(f"{name}: {why}" for name, why in registry.failures().items())
        raise ImportError(f"no {registry.noun} of {registry.group!r} can be imported"
                          + (f" ({failed})" if failed else ""))
    if len(models) == 1:
        return models[0]
    return Annotated[Union[models], Field(discriminator="kind")]


def failed_kind_message(name: str) -> Optional[str]:
    """Why the kind ``name`` is missing from a spec union: its plugin failed to import (the
    plugin and its error); None when no union's registry knows a failed kind of that name."""
    for registry in _UNION_REGISTRIES:
        if name in registry.failures():
            return registry.failure_message(name)
    return None
