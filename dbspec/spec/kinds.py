"""Spec unions built from a seam's registry: the installed kinds are what a spec may name."""

from __future__ import annotations

from typing import Annotated, Any, Union

from pydantic import Field

from dbspec.plugins import KindRegistry


def kind_union(registry: KindRegistry[Any], attribute: str = "model") -> Any:
    """The discriminated union (on ``kind``) of the spec models of every kind that imports.

    Args:
        registry: The seam's registry; each kind has its pydantic section at ``attribute``.
        attribute: Where a kind keeps its spec model.
    """
    models = tuple(getattr(kind, attribute) for kind in registry.load_all().values())
    if len(models) == 1:
        return models[0]
    return Annotated[Union[models], Field(discriminator="kind")]  # type: ignore[valid-type]
