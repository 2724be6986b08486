"""Templated spec values: variable substitution plus bounded arithmetic, in ``{{ ... }}``.

One whole ``{{ expression }}`` keeps its type (``"{{ hidden * 2 }}"`` gives an int); text around
expressions gives a string. An expression holds literals, lists, ``vars`` (``hidden`` or
``vars.hidden``), mapping keys, indexes, arithmetic and, after ``|``, :data:`FILTERS`; the
environment only as ``env.NAME`` / ``env['NAME']``, each value registered as a secret. Nothing
else (no statements, calls, methods or attributes), so a template cannot loop, and what could
build something large is checked before it runs.
"""

from __future__ import annotations

import ast
import functools
import operator
import os
import re
from typing import Any, Callable

from dbspec.errors import Diagnostic, SpecError, did_you_mean, register_secret
from dbspec.spec.document import Document, Node, format_path

#: Largest string, list or output a template may build.
MAX_TEMPLATE_SIZE = 100_000
#: Largest integer a template may compute, in bits (``(10**1000)**1000`` is refused).
MAX_INT_BITS = 100_000
#: ``{{ expression }}``; ``{{-`` / ``-}}`` also take the whitespace on their side.
_EXPRESSION = re.compile(r"(?:\s*\{\{-|\{\{)(.*?)(?:-\}\}\s*|\}\})", re.DOTALL)
_ENV_NAME = re.compile(r"\benv\s*(?:\.\s*|\[\s*['\"])([A-Za-z]\w*)")
_ENV_REFUSAL = ("the environment cannot be listed or used as a whole; name one variable: "
                "{{ env.NAME }} or {{ env.NAME | default('...') }}")
_OPERATORS: dict[type, Callable[..., Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
    ast.Pow: operator.pow, ast.USub: operator.neg, ast.UAdd: operator.pos}


class TemplateError(ValueError):
    """A template that cannot render; its message is the user-facing one."""


class _Undefined(TemplateError):
    """A name or environment variable without a value (the ``default`` filter catches it)."""


def _refuse(message: str) -> TemplateError:
    return TemplateError(f"template refused by the sandbox: {message}")


def is_template(value: Any) -> bool:
    """Whether a scalar is a template."""
    return isinstance(value, str) and any(m in value for m in ("{{", "{%", "{#"))


def _bound(size: int, what: str = "the result") -> None:
    if size > MAX_TEMPLATE_SIZE:
        raise _refuse(f"{what} would exceed {MAX_TEMPLATE_SIZE:,} characters or items")


def _size(value: Any) -> int:
    """Characters or items in ``value``, nested ones included; stops counting past the limit."""
    if isinstance(value, (str, bytes)):
        return len(value)
    items = list(value.items()) if isinstance(value, dict) else value
    total = len(items) if isinstance(items, (list, tuple)) else 0
    for item in items if total else ():
        if total > MAX_TEMPLATE_SIZE:
            break
        total += _size(item)
    return total


def _check_operation(kind: type, left: Any, right: Any) -> None:
    """Refuse ``left <kind> right`` before it runs when its result would be too large."""
    if kind is ast.Mod and isinstance(left, str):  # '%0999999999d' % 1: widths unbounded
        raise _refuse("'%' formatting of text is not offered in spec templates")
    if isinstance(left, int) and isinstance(right, int) and kind in (ast.Mult, ast.Pow):
        bits = abs(left).bit_length() * max(right, 0) if kind is ast.Pow else \
            abs(left).bit_length() + abs(right).bit_length()
        if bits > MAX_INT_BITS:
            raise _refuse(f"the result would exceed {MAX_INT_BITS:,} bits")
    elif kind is ast.Add and all(isinstance(v, (str, list)) for v in (left, right)):
        _bound(_size(left) + _size(right))
    elif kind is ast.Mult:  # a sequence repeated: its size (nested items included) times count
        count, sequence = (left, right) if isinstance(left, int) else (right, left)
        _bound(_size(sequence) * max(count, 0) if isinstance(count, int) else 0)


def _join(items: Any, separator: Any = "") -> str:
    items = list(items)
    _bound(_size(items) + len(items) * len(str(separator)))
    return str(separator).join(str(item) for item in items)


def _replace(text: Any, old: Any, new: Any) -> str:
    text, old, new = str(text), str(old), str(new)
    times = text.count(old) if old else len(text) + 1
    _bound(len(text) + times * max(len(new) - len(old), 0))
    return text.replace(old, new)


#: The filters (``value | name`` or ``value | name(arguments)``), besides ``default(value)``.
FILTERS: dict[str, Callable[..., Any]] = {
    "int": int, "float": float, "string": str, "length": len, "list": list, "min": min,
    "max": max, "sum": sum, "abs": abs, "round": round, "join": _join, "replace": _replace,
    "lower": str.lower, "upper": str.upper, "trim": str.strip}


@functools.lru_cache(maxsize=4096)
def _parse(source: str) -> ast.expr:
    """One expression's tree (specs repeat a few templates: each is parsed once)."""
    try:
        return ast.parse(f"(\n{source}\n)", mode="eval").body
    except SyntaxError as exc:
        raise TemplateError(f"template syntax error: {exc.msg}") from None


class _Scope:
    """Evaluates an expression's tree over the names it sees."""

    def __init__(self, names: dict[str, Any]) -> None:
        self.names = names

    def value(self, node: Any) -> Any:
        match node:
            case ast.Constant(value=value):
                return value
            case ast.Name(id=name):
                return self._name(name)
            case ast.Attribute(value=ast.Name(id="env"), attr=name):
                return _env_value(name)
            case ast.Subscript(value=ast.Name(id="env"), slice=ast.Constant(value=str(name))):
                return _env_value(name)
            case ast.Attribute(value=inner, attr=key):
                return _key(self.value(inner), key)
            case ast.Subscript(value=inner, slice=index):
                container, key = self.value(inner), self.value(index)
                return _key(container, key) if isinstance(container, dict) else container[key]
            case ast.Slice(lower=lower, upper=upper, step=step):
                return slice(*(part and self.value(part) for part in (lower, upper, step)))
            case ast.List(elts=items) | ast.Tuple(elts=items):
                return [self.value(item) for item in items]
        return self._operation(node)

    def _operation(self, node: ast.expr) -> Any:
        match node:
            case ast.BinOp(left=left, op=ast.BitOr(), right=right):
                return self._filter(left, right)
            case ast.BinOp(left=left, op=op, right=right) if type(op) in _OPERATORS:
                left, right = self.value(left), self.value(right)
                _check_operation(type(op), left, right)
                return _OPERATORS[type(op)](left, right)
            case ast.UnaryOp(op=op, operand=operand) if type(op) in _OPERATORS:
                return _OPERATORS[type(op)](self.value(operand))
            case ast.Call(func=ast.Attribute(value=ast.Name(id="env"))):
                raise _refuse(_ENV_REFUSAL)
        raise _refuse(f"{type(node).__name__} expressions are not offered in spec templates; "
                      "values have no attributes or methods")

    def _name(self, name: str) -> Any:
        if name == "vars":  # while vars render: those rendered so far
            return self.names.get("vars", self.names)
        if name == "env":
            raise _refuse(_ENV_REFUSAL)
        if name not in self.names:
            names = [k for k in self.names if k != "vars"]
            raise _Undefined(
                f"undefined name '{name}'{did_you_mean(name, names)}; names come from 'vars' "
                f"(defined so far: {', '.join(sorted(names)) or 'none'}; a var sees only the "
                f"vars above it), the environment from {{{{ env.NAME }}}}")
        return self.names[name]

    def _filter(self, left: ast.expr, right: ast.expr) -> Any:
        call = right if isinstance(right, ast.Call) else ast.Call(right, [], [])
        name = call.func.id if isinstance(call.func, ast.Name) else "?"
        if name == "default":
            try:
                return self.value(left)
            except _Undefined:
                return self.value(call.args[0]) if call.args else ""
        value, args = self.value(left), [self.value(arg) for arg in call.args]
        if name not in FILTERS:
            raise _refuse(f"no filter named '{name}' (offered: default, {', '.join(FILTERS)})")
        result = FILTERS[name](value, *args, **{str(k.arg): self.value(k.value)
                                                for k in call.keywords})
        _bound(_size(result))
        return result


def _key(mapping: Any, key: Any) -> Any:
    if not isinstance(mapping, dict):
        raise _refuse(f"'{key}' of a {type(mapping).__name__}: values have no attributes or methods")
    if key not in mapping:
        raise _Undefined(f"'{key}' is not a key of the mapping"
                         f"{did_you_mean(str(key), map(str, mapping))}")
    return mapping[key]


def _env_value(name: str) -> str:
    if not name.isidentifier() or name.startswith("_"):
        raise _refuse(_ENV_REFUSAL)
    value = os.environ.get(name)
    if value is None:
        raise _Undefined(f"environment variable '{name}' is not set; give a fallback with "
                         f"{{{{ env.{name} | default('...') }}}}")
    register_secret(value, f"{{{{ env.{name} }}}}")
    return value


def render_value(text: str, context: dict[str, Any]) -> Any:
    """Render one template string; see the module docstring for typing rules and limits.

    Raises:
        ValueError: with a user-facing message for syntax errors, undefined names, refused
            operations and exceeded limits.
    """
    scope, whole = _Scope(context), _EXPRESSION.fullmatch(text.strip())
    try:
        if "{%" in text or "{#" in text:
            raise _refuse("statements and comments ({% %}, {# #}) are not offered in spec "
                          "templates; write {{ expression }}")
        if whole and "}}" not in whole[1]:  # one expression: its value, typed
            result = scope.value(_parse(whole[1].strip()))
            _bound(_size(result), "the output")
            return result
        if "{{" in _EXPRESSION.sub("", text):
            raise TemplateError("template syntax error: '{{' without '}}'")
        sizes: list[int] = []

        def substitute(match: re.Match) -> str:
            sizes.append(len(value := str(scope.value(_parse(match[1].strip())))))
            _bound(sum(sizes), "the output")
            return value

        return _EXPRESSION.sub(substitute, text)
    except TemplateError:
        raise
    except (MemoryError, RecursionError) as exc:
        raise _refuse(f"it is too large or too deep ({type(exc).__name__})") from None
    except Exception as exc:  # a user's expression may raise anything (1/0, bad arguments)
        raise TemplateError(f"template failed: {type(exc).__name__}: {str(exc)[:200]}") from None


def _as_node(value: Any, at: Node) -> Node:
    """A rendered value as a node at ``at``'s place (rendered lists and mappings as nodes)."""
    if isinstance(value, dict):
        value = {str(k): _as_node(v, at) for k, v in value.items()}
    elif isinstance(value, (list, tuple)):
        value = [_as_node(v, at) for v in value]
    return Node(value, at.line, at.column, origin=at.origin)


def render_document(document: Document) -> Document:
    """Render every template in the document; report every failure at once.

    ``vars`` render first, in order, each seeing the vars above it; the rest of the spec sees all
    vars. A value rendered from the environment, directly or through a var, is registered as a
    secret shown as its template.

    Raises:
        SpecError: a template does not parse, names an undefined var, or fails.
    """
    if not any(is_template(node.value) for _, node in document.root.walk()):
        return document
    root, errors, tainted = document.root.copy(), [], set[str]()

    def render(node: Node, path: tuple, context: dict[str, Any]) -> bool:
        """Render the templates under ``node``; whether any of them read the environment."""
        if isinstance(node.value, (dict, list)):
            items = node.value.items() if isinstance(node.value, dict) else enumerate(node.value)
            return any([render(child, path + (key,), context) for key, child in items])
        text = node.value
        if not is_template(text):
            return False
        try:
            node.value = _as_node(render_value(text, context), node).value
        except ValueError as exc:
            errors.append(Diagnostic(document.file, node.line, node.column, format_path(path),
                                     str(exc), "error", node.origin))
            return False
        names = "|".join(re.escape(n) for n in (*tainted, "vars"))
        from_env = any(n in os.environ for n in _ENV_NAME.findall(text)) or \
            bool(tainted and re.search(rf"\b(?:{names})\b", text))  # over-approximated
        for inner, leaf in node.walk() if from_env else ():
            for shown in (*inner[-1:], leaf.value):  # keys of rendered mappings, then values
                register_secret(shown, text)
        return from_env

    own_vars = getattr(root.value.get("vars"), "value", None)
    rendered: dict[str, Any] = {}
    for key, child in own_vars.items() if isinstance(own_vars, dict) else ():
        if render(child, ("vars", key), dict(rendered)):
            tainted.add(key)
        rendered[key] = child.to_data()
    for key, child in root.value.items():
        if key not in ("vars", "targets"):  # targets are templated when they are merged in
            render(child, (key,), {**rendered, "vars": rendered})
    if errors:
        raise SpecError(errors)
    return Document(document.file, root, document.text)
