"""Shared pieces of the spec models: the closed, frozen base model and one-key entries."""

import functools
import typing
from typing import Annotated, Any, ClassVar, Iterable, Literal, Union

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    model_serializer,
    model_validator,
)


class BooleanText(str):
    """A YAML boolean given to a number field, which the field then refuses: pydantic's lax mode
    would read ``linear: {out: true}`` as a one-unit layer."""


class SpecModel(BaseModel):
    """Base of every spec section: unknown keys are errors and specs are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=False, defer_build=True,
                              allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _no_boolean_numbers(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        keys = _number_keys(cls)
        return {key: BooleanText(str(value).lower()) if isinstance(value, bool) and key in keys
                else value for key, value in data.items()}


@functools.cache
def _number_keys(model: type[BaseModel]) -> frozenset[str]:
    """The keys (names and aliases) of ``model``'s fields that take numbers and nothing else."""
    return frozenset(key for name, field in model.model_fields.items()
                     if _numbers_only(field.annotation) for key in (name, field.alias) if key)


def _numbers_only(annotation: Any) -> bool:
    """Whether a field's type takes numbers and nothing else (``int``, ``Optional[float]``)."""
    options = [option for option in type_members([annotation]) if option is not type(None)]
    return bool(options) and all(option in (int, float) for option in options)


def type_members(types: Iterable[Any]) -> list[Any]:
    """The member types of ``types``, with Annotated, Optional and Union unwrapped."""
    out: list[Any] = []
    stack = list(types)
    while stack:
        tp = stack.pop()
        origin = typing.get_origin(tp)
        if origin is Annotated:
            stack.append(typing.get_args(tp)[0])
        elif origin is Union or (origin is not None and str(origin) == "types.UnionType"):
            stack.extend(typing.get_args(tp))
        else:
            out.append(tp)
    return out


def d(text: str, **kwargs: Any) -> Any:
    """A field with a description (every field has one: it becomes editor help)."""
    return Field(description=text, **kwargs)


def section(text: str, **written: Any) -> Any:
    """A sub-section a spec may leave out: then it holds what ``{**written}`` validates to
    (``{}``: every default; ``kind="local"``: the selector of a union).

    The default is validated by the enclosing model's validator, not built by a
    ``default_factory`` calling the section's class: models are built lazily
    (``defer_build``), so a factory made each left-out section build a second validator of
    its own, about a tenth of a cold ``dbspec validate``.
    """
    return Field(description=text, default=written, validate_default=True)


class OneKeyModel(SpecModel):
    """A mapping with exactly one key that names the entry: ``- linear: {out: 8}``.

    Subclasses declare one optional field per key. ``- relu`` and ``- relu: null`` mean
    ``- relu: {}``. Serialises back to the one key.
    """

    #: The word messages use for one entry ("layer", "preprocessing step").
    entry_word: ClassVar[str] = "entry"

    @model_validator(mode="after")
    def _exactly_one_key(self) -> Any:
        keys = [k for k in type(self).model_fields if getattr(self, k) is not None]
        if len(keys) != 1:
            raise ValueError(f"each {self.entry_word} is one key with its settings, like "
                             f"'- {next(iter(type(self).model_fields))}: {{...}}'; found "
                             f"{len(keys)} keys: {', '.join(keys) or 'none'}")
        return self

    @model_serializer(mode="wrap")
    def _only_the_key(self, handler: Any) -> Any:
        data = handler(self)
        return {k: v for k, v in data.items() if v is not None} if isinstance(data, dict) else data

    @property
    def key(self) -> str:
        """Which entry this is (``linear``, ``standard_scale``...)."""
        return next(k for k in type(self).model_fields if getattr(self, k) is not None)

    @property
    def args(self) -> Any:
        """The settings of the entry."""
        return getattr(self, self.key)


def _expand_bare(value: Any) -> Any:
    """``relu`` and ``{relu: null}`` both mean ``{relu: {}}``."""
    if isinstance(value, str):
        return {value: {}}
    if isinstance(value, dict):
        return {k: ({} if v is None else v) for k, v in value.items()}
    return value


def one_key_entry(model: type[OneKeyModel], bare: list[str]) -> Any:
    """The list-item type for ``model``: the mapping, or one of the ``bare`` names alone."""
    bare_type = Literal[tuple(bare)]  # type: ignore[valid-type]
    return Annotated[model, BeforeValidator(_expand_bare,
                                            json_schema_input_type=Union[model, bare_type])]


def shorthand(model: Any, field_name: str, alone: Any = None) -> BeforeValidator:
    """Let ``model`` (annotated with this) be written as its field ``field_name`` alone:
    ``pruner: median``.

    The schema admits both spellings (``alone``: the field's own type); the model always holds
    the full form.
    """

    def expand(value: Any) -> Any:
        return value if isinstance(value, (dict, BaseModel)) else {field_name: value}

    alone = alone or model.model_fields[field_name].annotation
    return BeforeValidator(expand, json_schema_input_type=Union[model, alone])
