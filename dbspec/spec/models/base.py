"""Shared pieces of the spec models: the closed, frozen base model and single-key unions."""

from __future__ import annotations

from typing import Annotated, Any, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, Tag


class SpecModel(BaseModel):
    """Base of every spec section: unknown keys are errors and specs are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=False)


def d(text: str, **kwargs: Any) -> Any:
    """A field with a description (every field has one: it becomes editor help)."""
    return Field(description=text, **kwargs)


def _sole_key(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and len(value) == 1:
        return next(iter(value))
    if isinstance(value, BaseModel):
        return next(iter(type(value).model_fields))
    return None


def _expand_bare(value: Any) -> Any:
    """``relu`` and ``{relu: null}`` both mean ``{relu: {}}``."""
    if isinstance(value, str):
        return {value: {}}
    if isinstance(value, dict) and len(value) == 1:
        key, inner = next(iter(value.items()))
        if inner is None:
            return {key: {}}
    return value


def keyed_union(variants: dict[str, type[SpecModel]], bare: list[str]) -> Any:
    """A union of single-key mappings such as ``- linear: {out: 8}``, keyed by the key.

    Args:
        variants: key -> model whose only field is that key.
        bare: keys that may also be written alone as a string (``- relu``).
    """
    members = tuple(Annotated[model, Tag(key)] for key, model in variants.items())
    union = Annotated[Union[members], Discriminator(_sole_key)]  # type: ignore[valid-type]
    if bare:
        from typing import Literal

        bare_type = Literal[tuple(bare)]  # type: ignore[valid-type]
        return Annotated[union, BeforeValidator(_expand_bare,
                                                json_schema_input_type=Union[union, bare_type])]
    return Annotated[union, BeforeValidator(_expand_bare)]


def shorthand(field_name: str, shorthand_type: Any):
    """Let a section be written as its main value alone: ``pruner: median``.

    The schema admits both spellings; the model always holds the full form.
    """

    def expand(value: Any) -> Any:
        if isinstance(value, dict) or isinstance(value, BaseModel):
            return value
        return {field_name: value}

    def wrap(model: type[SpecModel]) -> Any:
        return Annotated[model, BeforeValidator(
            expand, json_schema_input_type=Union[model, shorthand_type])]

    return wrap
