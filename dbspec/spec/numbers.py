"""Booleans where a spec wants a number.

pydantic reads ``true`` as ``1`` for an ``int`` or ``float`` field (its lax mode), so
``linear: {out: true}`` would build a one-unit layer. A ``before`` validator on every field
cannot catch it (pydantic refuses one on discriminator fields), so the validated spec is
walked against the data it came from: a field whose type takes only numbers and whose given
value is a boolean is reported at that value.
"""

from __future__ import annotations

import functools
import typing
from typing import Any, Iterator, Union

from pydantic import BaseModel


def boolean_numbers(model: BaseModel, data: Any, path: tuple = ()) -> Iterator[tuple[tuple, bool]]:
    """``(path, value)`` for every boolean given to a numbers-only field under ``model``."""
    if not isinstance(data, dict):
        return
    fields = type(model).model_fields
    for key, raw in data.items():
        name = _field_name(fields, key)
        if name is None:
            continue
        where = (*path, key)
        if isinstance(raw, bool):
            annotation: Any = fields[name].annotation  # a type or a typing form
            if annotation is not None and _numbers_only(annotation):
                yield where, raw
            continue
        yield from _walk(getattr(model, name, None), raw, where)


def _walk(value: Any, raw: Any, path: tuple) -> Iterator[tuple[tuple, bool]]:
    if isinstance(value, BaseModel):
        yield from boolean_numbers(value, raw, path)
    elif isinstance(value, (list, tuple)) and isinstance(raw, list):
        for index, (item, raw_item) in enumerate(zip(value, raw)):
            yield from _walk(item, raw_item, (*path, index))
    elif isinstance(value, dict) and isinstance(raw, dict):
        for key, item in value.items():
            if key in raw:
                yield from _walk(item, raw[key], (*path, key))


def _field_name(fields: dict[str, Any], key: Any) -> Any:
    if key in fields:
        return key
    return next((name for name, field in fields.items() if field.alias == key), None)


@functools.lru_cache(maxsize=None)
def _numbers_only(annotation: Any) -> bool:
    """Whether a field's type takes numbers and nothing else (``int``, ``Optional[float]``)."""
    options = _options(annotation)
    return bool(options) and all(option in (int, float) for option in options)


def _options(annotation: Any) -> tuple:
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    if typing.get_origin(annotation) is Union:
        return tuple(option for member in typing.get_args(annotation)
                     for option in _options(member) if option is not type(None))
    return (annotation,)
