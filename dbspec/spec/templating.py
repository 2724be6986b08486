"""Sandboxed jinja2 templating of spec values.

Templates live inside YAML string values (``out: "{{ hidden }}"``), never around the YAML
structure, so every rendered value keeps its line and column. A value that is one whole
``{{ expression }}`` keeps the expression's type (``"{{ hidden * 2 }}"`` gives an int); other
templates render to strings. Names come from ``vars``; the environment is reachable only as
``{{ env.NAME }}``. jinja2 is imported only when a spec uses a template.
"""

from __future__ import annotations

import functools
import os
import re
from typing import Any, Optional

from dbspec.errors import Diagnostic, SpecError, did_you_mean
from dbspec.spec.document import Document, Node

_WHOLE_EXPRESSION = re.compile(r"^\s*\{\{-?(?P<expr>(?:(?!-?\}\}).)*)-?\}\}\s*$", re.DOTALL)
_MARKERS = ("{{", "{%", "{#")
#: ``{{ name }}`` / ``{{ vars.name }}`` / ``{{ env.NAME }}``: looked up directly, no jinja2 needed.
_PLAIN_NAME = re.compile(r"^\s*\{\{-?\s*([A-Za-z_]\w*)(?:\.([A-Za-z_]\w*))?\s*-?\}\}\s*$")
#: Largest string or list a template may build: specs are small, templates should be too.
MAX_TEMPLATE_SIZE = 100_000
_MISSING = object()


def is_template(value: Any) -> bool:
    """Whether a scalar is a jinja2 template."""
    return isinstance(value, str) and any(m in value for m in _MARKERS)


@functools.lru_cache(maxsize=1)
def _environment():
    from jinja2 import StrictUndefined
    from jinja2.exceptions import SecurityError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class BoundedEnvironment(ImmutableSandboxedEnvironment):
        """The sandbox, plus a size bound on ``*`` and ``**`` so a spec cannot eat memory."""

        intercepted_binops = frozenset(["*", "**"])

        def call_binop(self, context, operator, left, right):
            if operator == "**" and isinstance(right, (int, float)) and abs(right) > 1000:
                raise SecurityError(f"exponent {right} is too large for a spec template")
            if operator == "*":
                sized = [v for v in (left, right) if isinstance(v, (str, list, tuple))]
                counts = [v for v in (left, right) if isinstance(v, int)]
                if sized and counts and len(sized[0]) * counts[0] > MAX_TEMPLATE_SIZE:
                    raise SecurityError(f"the result would exceed {MAX_TEMPLATE_SIZE:,} items")
            return super().call_binop(context, operator, left, right)

    environment = BoundedEnvironment(undefined=StrictUndefined, autoescape=False)
    environment.globals.pop("lipsum", None)  # generates unbounded text; no use in a spec
    return environment


@functools.lru_cache(maxsize=4096)
def _compile(text: str):
    """Compile once per distinct template text: specs repeat the same few templates."""
    env = _environment()
    whole = _WHOLE_EXPRESSION.match(text)
    if whole and "{{" not in whole["expr"]:
        return True, env.compile_expression(whole["expr"], undefined_to_none=False)
    return False, env.from_string(text)


def render_value(text: str, context: dict[str, Any]) -> Any:
    """Render one template string; see the module docstring for typing rules.

    Raises:
        ValueError: with a user-facing message for syntax errors and undefined names.
    """
    plain = _PLAIN_NAME.match(text)
    if plain:
        value = _lookup(context, plain[1], plain[2])
        if value is not _MISSING:
            return value
    import jinja2

    try:
        native, compiled = _compile(text)
        if native:
            result = compiled(**context)
            if isinstance(result, jinja2.Undefined):
                result._fail_with_undefined_error()
        else:
            result = compiled.render(**context)
        if isinstance(result, (str, list, tuple, dict)) and len(result) > MAX_TEMPLATE_SIZE:
            raise ValueError(f"the template produced {len(result):,} items; the limit is "
                             f"{MAX_TEMPLATE_SIZE:,}")
        return result
    except jinja2.UndefinedError as exc:
        raise ValueError(_undefined_message(str(exc), context)) from None
    except jinja2.TemplateSyntaxError as exc:
        raise ValueError(f"template syntax error: {exc.message}") from None
    except jinja2.exceptions.SecurityError as exc:
        raise ValueError(f"template refused by the sandbox: {exc}") from None
    except ValueError:
        raise
    except Exception as exc:  # a user's expression may raise anything (1/0, bad filter args)
        raise ValueError(f"template failed: {type(exc).__name__}: {str(exc)[:200]}") from None


def _lookup(context: dict[str, Any], name: str, attribute: Optional[str]) -> Any:
    value = context.get(name, _MISSING)
    if attribute is None or value is _MISSING:
        return value
    if isinstance(value, dict) and attribute in value:
        return dict.__getitem__(value, attribute)  # not __missing__: jinja2 reports those
    return _MISSING


def _undefined_message(raw: str, context: dict[str, Any]) -> str:
    if raw.startswith("environment variable"):
        return raw
    name_missing = re.match(r"'([^']+)' is undefined", raw)
    if name_missing:
        name = name_missing.group(1)
        names = [k for k in context if k not in ("env", "vars")]
        known = ", ".join(sorted(names)) or "none"
        return (f"undefined name '{name}'{did_you_mean(name, names)}; names come from 'vars' "
                f"(defined so far: {known}; a var sees only the vars above it), the environment "
                f"from {{{{ env.NAME }}}}")
    return f"template error: {raw}"


class _Environ(dict):
    """``env`` in templates: a missing variable is undefined with a message that says so."""

    def __missing__(self, name: str):
        from jinja2 import StrictUndefined

        return StrictUndefined(
            hint=f"environment variable '{name}' is not set; give a fallback with "
                 f"{{{{ env.{name} | default('...') }}}}", name=name)


def render_document(document: Document) -> Document:
    """Render every template in the document; report every failure at once.

    ``vars`` are rendered first, in order, each seeing the environment and the vars before it;
    the rest of the spec then sees all vars.

    Raises:
        SpecError: a template does not compile, names an undefined var, or fails.
    """
    root = document.root
    if not any(is_template(node.value) for _, node in root.walk()):
        return document
    root = root.copy()
    errors: list[Diagnostic] = []
    env_values = _Environ(os.environ)
    context: dict[str, Any] = {"env": env_values}
    vars_node = root.value.get("vars")
    rendered_vars: dict[str, Any] = {}
    if vars_node is not None and isinstance(vars_node.value, dict):
        for key, child in vars_node.value.items():
            _render_tree(document, child, ("vars", key), {**rendered_vars, "env": env_values},
                         errors)
            rendered_vars[key] = child.to_data()
    context.update(rendered_vars)
    context["vars"] = rendered_vars
    for key, child in root.value.items():
        # targets are templated when they are merged in (their own validation), not here
        if key not in ("vars", "targets"):
            _render_tree(document, child, (key,), context, errors)
    if errors:
        raise SpecError(errors)
    return Document(document.file, root, document.text)


def _render_tree(document: Document, node: Node, path: tuple, context: dict[str, Any],
                 errors: list[Diagnostic]) -> None:
    if isinstance(node.value, dict):
        for key, child in node.value.items():
            _render_tree(document, child, path + (key,), context, errors)
    elif isinstance(node.value, list):
        for index, child in enumerate(node.value):
            _render_tree(document, child, path + (index,), context, errors)
    elif is_template(node.value):
        try:
            rendered = render_value(node.value, context)
        except ValueError as exc:
            errors.append(Diagnostic(document.file, node.line, node.column,
                                     ".".join(map(str, path)), str(exc), "error", node.origin))
            return
        _replace(node, rendered)


def _replace(node: Node, value: Any) -> None:
    """Put a rendered value into a node, turning rendered lists and mappings into nodes."""
    if isinstance(value, dict):
        node.value = {str(k): _child(node, v) for k, v in value.items()}
    elif isinstance(value, (list, tuple)):
        node.value = [_child(node, v) for v in value]
    else:
        node.value = value


def _child(parent: Node, value: Any) -> Node:
    child = Node(None, parent.line, parent.column, origin=parent.origin)
    _replace(child, value)
    return child
