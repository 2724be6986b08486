"""Sandboxed jinja2 templating of spec values.

Templates live inside YAML string values (``out: "{{ hidden }}"``), never around the YAML
structure, so every rendered value keeps its line and column. A value that is one whole
``{{ expression }}`` keeps the expression's type (``"{{ hidden * 2 }}"`` gives an int); other
templates render to strings. Names come from ``vars``; the environment is reachable only as
``{{ env.NAME }}`` (or ``env['NAME']``), one named variable at a time: nothing lists it
(``env|string``, ``env.items()``, ``{% for k in env %}`` are refused). Every variable read, and
every value rendered from one, is registered with :func:`dbspec.errors.register_secret`, so
diagnostics, MLflow params and logged spec files show ``{{ env.NAME }}`` instead of the value.

Templates are bounded: output, strings, lists and numbers a template builds stay under
:data:`MAX_TEMPLATE_SIZE` (checked before the operation runs, so ``'%0999999999d'|format(1)``
is refused, not attempted), and one value renders in at most :data:`MAX_TEMPLATE_SECONDS` and
:data:`MAX_TEMPLATE_MEMORY` bytes. jinja2 is imported only when a spec uses a template.
"""

from __future__ import annotations

import functools
import os
import re
import sys
import time
from typing import Any, Callable, Optional

from dbspec.errors import Diagnostic, SpecError, did_you_mean, register_secret
from dbspec.spec.document import Document, Node

_WHOLE_EXPRESSION = re.compile(r"^\s*\{\{-?(?P<expr>(?:(?!-?\}\}).)*)-?\}\}\s*$", re.DOTALL)
_MARKERS = ("{{", "{%", "{#")
#: ``{{ name }}`` / ``{{ vars.name }}`` / ``{{ env.NAME }}``: looked up directly, no jinja2 needed.
_PLAIN_NAME = re.compile(r"^\s*\{\{-?\s*([A-Za-z_]\w*)(?:\.([A-Za-z_]\w*))?\s*-?\}\}\s*$")
#: Largest string or list a template may build: specs are small, templates should be too.
MAX_TEMPLATE_SIZE = 100_000
#: Largest integer a template may compute, in bits (``(10**1000)**1000`` is refused).
MAX_INT_BITS = 100_000
#: Wall-clock limit for rendering one value (nested loops that output nothing included).
MAX_TEMPLATE_SECONDS = 1.0
#: Growth of the process's peak memory allowed while one value renders.
MAX_TEMPLATE_MEMORY = 256 * 1024 * 1024
_MISSING = object()
_ENV_REFUSAL = ("the environment cannot be listed or used as a whole; name one variable: "
                "{{ env.NAME }} or {{ env.NAME | default('...') }}")


def is_template(value: Any) -> bool:
    """Whether a scalar is a jinja2 template."""
    return isinstance(value, str) and any(m in value for m in _MARKERS)


def _size(value: Any, limit: int = MAX_TEMPLATE_SIZE) -> int:
    """Characters or items in ``value``, nested ones included; stops counting past ``limit``."""
    if isinstance(value, (str, bytes)):
        return len(value)
    if isinstance(value, dict):
        value = list(value.items())
    if isinstance(value, (list, tuple)):
        total = len(value)
        for item in value:
            if total > limit:
                break
            if isinstance(item, (str, bytes, list, tuple, dict)):
                total += _size(item, limit - total)
        return total
    return 0


def _refuse(message: str):
    from jinja2.exceptions import SecurityError

    raise SecurityError(message)


def _check_size(size: int, what: str = "the result") -> None:
    if size > MAX_TEMPLATE_SIZE:
        _refuse(f"{what} would exceed {MAX_TEMPLATE_SIZE:,} items")


def _check_width(width: Any) -> None:
    if isinstance(width, int) and width > MAX_TEMPLATE_SIZE:
        _refuse(f"a width of {width:,} is larger than a spec template may build "
                f"({MAX_TEMPLATE_SIZE:,})")


_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?")


def _check_percent_format(text: Any) -> None:
    """Widths and precisions of a ``%`` format are bounded (``'%0999999999d'`` is refused)."""
    if not isinstance(text, str):
        return
    for width, precision in _PERCENT_SPEC.findall(text):
        for number in (width, precision):
            if number == "*":
                _refuse("'*' widths are not allowed in spec templates")
            if number:
                _check_width(int(number))


def _check_brace_format(text: str) -> None:
    """Widths and precisions of a ``str.format`` string are bounded; nested ones refused."""
    import string

    try:
        fields = list(string.Formatter().parse(text))
    except ValueError:
        return  # str.format reports it
    for _, _, spec, _ in fields:
        if not spec:
            continue
        if "{" in spec:
            _refuse("nested format specifications are not allowed in spec templates")
        for number in re.findall(r"\d+", spec):
            _check_width(int(number))


def _check_binop(operator: str, left: Any, right: Any) -> None:
    numbers = all(isinstance(v, int) for v in (left, right))
    if operator == "**" and isinstance(right, (int, float)):
        if abs(right) > 1000:
            _refuse(f"exponent {right} is too large for a spec template")
        if numbers and right > 0 and abs(left).bit_length() * right > MAX_INT_BITS:
            _refuse(f"the result would exceed {MAX_INT_BITS:,} bits")
    elif operator == "*":
        if numbers:
            if abs(left).bit_length() + abs(right).bit_length() > MAX_INT_BITS:
                _refuse(f"the result would exceed {MAX_INT_BITS:,} bits")
            return
        sized = [v for v in (left, right) if isinstance(v, (str, bytes, list, tuple))]
        counts = [v for v in (left, right) if isinstance(v, int)]
        if sized and counts:
            _check_size(_size(sized[0]) * max(counts[0], 0))
    elif operator == "+":
        if all(isinstance(v, (str, bytes, list, tuple)) for v in (left, right)):
            _check_size(_size(left) + _size(right))
    elif operator == "%":
        _check_percent_format(left)


def _checked_join(items: list, separator: Any = "") -> None:
    total = len(str(separator)) * max(len(items) - 1, 0)
    for item in items:
        _check_size(total)
        total += len(item) if isinstance(item, str) else _size(item) or len(str(item))
    _check_size(total)


def _check_replace(text: Any, old: Any, new: Any, count: Any = None) -> None:
    text, old, new = str(text), str(old), str(new)
    times = text.count(old) if old else len(text) + 1
    if isinstance(count, int) and count >= 0:
        times = min(times, count)
    _check_size(len(text) + times * max(len(new) - len(old), 0))


def _guard_filters(filters: dict) -> None:
    """Wrap the filters that can build large values with checks that run first."""

    def guarded(name: str, check: Callable[..., Optional[tuple]]) -> None:
        original = filters[name]
        passed = getattr(original, "jinja_pass_arg", None)

        def call(first, *args, **kwargs):
            changed = check(*args, **kwargs) if passed else check(first, *args, **kwargs)
            if changed is not None:  # the check materialised an iterable: pass the list on
                args, kwargs = changed, {}
                if not passed:
                    first, args = args[0], args[1:]
            return original(first, *args, **kwargs)

        if passed is not None:
            call.jinja_pass_arg = passed  # type: ignore[attr-defined]
        filters[name] = call

    def center(value, width=80, *_, **__):
        _check_width(width)

    def indent(value, width=4, *_, **__):
        lines = str(value).count("\n") + 1
        _check_size(len(str(value)) + lines * (len(width) if isinstance(width, str) else width))

    def format_(value, *args, **kwargs):
        _check_percent_format(value)

    def join(value, d="", attribute=None):
        items = list(value)
        _checked_join(items if attribute is None else [""] * len(items), d)
        return (items, d, attribute)

    def replace(value, old, new, count=None):
        _check_replace(value, old, new, count)

    def counted(value, number, *_, **__):
        _check_width(number)

    def sum_(iterable, attribute=None, start=0):
        items = list(iterable)
        if isinstance(start, (str, bytes, list, tuple)):
            _check_size(_size(start) + sum(_size(i) for i in items))
        return (items, attribute, start)

    for name, check in (("center", center), ("indent", indent), ("format", format_),
                        ("join", join), ("replace", replace), ("slice", counted),
                        ("batch", counted), ("sum", sum_)):
        guarded(name, check)


_SIZED_METHODS = frozenset(["center", "ljust", "rjust", "zfill", "expandtabs", "replace",
                            "join"])


@functools.lru_cache(maxsize=1)
def _environment():
    from jinja2 import StrictUndefined
    from jinja2.compiler import CodeGenerator
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class BoundedCodeGenerator(CodeGenerator):
        """``a ~ b`` goes through :meth:`BoundedEnvironment.concat_checked`."""

        def visit_Concat(self, node, frame):
            self.write("environment.concat_checked((")
            for arg in node.nodes:
                self.visit(arg, frame)
                self.write(", ")
            self.write("))")

    class BoundedEnvironment(ImmutableSandboxedEnvironment):
        """The sandbox, plus size bounds on everything that can build a large value, and an
        ``env`` that yields single named variables only."""

        code_generator_class = BoundedCodeGenerator
        intercepted_binops = frozenset(["*", "**", "+", "%"])

        def call_binop(self, context, operator, left, right):
            _check_binop(operator, left, right)
            return super().call_binop(context, operator, left, right)

        @staticmethod
        def concat_checked(parts):
            texts = []
            total = 0
            for part in parts:
                if isinstance(part, _Env):
                    _refuse(_ENV_REFUSAL)
                _check_size(total + _size(part))
                text = str(part)
                total += len(text)
                _check_size(total)
                texts.append(text)
            return "".join(texts)

        def getattr(self, obj, attribute):
            if isinstance(obj, _Env):
                return obj.lookup(attribute)
            return super().getattr(obj, attribute)

        def getitem(self, obj, argument):
            if isinstance(obj, _Env):
                return obj.lookup(argument)
            return super().getitem(obj, argument)

        def wrap_str_format(self, value):
            wrapped = super().wrap_str_format(value)
            if wrapped is not None:
                _check_brace_format(value.__self__)
            return wrapped

        def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja2's names)
            owner = getattr(__obj, "__self__", None)
            name = getattr(__obj, "__name__", "")
            if isinstance(owner, (str, bytes)) and name in _SIZED_METHODS:
                if name == "join" and args:
                    items = list(args[0])
                    _checked_join(items, owner)
                    args = (items,) + args[1:]
                elif name == "replace" and len(args) >= 2:
                    _check_replace(owner, *args[:3])
                elif name == "expandtabs":
                    tab = args[0] if args else kwargs.get("tabsize", 8)
                    _check_size(len(owner) + owner.count("\t") * max(tab, 0))
                elif args:
                    _check_width(args[0])
            return super().call(__context, __obj, *args, **kwargs)

    environment = BoundedEnvironment(undefined=StrictUndefined, autoescape=False)
    environment.globals.pop("lipsum", None)  # generates unbounded text; no use in a spec
    _guard_filters(environment.filters)
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
    """Render one template string; see the module docstring for typing rules and limits.

    Raises:
        ValueError: with a user-facing message for syntax errors, undefined names, refused
            operations and exceeded limits.
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
            result = _limited(lambda: compiled(**context))
            if isinstance(result, jinja2.Undefined):
                result._fail_with_undefined_error()
            if _holds_env(result):
                _refuse(_ENV_REFUSAL)
        else:
            result = _limited(lambda: _render_bounded(compiled, context))
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
    except MemoryError:
        raise ValueError("template refused: it ran out of memory") from None
    except Exception as exc:  # a user's expression may raise anything (1/0, bad filter args)
        raise ValueError(f"template failed: {type(exc).__name__}: {str(exc)[:200]}") from None


def _render_bounded(template, context: dict[str, Any]) -> str:
    """Render chunk by chunk, stopping as soon as the output passes the size limit."""
    chunks, total = [], 0
    for chunk in template.generate(**context):
        total += len(chunk)
        if total > MAX_TEMPLATE_SIZE:
            raise ValueError(f"the template output passed {MAX_TEMPLATE_SIZE:,} characters; "
                             "that is the limit")
        chunks.append(chunk)
    return "".join(chunks)


def _peak_memory() -> int:
    try:
        import resource
    except ImportError:  # not on POSIX: the time limit still holds
        return 0
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _limited(render: Callable[[], Any]) -> Any:
    """Run ``render`` with a deadline and a memory bound, checked on every line the compiled
    template runs (its frames are named ``<template>``; others are not traced)."""
    deadline = time.monotonic() + MAX_TEMPLATE_SECONDS
    memory = _peak_memory() + MAX_TEMPLATE_MEMORY
    lines = [0]

    def on_line(frame, event, arg):
        if event == "line":
            lines[0] += 1
            if time.monotonic() > deadline:
                _refuse(f"the template ran longer than {MAX_TEMPLATE_SECONDS:g} s")
            if lines[0] % 64 == 0 and _peak_memory() > memory:
                _refuse(f"the template used more than {MAX_TEMPLATE_MEMORY // 2**20} MB")
        return on_line

    def on_call(frame, event, arg):
        return on_line if frame.f_code.co_filename == "<template>" else None

    previous = sys.gettrace()
    sys.settrace(on_call)
    try:
        return render()
    finally:
        sys.settrace(previous)


def _holds_env(value: Any, depth: int = 0) -> bool:
    if isinstance(value, _Env):
        return True
    if depth < 8 and isinstance(value, (list, tuple)):
        return any(_holds_env(v, depth + 1) for v in value)
    if depth < 8 and isinstance(value, dict):
        return any(_holds_env(v, depth + 1) for v in value.values())
    return False


def _lookup(context: dict[str, Any], name: str, attribute: Optional[str]) -> Any:
    value = context.get(name, _MISSING)
    if isinstance(value, _Env):
        if attribute is None or attribute not in os.environ:
            return _MISSING  # jinja2 refuses the whole environment, or reports the missing one
        return value.lookup(attribute)
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


_MAPPING_METHODS = frozenset(["items", "keys", "values", "get", "copy", "pop", "setdefault",
                              "update", "fromkeys", "popitem", "clear"])


class _Env:
    """``env`` in templates: one named variable at a time, never the whole environment.

    Every variable read is registered as a secret (shown as ``{{ env.NAME }}``) and noted in
    ``read``, so the renderer can register values rendered from it too. A missing variable is
    undefined with a message that says how to give a default. Anything that would list the
    environment (``str``, iteration, ``len``, ``items()``) is refused.
    """

    __slots__ = ("read",)

    def __init__(self):
        self.read: list[str] = []

    def lookup(self, name: Any) -> Any:
        from jinja2 import StrictUndefined

        if not isinstance(name, str) or name.startswith("_"):
            _refuse(f"env[{name!r}]: {_ENV_REFUSAL}")
        value = os.environ.get(name)
        if value is None and name in _MAPPING_METHODS:
            _refuse(_ENV_REFUSAL)
        if value is None:
            return StrictUndefined(
                hint=f"environment variable '{name}' is not set; give a fallback with "
                     f"{{{{ env.{name} | default('...') }}}}", name=name)
        register_secret(value, f"{{{{ env.{name} }}}}")
        self.read.append(name)
        return value

    def __contains__(self, name: Any) -> bool:
        return isinstance(name, str) and name in os.environ

    def _refused(self, *_: Any, **__: Any):
        _refuse(_ENV_REFUSAL)

    __str__ = __repr__ = __iter__ = __len__ = __reversed__ = __format__ = _refused
    __html__ = __json__ = __getstate__ = __reduce__ = __reduce_ex__ = _refused

    def __getattr__(self, name: str):
        # Python-level attribute access (a filter calling value.items()); templates use lookup
        if name.startswith("__"):
            raise AttributeError(name)
        _refuse(_ENV_REFUSAL)


def render_document(document: Document) -> Document:
    """Render every template in the document; report every failure at once.

    ``vars`` are rendered first, in order, each seeing the environment and the vars before it;
    the rest of the spec then sees all vars. A value rendered from the environment (directly,
    or through a var that read it) is registered as a secret, shown as its template.

    Raises:
        SpecError: a template does not compile, names an undefined var, or fails.
    """
    root = document.root
    if not any(is_template(node.value) for _, node in root.walk()):
        return document
    root = root.copy()
    errors: list[Diagnostic] = []
    env = _Env()
    context: dict[str, Any] = {"env": env}
    vars_node = root.value.get("vars")
    rendered_vars: dict[str, Any] = {}
    tainted: set[str] = set()
    if vars_node is not None and isinstance(vars_node.value, dict):
        for key, child in vars_node.value.items():
            if _render_tree(document, child, ("vars", key), {**rendered_vars, "env": env},
                            errors, env, tainted):
                tainted.add(key)
            rendered_vars[key] = child.to_data()
    context.update(rendered_vars)
    context["vars"] = rendered_vars
    for key, child in root.value.items():
        # targets are templated when they are merged in (their own validation), not here
        if key not in ("vars", "targets"):
            _render_tree(document, child, (key,), context, errors, env, tainted)
    if errors:
        raise SpecError(errors)
    return Document(document.file, root, document.text)


def _uses(text: str, tainted: set[str]) -> bool:
    """Whether a template may read a var rendered from the environment (over-approximated)."""
    if not tainted:
        return False
    names = "|".join(re.escape(n) for n in sorted((*tainted, "vars"), key=len, reverse=True))
    return re.search(rf"\b(?:{names})\b", text) is not None


def _register_rendered(value: Any, shown_as: str) -> None:
    if isinstance(value, str):
        register_secret(value, shown_as)
    elif isinstance(value, dict):
        for key, item in value.items():
            _register_rendered(key, shown_as)
            _register_rendered(item, shown_as)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _register_rendered(item, shown_as)


def _render_tree(document: Document, node: Node, path: tuple, context: dict[str, Any],
                 errors: list[Diagnostic], env: "_Env", tainted: set[str]) -> bool:
    """Render the templates under ``node``; whether any of them read the environment."""
    if isinstance(node.value, dict):
        found = [_render_tree(document, child, path + (key,), context, errors, env, tainted)
                 for key, child in node.value.items()]
        return any(found)
    if isinstance(node.value, list):
        found = [_render_tree(document, child, path + (index,), context, errors, env, tainted)
                 for index, child in enumerate(node.value)]
        return any(found)
    if not is_template(node.value):
        return False
    text = node.value
    read_before = len(env.read)
    try:
        rendered = render_value(text, context)
    except ValueError as exc:
        errors.append(Diagnostic(document.file, node.line, node.column,
                                 ".".join(map(str, path)), str(exc), "error", node.origin))
        return False
    from_env = len(env.read) > read_before or _uses(text, tainted)
    if from_env:
        _register_rendered(rendered, text)
    _replace(node, rendered)
    return from_env


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
