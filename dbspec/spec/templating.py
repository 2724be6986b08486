"""Templated spec values, rendered by jinja2's own sandbox with small limits.

Templates live inside YAML string values (``out: "{{ hidden }}"``), never around the YAML
structure, so every rendered value keeps its line and column. A value that is one whole
``{{ expression }}`` keeps the expression's type (``"{{ hidden * 2 }}"`` gives an int); other
templates render to strings. Names come from ``vars``; the environment is reachable only as
``{{ env.NAME }}`` (or ``env['NAME']``), one named variable at a time: nothing lists it. Every
variable read, and every value rendered from one, is registered with
:func:`dbspec.errors.register_secret`, so output shows ``{{ env.NAME }}`` instead of the value.

Rendering is :class:`jinja2.sandbox.ImmutableSandboxedEnvironment` (no unsafe attributes, no
mutation, a bounded ``range``) with strict undefined names, limited through its public hooks:
``*``, ``**`` and ``%`` (operator interception), ``str.format`` and the filters that build a
value from a count (``center``, ``indent``, ``join``, ``replace``, ``format``, ``batch``,
``slice``) are checked before they run; the ``str`` methods that do the same are refused (their
filters remain). What a value renders stays under :data:`MAX_TEMPLATE_SIZE` characters or items,
and one value renders in at most :data:`MAX_TEMPLATE_SECONDS` and :data:`MAX_TEMPLATE_MEMORY`
bytes. jinja2 is imported only when a spec uses more than a plain ``{{ name }}``.
"""

from __future__ import annotations

import functools
import os
import re
import string
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Callable, NoReturn, Optional

from dbspec.errors import Diagnostic, SpecError, did_you_mean, register_secret
from dbspec.spec.document import Document, Node

#: Largest string, list or output a template may build: specs are small, templates should be too.
MAX_TEMPLATE_SIZE = 100_000
#: Largest integer a template may compute, in bits (``(10**1000)**1000`` is refused).
MAX_INT_BITS = 100_000
#: Wall-clock limit for rendering one value (nested loops that output nothing included).
MAX_TEMPLATE_SECONDS = 1.0
#: Growth of the process's peak memory allowed while one value renders.
MAX_TEMPLATE_MEMORY = 256 * 1024 * 1024
_MARKERS = ("{{", "{%", "{#")
_WHOLE_EXPRESSION = re.compile(r"^\s*\{\{-?(?P<expr>(?:(?!-?\}\}).)*)-?\}\}\s*$", re.DOTALL)
#: ``{{ name }}`` / ``{{ vars.name }}`` / ``{{ env.NAME }}``: looked up directly, no jinja2 needed.
_PLAIN_NAME = re.compile(r"^\s*\{\{-?\s*([A-Za-z_]\w*)(?:\.([A-Za-z_]\w*))?\s*-?\}\}\s*$")
_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?([-#0 +]*[\d*]*(?:\.[\d*]*)?)")
#: ``str`` methods that build a value from a count; the filters of the same name are checked.
_REFUSED_METHODS = frozenset(["center", "ljust", "rjust", "zfill", "expandtabs", "join",
                              "replace"])
_MAPPING_METHODS = frozenset(["items", "keys", "values", "get", "copy", "pop", "setdefault",
                              "update", "fromkeys", "popitem", "clear"])
_ENV_REFUSAL = ("the environment cannot be listed or used as a whole; name one variable: "
                "{{ env.NAME }} or {{ env.NAME | default('...') }}")
_MISSING = object()


def is_template(value: Any) -> bool:
    """Whether a scalar is a jinja2 template."""
    return isinstance(value, str) and any(m in value for m in _MARKERS)


def _refuse(message: str) -> NoReturn:
    from jinja2.exceptions import SecurityError

    raise SecurityError(message)


def _bound(size: int, what: str = "the result") -> None:
    if size > MAX_TEMPLATE_SIZE:
        _refuse(f"{what} would exceed {MAX_TEMPLATE_SIZE:,} characters or items")


def _size(value: Any) -> int:
    """Characters or items in ``value``, nested ones included; stops counting past the limit."""
    if isinstance(value, (str, bytes)):
        return len(value)
    if isinstance(value, dict):
        value = list(value.items())
    if not isinstance(value, (list, tuple)):
        return 0
    total = len(value)
    for item in value:
        if total > MAX_TEMPLATE_SIZE:
            break
        total += _size(item)
    return total


def _check_format(text: Any, braces: bool = False) -> None:
    """Widths in a ``%`` (or ``str.format``) string are bounded; computed ones are refused."""
    if not isinstance(text, str):
        return
    try:
        specs = [spec for _, _, spec, _ in string.Formatter().parse(text) if spec] if braces \
            else _PERCENT_SPEC.findall(text)
    except ValueError:
        return  # str.format reports it
    for spec in specs:
        if "{" in spec or (not braces and "*" in spec):
            _refuse("computed widths ('*', nested '{}') are not allowed in spec templates")
        for digits in re.findall(r"\d+", spec):
            _bound(int(digits), f"a width of {int(digits):,}")


def _check_binop(operator: str, left: Any, right: Any) -> None:
    integers = isinstance(left, int) and isinstance(right, int)
    bits = 0
    if operator == "%":
        _check_format(left)
    elif operator == "**" and integers and right > 0:
        bits = abs(left).bit_length() * right
    elif operator == "*" and integers:
        bits = abs(left).bit_length() + abs(right).bit_length()
    elif operator == "*":  # a sequence repeated: its size (nested items included) times count
        count, sequence = (left, right) if isinstance(left, int) else (right, left)
        if isinstance(count, int):
            _bound(_size(sequence) * max(count, 0))
    if bits > MAX_INT_BITS:
        _refuse(f"the result would exceed {MAX_INT_BITS:,} bits")


def _check_counts(value: Any, *args: Any, **kwargs: Any) -> None:
    """``center``, ``batch``, ``slice``: no width or count larger than a template may build."""
    for number in (*args, *kwargs.values()):
        if isinstance(number, int):
            _bound(number, f"a width or count of {number:,}")


def _check_indent(text: Any, width: Any = 4, *_: Any, **__: Any) -> None:
    lines = str(text).count("\n") + 1
    _bound(len(str(text)) + lines * (len(width) if isinstance(width, str) else int(width)))


def _check_join(items: Any, separator: Any = "", *_: Any, **__: Any) -> None:
    _bound(_size(items) + len(items) * len(str(separator)))


def _check_replace(text: Any, old: Any, new: Any, count: Any = None) -> None:
    text, old, new = str(text), str(old), str(new)
    times = text.count(old) if old else len(text) + 1
    if isinstance(count, int) and count >= 0:
        times = min(times, count)
    _bound(len(text) + times * max(len(new) - len(old), 0))


def _guard(filters: dict, name: str, check: Callable[..., None]) -> None:
    """Run ``check`` on the filter's value and arguments before the filter itself."""
    from jinja2 import Environment
    from jinja2.nodes import EvalContext
    from jinja2.runtime import Context

    original = filters[name]

    @functools.wraps(original)  # keeps jinja2's pass_eval_context mark (join, replace)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        skip = 1 if isinstance(args[0], (EvalContext, Context, Environment)) else 0
        head, value, rest = args[:skip], args[skip], args[skip + 1:]
        value = list(value) if isinstance(value, Iterator) else value  # counted, then passed on
        check(value, *rest, **kwargs)
        return original(*head, value, *rest, **kwargs)

    filters[name] = guarded


@functools.lru_cache(maxsize=1)
def _environment() -> Any:
    from jinja2 import StrictUndefined
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class SpecEnvironment(ImmutableSandboxedEnvironment):
        """The sandbox with size checks before large values are built, and an ``env`` that
        yields one named variable at a time."""

        intercepted_binops = frozenset(["*", "**", "%"])

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            _check_binop(operator, left, right)
            return super().call_binop(context, operator, left, right)

        def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
            refused = isinstance(obj, (str, bytes)) and attr in _REFUSED_METHODS
            return not refused and super().is_safe_attribute(obj, attr, value)

        def getattr(self, obj: Any, attribute: str) -> Any:
            return obj.lookup(attribute) if isinstance(obj, _Env) else \
                super().getattr(obj, attribute)

        def getitem(self, obj: Any, argument: Any) -> Any:
            return obj.lookup(argument) if isinstance(obj, _Env) else \
                super().getitem(obj, argument)

        def wrap_str_format(self, value: Any) -> Any:
            wrapped = super().wrap_str_format(value)
            if wrapped is not None:  # str.format / format_map: checked when it is looked up
                _check_format(value.__self__, braces=True)
            return wrapped

    environment = SpecEnvironment(undefined=StrictUndefined, autoescape=False)
    environment.globals.pop("lipsum", None)  # generates unbounded text; no use in a spec
    for name, check in (("center", _check_counts), ("batch", _check_counts),
                        ("slice", _check_counts), ("indent", _check_indent),
                        ("format", _check_format), ("join", _check_join),
                        ("replace", _check_replace)):
        _guard(environment.filters, name, check)
    return environment


@functools.lru_cache(maxsize=4096)
def _compile(text: str) -> tuple[bool, Any]:
    """Compile once per distinct template text: specs repeat the same few templates."""
    whole = _WHOLE_EXPRESSION.match(text)
    if whole and "{{" not in whole["expr"]:
        return True, _environment().compile_expression(whole["expr"], undefined_to_none=False)
    return False, _environment().from_string(text)


def render_value(text: str, context: dict[str, Any]) -> Any:
    """Render one template string; see the module docstring for typing rules and limits.

    Raises:
        ValueError: with a user-facing message for syntax errors, undefined names, refused
            operations and exceeded limits.
    """
    plain = _PLAIN_NAME.match(text)
    value = _lookup(context, plain[1], plain[2]) if plain else _MISSING
    if value is not _MISSING:
        return value
    import jinja2

    try:
        return _limited(lambda: _render(text, context))
    except jinja2.UndefinedError as exc:
        raise ValueError(_undefined_message(str(exc), context)) from None
    except jinja2.TemplateSyntaxError as exc:
        raise ValueError(f"template syntax error: {exc.message}") from None
    except jinja2.exceptions.SecurityError as exc:
        raise ValueError(f"template refused by the sandbox: {exc}") from None
    except MemoryError:
        raise ValueError("template refused: it ran out of memory") from None
    except Exception as exc:  # a user's expression may raise anything (1/0, bad filter args)
        raise ValueError(f"template failed: {type(exc).__name__}: {str(exc)[:200]}") from None


def _render(text: str, context: dict[str, Any]) -> Any:
    """The rendered value: chunk by chunk, refused as soon as the output passes the limit."""
    native, compiled = _compile(text)
    if not native:
        chunks, total = [], 0
        for chunk in compiled.generate(**context):
            total += len(chunk)
            _bound(total, "the output")
            chunks.append(chunk)
        return "".join(chunks)
    result = compiled(**context)
    _bound(_size(result), "the output")
    if not isinstance(result, (int, float)):
        str(result)  # raises for an undefined name, or for the environment (even nested)
    return result


def _limited(render: Callable[[], Any]) -> Any:
    """Run ``render`` with a deadline and a memory bound, checked on every line it runs."""
    deadline = time.monotonic() + MAX_TEMPLATE_SECONDS
    memory = _peak_memory() + MAX_TEMPLATE_MEMORY

    def on_line(frame: Any, event: str, arg: Any) -> Any:
        if time.monotonic() > deadline:
            _refuse(f"the template ran longer than {MAX_TEMPLATE_SECONDS:g} s")
        if _peak_memory() > memory:
            _refuse(f"the template used more than {MAX_TEMPLATE_MEMORY // 2**20} MB")
        return on_line

    previous = sys.gettrace()
    sys.settrace(lambda frame, event, arg: on_line)
    try:
        return render()
    finally:
        sys.settrace(previous)


def _peak_memory() -> int:
    try:
        import resource
    except ImportError:  # not on POSIX: the time limit still holds
        return 0
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


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
    name = re.match(r"'([^']+)' is undefined", raw)
    if raw.startswith("environment variable") or not name:
        return raw if raw.startswith("environment variable") else f"template error: {raw}"
    names = [k for k in context if k not in ("env", "vars")]
    return (f"undefined name '{name[1]}'{did_you_mean(name[1], names)}; names come from 'vars' "
            f"(defined so far: {', '.join(sorted(names)) or 'none'}; a var sees only the vars "
            f"above it), the environment from {{{{ env.NAME }}}}")


class _Env:
    """``env`` in templates: one named variable at a time, never the whole environment.

    Every variable read is registered as a secret (shown as ``{{ env.NAME }}``) and noted in
    ``read``, so values rendered from it are registered too. A missing variable is undefined
    with a message that says how to give a default. Anything that would list the environment
    (``str``, iteration, ``len``, ``items()``) is refused.
    """

    __slots__ = ("read",)

    def __init__(self) -> None:
        self.read: list[str] = []

    def lookup(self, name: Any) -> Any:
        from jinja2 import StrictUndefined

        value = os.environ.get(name) if isinstance(name, str) else None
        if not isinstance(name, str) or name.startswith("_") or \
                (value is None and name in _MAPPING_METHODS):
            _refuse(f"env[{name!r}]: {_ENV_REFUSAL}")
        if value is None:
            return StrictUndefined(
                hint=f"environment variable '{name}' is not set; give a fallback with "
                     f"{{{{ env.{name} | default('...') }}}}", name=name)
        register_secret(value, f"{{{{ env.{name} }}}}")
        self.read.append(name)
        return value

    def __contains__(self, name: Any) -> bool:
        return isinstance(name, str) and name in os.environ

    def _refused(self, *_: Any, **__: Any) -> NoReturn:
        _refuse(_ENV_REFUSAL)

    __str__ = __repr__ = __iter__ = __len__ = __reversed__ = __format__ = _refused
    __html__ = __json__ = __getstate__ = __reduce__ = __reduce_ex__ = _refused

    def __getattr__(self, name: str) -> Any:
        # Python-level attribute access (a filter calling value.items()); templates use lookup
        if name.startswith("__"):
            raise AttributeError(name)
        _refuse(_ENV_REFUSAL)


@dataclass
class _Rendering:
    """One pass over a document: where errors go, what templates see, which vars hold secrets."""

    document: Document
    env: _Env = field(default_factory=_Env)
    context: dict[str, Any] = field(default_factory=dict)
    errors: list[Diagnostic] = field(default_factory=list)
    tainted: set[str] = field(default_factory=set)

    def tree(self, node: Node, path: tuple) -> bool:
        """Render the templates under ``node``; whether any of them read the environment."""
        if isinstance(node.value, (dict, list)):
            items = node.value.items() if isinstance(node.value, dict) else enumerate(node.value)
            return any([self.tree(child, path + (key,)) for key, child in items])
        if not is_template(node.value):
            return False
        read_before = len(self.env.read)
        try:
            rendered = render_value(node.value, self.context)
        except ValueError as exc:
            self.errors.append(Diagnostic(self.document.file, node.line, node.column,
                                          ".".join(map(str, path)), str(exc), "error",
                                          node.origin))
            return False
        from_env = len(self.env.read) > read_before or self.uses_tainted(node.value)
        if from_env:
            _register_rendered(rendered, node.value)
        _replace(node, rendered)
        return from_env

    def uses_tainted(self, text: str) -> bool:
        """Whether a template may read a var rendered from the environment (over-approximated)."""
        if not self.tainted:
            return False
        names = sorted((*self.tainted, "vars"), key=len, reverse=True)
        return re.search(rf"\b(?:{'|'.join(map(re.escape, names))})\b", text) is not None


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
    rendering = _Rendering(document)
    rendered: dict[str, Any] = {}
    vars_node = root.value.get("vars")
    if vars_node is not None and isinstance(vars_node.value, dict):
        for key, child in vars_node.value.items():
            rendering.context = {**rendered, "env": rendering.env}
            if rendering.tree(child, ("vars", key)):
                rendering.tainted.add(key)
            rendered[key] = child.to_data()
    rendering.context = {**rendered, "env": rendering.env, "vars": rendered}
    for key, child in root.value.items():
        if key not in ("vars", "targets"):  # targets are templated when they are merged in
            rendering.tree(child, (key,))
    if rendering.errors:
        raise SpecError(rendering.errors)
    return Document(document.file, root, document.text)


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
