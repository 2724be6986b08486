"""pydantic validation errors turned into located, actionable diagnostics.

pydantic reports locations with its own union member labels in them and words its messages for
Python programmers; this module maps each error back to the place in the YAML file, merges the
per-member errors of one union value into one message, and says what to write instead.
"""

from __future__ import annotations

import re
import typing
from typing import Any, Optional

from pydantic import BaseModel, ValidationError

from dbspec.errors import Diagnostic, did_you_mean, one_of
from dbspec.spec.document import Document, Node
from dbspec.spec.kinds import failed_kind_message
from dbspec.spec.sections.base import BooleanText, OneKeyModel, type_members

_QUOTED = re.compile(r"'([^']*)'")
_TYPE_WORDS = {
    "int_type": "an integer", "int_parsing": "an integer", "int_from_float": "a whole number",
    "float_type": "a number", "float_parsing": "a number", "finite_number": "a finite number",
    "bool_type": "true or false", "bool_parsing": "true or false", "string_type": "a string",
    "list_type": "a list", "dict_type": "a mapping", "model_type": "a mapping",
    "model_attributes_type": "a mapping", "tuple_type": "a list",
}
#: Names pydantic gives union members and wrappers in error locations.
_LABELS = {"int", "float", "bool", "str", "list", "dict", "tuple", "none", "literal",
           "constrained-int", "constrained-float", "constrained-str", "is-instance"}
_BOUND_SIGNS = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<",
                "less_than_equal": "<="}
#: Keras's and PyTorch's names of the losses, which did-you-mean alone gets wrong
#: (``binary_crossentropy`` is closest in spelling to ``cross_entropy``, not ``bce``).
_OTHER_NAMES = {
    "binary_crossentropy": "bce", "binary_cross_entropy": "bce", "bcewithlogitsloss": "bce",
    "bceloss": "bce", "categorical_crossentropy": "cross_entropy",
    "sparse_categorical_crossentropy": "cross_entropy", "crossentropyloss": "cross_entropy",
    "crossentropy": "cross_entropy", "mean_squared_error": "mse", "mseloss": "mse",
    "mean_absolute_error": "mae", "l1loss": "mae", "l1": "mae", "huberloss": "huber",
    "smoothl1loss": "smooth_l1", "nllloss": "nll",
}
_YAML_BOOLEANS = "YAML reads yes/no/on/off/true/false as booleans; quote the value"
_SHOW_LIMIT = 60


def translate(exc: ValidationError, document: Document, root: type[BaseModel]) -> list[Diagnostic]:
    """Diagnostics for every pydantic error: positioned, merged per value, rewritten."""
    groups: dict[tuple, list[dict]] = {}
    for details in exc.errors(include_url=False):
        error: dict[str, Any] = dict(details)  # pydantic's TypedDict, as the plain dict the helpers take
        loc = _clean_loc(error["loc"], document)
        discriminator = str((error.get("ctx") or {}).get("discriminator", ""))
        if error["type"] == "union_tag_invalid" and "()" not in discriminator:
            loc += (discriminator.strip("'"),)  # point at the value of `kind:` / `name:`
        groups.setdefault(loc, []).append(error)
    # a value that fits no member of a union: drop the "wrong type" complaint of the members
    # it was not meant for when another member reports something more specific deeper down
    deeper = {loc[:n] for loc in groups for n in range(len(loc))}
    groups = {loc: errors for loc, errors in groups.items()
              if not (loc in deeper and all(e["type"] in _TYPE_WORDS for e in errors))}
    # a mapping without its selector key (``{name: city}`` for a typed feature) in a union
    # that also takes a plain value: the missing key is the news, not "expected a string"
    for loc, errors in groups.items():
        if any(e["type"] == "union_tag_not_found" for e in errors):
            groups[loc] = [e for e in errors if e["type"] not in _TYPE_WORDS]
    out: list[Diagnostic] = []
    for loc, errors in groups.items():
        if len(errors) > 1 and all(_is_simple(e) for e in errors):
            out.append(document.diagnostic(loc, _merged(errors)))
            continue
        seen = set()
        for error in errors:
            message, at_key = _message(error, loc, root, document)
            at_key = at_key or error["loc"][-1:] == ("[key]",)  # the key itself is wrong
            if message not in seen:
                seen.add(message)
                out.append(document.diagnostic(loc, message, at_key=at_key))
    return out


def unknown_keys(exc: ValidationError, document: Document) -> Optional[list[tuple]]:
    """Where the unknown keys are in ``document``, when they are all that is wrong; else None."""
    errors = exc.errors(include_url=False)
    if any(error["type"] != "extra_forbidden" for error in errors):
        return None
    return [_clean_loc(error["loc"], document) for error in errors]


def _clean_loc(loc: tuple, document: Document) -> tuple:
    """Keep the elements that are keys or indexes of the document (or a missing last key)."""
    cleaned: list[Any] = []
    node: Optional[Node] = document.root
    for i, element in enumerate(loc):
        child = node.child(element) if node is not None else None
        if child is not None:
            node = child
        elif i < len(loc) - 1 or _is_label(element) or (cleaned and element == cleaned[-1]):
            continue  # a union member's tag or pydantic's label for it
        cleaned.append(element)
    return tuple(cleaned)


def _is_label(element: Any) -> bool:
    return isinstance(element, str) and ("[" in element or element.startswith("function-")
                                         or element in _LABELS)


def _is_simple(error: dict) -> bool:
    return error["type"] in _TYPE_WORDS or error["type"] in _BOUND_SIGNS or \
        error["type"] == "literal_error"


def _expectation(error: dict) -> str:
    if error["type"] in _TYPE_WORDS:
        return _TYPE_WORDS[error["type"]]
    if error["type"] == "literal_error":
        return one_of(_choices(error))
    if error["type"] in _BOUND_SIGNS:
        ctx = error.get("ctx") or {}
        limit = next((v for k, v in ctx.items() if k in ("gt", "ge", "lt", "le")), "?")
        return f"a number {_BOUND_SIGNS[error['type']]} {limit}"
    return error["msg"].removeprefix("Input should be ")


def _merged(errors: list[dict]) -> str:
    """One message for a value that fits none of a union's members."""
    expected: list[str] = []
    for error in errors:
        if (text := _expectation(error)) not in expected:
            expected.append(text)
    value = errors[0].get("input")
    hint = f" ({_YAML_BOOLEANS})" if isinstance(value, bool) else ""
    return f"expected {' or '.join(expected)}, got {_show(value)}{hint}"


def _choices(error: dict) -> list[str]:
    expected = str((error.get("ctx") or {}).get("expected", ""))
    quoted = _QUOTED.findall(expected)
    return quoted or [c for c in re.split(r",\s*|\s+or\s+", expected) if c]


def _message(error: dict, loc: tuple, root: type[BaseModel],
             document: Document) -> tuple[str, bool]:
    kind, ctx, value = error["type"], error.get("ctx") or {}, error.get("input")
    keyed = "()" in str(ctx.get("discriminator", ""))  # a one-key union such as a distribution
    if kind == "missing" and isinstance(loc[-1], int):
        return f"the list is too short: item {loc[-1] + 1} is missing", False
    if kind == "missing":
        return f"required key '{loc[-1]}' is missing", False
    if kind in ("too_short", "too_long"):
        limit = ctx.get("min_length" if kind == "too_short" else "max_length")
        bound = "at least" if kind == "too_short" else "at most"
        return f"needs {bound} {limit} item{'s' * (limit != 1)}, got {ctx.get('actual_length')}", \
            False
    if kind == "extra_forbidden":
        return _unknown_key(loc, root, document), True
    if kind == "literal_error":
        return _literal_message(error, loc, value), False
    if kind == "union_tag_invalid":
        return _unknown_kind(ctx, loc), False
    if kind == "union_tag_not_found" and not keyed:
        field = str(ctx.get("discriminator", "")).strip("'")
        return f"required key '{field}' is missing (it selects the kind of this section)", False
    if kind in ("model_type", "dict_type"):
        entries = [m for m in models_at(root, loc) if issubclass(m, OneKeyModel)]
        if entries:
            word = entries[0].entry_word
            return (f"each {word} is one key with its settings, like '- linear: {{out: 8}}' or "
                    f"'- relu'; found {_show(value)}"), False
    # pydantic took the boolean as 0 or 1, or the number field refused it (SpecModel)
    if isinstance(value, BooleanText) or (isinstance(value, bool) and (
            kind in _BOUND_SIGNS or kind == "multiple_of")):
        return f"expected a number, not the boolean {str(value).lower()}", False
    if kind in _TYPE_WORDS:
        hint = f" ({_YAML_BOOLEANS})" if isinstance(value, bool) else ""
        return f"expected {_TYPE_WORDS[kind]}, got {_show(value)}{hint}", False
    if kind in ("value_error", "assertion_error"):
        return str(ctx.get("error", error["msg"])).removeprefix("Value error, "), False
    if kind == "string_pattern_mismatch":
        rule = _PATTERN_WORDS.get(str(loc[-1]), f"it must match {ctx.get('pattern')}")
        return f"{_show(value)} is not allowed here: {rule}", False
    return _reworded(error, kind, value), False


def _literal_message(error: dict, loc: tuple, value: Any) -> str:
    """A value that is none of the allowed ones."""
    choices = _choices(error)
    if str(value) in choices and not isinstance(value, bool):
        return f"{_show(value)} is a string here; write {value} without quotes"
    hint = f" ({_YAML_BOOLEANS})" if isinstance(value, bool) else ""
    known = _OTHER_NAMES.get(str(value).lower().replace("-", "_")) \
        if loc and loc[-1] == "loss" else None
    if known in choices:  # another library's name for one of ours
        return (f"unknown value {_show(value)}: dbspec calls this loss '{known}'; expected "
                f"{one_of(choices)}")
    return f"unknown value {_show(value)}{_suggest(str(value), choices)}{hint}"


def _reworded(error: dict, kind: str, value: Any) -> str:
    """pydantic's own message, in the house's words."""
    msg = error["msg"]
    if kind == "distribution_kind":
        return msg
    msg = msg.replace("Input should be", "must be").replace("List should", "the list should")
    if value is not None and not isinstance(value, (dict, list)):
        msg += f", got {_show(value)}"
    return msg[0].lower() + msg[1:]


_PATTERN_WORDS = {
    "name": "use letters, digits, '.', '_' and '-', starting with a letter or digit",
    "class": "write 'package.module:ClassName'",
    "metric": "write the split and the metric, e.g. test_rmse or val_accuracy",
    "alias": "use letters, digits, '_' and '-', starting with a letter",
    "model_alias": "use letters, digits, '_' and '-', starting with a letter",
    "table": "write catalog.schema.table (or schema.table, or table)",
    "token_env": "write an environment variable name, e.g. DBSPEC_TOKEN",
}


def _unknown_key(loc: tuple, root: type[BaseModel], document: Document) -> str:
    key = str(loc[-1])
    models = models_at(root, loc[:-1])
    entries = [m for m in models if issubclass(m, OneKeyModel)]
    if entries:
        names = [f.alias or n for n, f in entries[0].model_fields.items()]
        return f"unknown {entries[0].entry_word} '{key}'{_suggest(key, names)}"
    _, node, found = document.locate(loc[:-1])
    selected = _selected_member(models, node.value if found else None)
    allowed = sorted({f.alias or n for m in selected for n, f in m.model_fields.items()})
    if len(selected) < len(models) and any(key in _keys(m) for m in models):
        selector = next(s for s in ("kind", "name") if isinstance(node.value.get(s), Node))
        return (f"'{key}' is not a setting of {selector} '{node.value[selector].value}'; it has: "
                f"{', '.join(allowed)}")
    hint = did_you_mean(key, allowed)
    listing = f"; allowed here: {', '.join(allowed)}" if allowed and not hint else ""
    return f"unknown key '{key}'{hint}{listing}"


def _keys(model: type[BaseModel]) -> set[str]:
    return {f.alias or n for n, f in model.model_fields.items()}


def select_members(models: list[type[BaseModel]], selector: str,
                   value: Any) -> list[type[BaseModel]]:
    """The models whose ``selector`` field (``kind``, ``name``) takes ``value``."""
    return [m for m in models if selector in m.model_fields
            and value in typing.get_args(m.model_fields[selector].annotation)]


def _selected_member(models: list[type[BaseModel]], mapping: Any) -> list[type[BaseModel]]:
    """The union members whose ``kind``/``name`` literal matches the written one."""
    if len(models) < 2 or not isinstance(mapping, dict):
        return models
    for selector in ("kind", "name"):
        written = mapping.get(selector)
        if isinstance(written, Node):
            chosen = select_members(models, selector, written.value)
            if chosen:
                return chosen
    return models


def _suggest(word: str, choices: list[str]) -> str:
    """A did-you-mean, and the choices unless a suggestion stands in for a long list."""
    hint = did_you_mean(word, choices)
    if hint and len(choices) > 6:
        return hint
    return f"{hint}; expected {one_of(choices)}"


def _show(value: Any) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return "true" if value else "false"
    text = repr(value)
    return text if len(text) <= _SHOW_LIMIT else text[:_SHOW_LIMIT - 5] + "...'"


def models_at(root: type[BaseModel], loc: tuple) -> list[type[BaseModel]]:
    """The model classes that may stand at ``loc``, found by walking the annotations."""
    candidates: list[Any] = [root]
    for element in loc:
        following: list[Any] = []
        for tp in type_members(candidates):
            if isinstance(tp, type) and issubclass(tp, BaseModel):
                for name, field in tp.model_fields.items():
                    if element in (name, field.alias):
                        following.append(field.annotation)
            elif typing.get_origin(tp) in (list, tuple) and isinstance(element, int):
                following.extend(typing.get_args(tp)[:1])
            elif typing.get_origin(tp) is dict:
                following.extend(typing.get_args(tp)[1:2])
        candidates = following
    return [tp for tp in type_members(candidates)
            if isinstance(tp, type) and issubclass(tp, BaseModel)]


def _unknown_kind(ctx: dict, loc: tuple) -> str:
    """``unknown compute kind 'x' (did you mean 'y'?)``, or why an installed plugin's kind of
    that name did not load."""
    tag = str(ctx.get("tag"))
    failed = failed_kind_message(tag)
    if failed is not None:
        return failed
    choices = _QUOTED.findall(ctx.get("expected_tags", ""))
    field = str(ctx.get("discriminator", "")).strip("'")
    section = str(loc[-2]) if len(loc) >= 2 and not isinstance(loc[-2], int) else ""
    what = f"{section} {field}".strip() if field == "kind" or not section else section
    return f"unknown {what} {_show(ctx.get('tag'))}{_suggest(tag, choices)}"


__all__ = ["translate", "models_at", "unknown_keys"]

