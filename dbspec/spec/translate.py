"""pydantic validation errors turned into located, actionable diagnostics."""

from __future__ import annotations

import re
import typing
from typing import Any, Iterable

from pydantic import BaseModel, ValidationError

from dbspec.errors import Diagnostic, did_you_mean, one_of
from dbspec.spec.document import Document
from dbspec.spec.models.base import OneKeyModel

_QUOTED = re.compile(r"'([^']*)'")
_ENTRY_WORDS = {"layers": "layer", "preprocessing": "preprocessing step"}
_TYPE_WORDS = {
    "int_type": "an integer", "int_parsing": "an integer", "int_from_float": "a whole number",
    "float_type": "a number", "float_parsing": "a number", "bool_type": "true or false",
    "bool_parsing": "true or false", "string_type": "a string", "list_type": "a list",
    "dict_type": "a mapping", "model_type": "a mapping", "model_attributes_type": "a mapping",
    "tuple_type": "a list",
}


def translate(exc: ValidationError, document: Document, root: type[BaseModel]) -> list[Diagnostic]:
    """One diagnostic per pydantic error, positioned in the document, messages rewritten."""
    out: list[Diagnostic] = []
    seen: set[tuple] = set()
    for error in exc.errors(include_url=False):
        loc = _clean_loc(error["loc"], document)
        discriminator = str((error.get("ctx") or {}).get("discriminator", ""))
        if error["type"] == "union_tag_invalid" and "()" not in discriminator:
            loc += (discriminator.strip("'"),)  # point at the value of `kind:` / `name:`
        message, at_key = _message(error, loc, root)
        key = (loc, message)
        if key in seen:
            continue
        seen.add(key)
        out.append(document.diagnostic(loc, message, at_key=at_key))
    return out


def _clean_loc(loc: tuple, document: Document) -> tuple:
    """Drop the union tags pydantic puts in locations (``compute.deepspeed.zero_stage``).

    An element is a tag when the document has no such key at that place but has the next one.
    """
    cleaned: list[Any] = []
    node = document.root
    for i, element in enumerate(loc):
        value = node.value if node is not None else None
        if isinstance(value, dict) and element in value:
            node = value[element]
        elif isinstance(value, list) and isinstance(element, int) and element < len(value):
            node = value[element]
        elif isinstance(value, dict) and i + 1 < len(loc) and loc[i + 1] in value:
            continue  # a tag
        elif isinstance(element, str) and ("[" in element or element.startswith("function-")):
            continue  # pydantic's names for union members and validator wrappers
        else:
            node = None
        cleaned.append(element)
    return tuple(cleaned)


def _message(error: dict, loc: tuple, root: type[BaseModel]) -> tuple[str, bool]:
    kind, ctx, value = error["type"], error.get("ctx") or {}, error.get("input")
    if kind == "missing":
        return f"required key '{loc[-1]}' is missing", False
    if kind == "extra_forbidden":
        models = models_at(root, loc[:-1])
        allowed = sorted({f.alias or n for m in models for n, f in m.model_fields.items()})
        words = {m.entry_word for m in models if issubclass(m, OneKeyModel)}
        if words:
            what = words.pop()
            return f"unknown {what} '{loc[-1]}'{_suggest(str(loc[-1]), allowed)}", True
        hint = did_you_mean(str(loc[-1]), allowed)
        listing = f"; allowed here: {', '.join(allowed)}" if allowed and not hint else ""
        return f"unknown key '{loc[-1]}'{hint}{listing}", True
    if kind == "literal_error":
        choices = _QUOTED.findall(ctx.get("expected", "")) or \
            re.findall(r"[\w\-]+", ctx.get("expected", ""))
        return f"unknown value {_show(value)}{_suggest(str(value), choices)}", False
    keyed = "()" in str(ctx.get("discriminator", ""))  # a single-key union, e.g. a layer
    if kind == "union_tag_invalid":
        choices = _QUOTED.findall(ctx.get("expected_tags", ""))
        field = str(ctx.get("discriminator", "")).strip("'")
        if keyed:
            what = _ENTRY_WORDS.get(str(loc[-2]) if len(loc) >= 2 else "", "entry")
        else:
            section = str(loc[-2]) if len(loc) >= 2 else "section"
            what = f"{section} {field}" if field == "kind" else section
        return f"unknown {what} {_show(ctx.get('tag'))}{_suggest(str(ctx.get('tag')), choices)}", \
            False
    if kind == "union_tag_not_found" and keyed:
        what = _ENTRY_WORDS.get(str(loc[-2]) if len(loc) >= 2 else "", "entry")
        return (f"each {what} is one key with its settings, like '- linear: {{out: 8}}' or "
                f"'- relu'; found {_show(value)}"), False
    if kind == "union_tag_not_found":
        field = str(ctx.get("discriminator", "")).strip("'")
        return f"required key '{field}' is missing (it selects the kind of this section)", False
    if kind == "distribution_kind":
        return error["msg"], False
    if kind in _TYPE_WORDS:
        return f"expected {_TYPE_WORDS[kind]}, got {_show(value)}", False
    if kind == "value_error":
        return str(ctx.get("error", error["msg"])).removeprefix("Value error, "), False
    if kind == "string_pattern_mismatch":
        return f"{_show(value)} does not match the pattern {ctx.get('pattern')}", False
    msg = error["msg"]
    if value is not None and not isinstance(value, (dict, list)):
        msg += f", got {_show(value)}"
    return msg[0].lower() + msg[1:], False


def _suggest(word: str, choices: list[str]) -> str:
    """A did-you-mean, and the choices unless a suggestion stands in for a long list."""
    hint = did_you_mean(word, choices)
    if hint and len(choices) > 6:
        return hint
    return f"{hint}; expected {one_of(choices)}"


def _show(value: Any) -> str:
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "nothing (null)"
    return repr(value)


def models_at(root: type[BaseModel], loc: tuple) -> list[type[BaseModel]]:
    """The model classes that may stand at ``loc``, found by walking the annotations."""
    candidates: list[Any] = [root]
    for element in loc:
        following: list[Any] = []
        for tp in _expand(candidates):
            if isinstance(tp, type) and issubclass(tp, BaseModel):
                for name, field in tp.model_fields.items():
                    if element in (name, field.alias):
                        following.append(field.annotation)
            elif typing.get_origin(tp) in (list, tuple) and isinstance(element, int):
                following.extend(typing.get_args(tp)[:1])
            elif typing.get_origin(tp) is dict:
                following.extend(typing.get_args(tp)[1:2])
        candidates = following
    return [tp for tp in _expand(candidates) if isinstance(tp, type) and issubclass(tp, BaseModel)]


def _expand(types: Iterable[Any]) -> list[Any]:
    """Unwrap Annotated, Optional and Union into the member types."""
    out: list[Any] = []
    stack = list(types)
    while stack:
        tp = stack.pop()
        origin = typing.get_origin(tp)
        if origin is typing.Annotated:
            stack.append(typing.get_args(tp)[0])
        elif origin is typing.Union or (origin is not None and str(origin) == "types.UnionType"):
            stack.extend(typing.get_args(tp))
        else:
            out.append(tp)
    return out


__all__ = ["translate", "models_at"]
