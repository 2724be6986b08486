"""Templated spec values, rendered by jinja2's own sandbox with small limits.

Templates sit inside YAML string values, so a rendered value keeps its line and column; one whole
``{{ expression }}`` keeps its type (``"{{ hidden * 2 }}"`` gives an int). Names come from
``vars``; the environment only as ``{{ env.NAME }}`` / ``env['NAME']``: nothing lists it. Values
read from it, or rendered from them, are registered with :func:`dbspec.errors.register_secret`.

Rendering is :class:`jinja2.sandbox.ImmutableSandboxedEnvironment` with strict undefined names,
limited through its public hooks: ``*``, ``**``, ``%``, ``str.format`` and the ``join``,
``replace``, ``format`` filters are checked before they run; ``str`` methods that build a value
from a count, and ``center``, ``indent``, ``batch``, ``slice``, ``lipsum``, are not offered. A
value builds at most :data:`MAX_TEMPLATE_SIZE` characters or items, in at most
:data:`MAX_TEMPLATE_SECONDS` and :data:`MAX_TEMPLATE_MEMORY` bytes.
"""

from __future__ import annotations

import functools
import os
import re
import string
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Callable, NoReturn, Optional

from dbspec.errors import Diagnostic, SpecError, did_you_mean, register_secret
from dbspec.spec.document import Document, Node, format_path

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
_PLAIN_NAME = re.compile(r"^\s*\{\{-?\s*([A-Za-z_]\w*)(?:\.([A-Za-z]\w*))?\s*-?\}\}\s*$")
_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?([-#0 +]*[\d*]*(?:\.[\d*]*)?)")
_UNOFFERED_METHODS = frozenset(["center", "ljust", "rjust", "zfill", "expandtabs", "join",
                                "replace"])
#: The variables a template names (over-approximated): whether its value came from them.
_ENV_NAME = re.compile(r"\benv\s*(?:\.\s*|\[\s*['\"])([A-Za-z]\w*)")
#: ``env.items()`` and the like would list the environment.
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
    items = list(value.items()) if isinstance(value, dict) else value
    total = len(items) if isinstance(items, (list, tuple)) else 0
    for item in items if total else ():
        if total > MAX_TEMPLATE_SIZE:
            break
        total += _size(item)
    return total


def _check_format(text: Any, braces: bool = False) -> None:
    """Widths in a ``%`` (or ``str.format``) string are bounded; computed ones are refused."""
    try:
        specs = [s for _, _, s, _ in string.Formatter().parse(text) if s] if braces else \
            _PERCENT_SPEC.findall(text) if isinstance(text, str) else []
    except ValueError:
        return  # str.format reports it
    for spec in specs:
        if "{" in spec or (not braces and "*" in spec):
            _refuse("computed widths ('*', nested '{}') are not allowed in spec templates")
        for digits in re.findall(r"\d+", spec):
            _bound(int(digits), f"a width of {int(digits):,}")


def _check_binop(operator: str, left: Any, right: Any) -> None:
    integers = isinstance(left, int) and isinstance(right, int)
    if operator == "%":
        _check_format(left)
    elif integers and (operator == "*" or right > 0):
        bits = abs(left).bit_length() * right if operator == "**" else \
            abs(left).bit_length() + abs(right).bit_length()
        if bits > MAX_INT_BITS:
            _refuse(f"the result would exceed {MAX_INT_BITS:,} bits")
    elif operator == "+" and all(isinstance(v, (str, list, tuple)) for v in (left, right)):
        _bound(_size(left) + _size(right))
    elif operator == "*":  # a sequence repeated: its size (nested items included) times count
        count, sequence = (left, right) if isinstance(left, int) else (right, left)
        _bound(_size(sequence) * max(count, 0) if isinstance(count, int) else 0)


def _check_join(items: Any, separator: Any = "", *_: Any, **__: Any) -> None:
    _bound(_size(items) + len(items) * len(str(separator)))


def _check_replace(text: Any, old: Any, new: Any, count: Any = None) -> None:
    text, old, new = str(text), str(old), str(new)
    times = text.count(old) if old else len(text) + 1
    times = min(times, count) if isinstance(count, int) and count >= 0 else times
    _bound(len(text) + times * max(len(new) - len(old), 0))


def _guard(filters: dict, name: str, check: Callable[..., None]) -> None:
    """Run ``check`` on the filter's value and arguments before the filter itself."""
    from jinja2.nodes import EvalContext
    from jinja2.runtime import Context

    original = filters[name]

    @functools.wraps(original)  # keeps jinja2's pass_eval_context mark (join, replace)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        skip = 1 if isinstance(args[0], (EvalContext, Context)) else 0
        value = args[skip]
        value = list(value) if isinstance(value, Iterator) else value  # counted, then passed on
        check(value, *args[skip + 1:], **kwargs)
        return original(*args[:skip], value, *args[skip + 1:], **kwargs)

    filters[name] = guarded


@functools.lru_cache(maxsize=1)
def _environment() -> Any:
    from jinja2 import StrictUndefined
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class SpecEnvironment(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset(["*", "**", "%", "+"])

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            _check_binop(operator, left, right)
            return super().call_binop(context, operator, left, right)

        def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
            unoffered = isinstance(obj, (str, bytes)) and attr in _UNOFFERED_METHODS
            return not unoffered and super().is_safe_attribute(obj, attr, value)

        def wrap_str_format(self, value: Any) -> Any:
            wrapped = super().wrap_str_format(value)
            if wrapped is not None:  # str.format / format_map: checked when it is looked up
                _check_format(value.__self__, braces=True)
            return wrapped

    environment = SpecEnvironment(undefined=StrictUndefined, autoescape=False)
    environment.globals.pop("lipsum", None)  # unbounded text; no use in a spec
    for name in ("center", "indent", "batch", "slice"):  # lay out text from a count
        del environment.filters[name]
    for name, check in (("format", lambda text, *_, **__: _check_format(text)),
                        ("join", _check_join),
                        ("replace", _check_replace)):
        _guard(environment.filters, name, check)
    return environment


@functools.lru_cache(maxsize=4096)
def _compile(text: str) -> tuple[bool, Any, tuple[str, ...]]:
    """Compile once per distinct template text (specs repeat the same few templates), with the
    environment variables it names."""
    environment = _environment()
    tree = environment.parse(text)
    names = _env_names(tree)
    whole = _WHOLE_EXPRESSION.match(text)
    if whole and "{{" not in whole["expr"]:
        return True, environment.compile_expression(whole["expr"], undefined_to_none=False), names
    return False, environment.from_string(tree), names


def _env_names(tree: Any) -> tuple[str, ...]:
    """The variables a template reads as ``env.NAME`` / ``env['NAME']``; any other use of
    ``env`` (``env|string``, ``env.items()``, ``for k in env``) would list it: refused."""
    from jinja2 import nodes

    reads = {id(n.node): n for n in tree.find_all((nodes.Getattr, nodes.Getitem))}
    names = []
    for used in (n for n in tree.find_all(nodes.Name) if n.name == "env"):
        read = reads.get(id(used))
        name = read.attr if isinstance(read, nodes.Getattr) else read.arg.value \
            if isinstance(read, nodes.Getitem) and isinstance(read.arg, nodes.Const) else None
        if not isinstance(name, str) or name.startswith("_") or name in _MAPPING_METHODS:
            _refuse(_ENV_REFUSAL)
        names.append(name)
    return tuple(names)


def _env_values(names: Iterable[str]) -> dict[str, Any]:
    """``env`` for one template: the variables it names, each registered as a secret, or
    undefined with a hint to give a default."""
    from jinja2 import StrictUndefined

    values = {name: os.environ.get(name) for name in names}
    for name, value in values.items():
        register_secret(value, f"{{{{ env.{name} }}}}")
    return {name: StrictUndefined(name=name, hint=f"environment variable '{name}' is not set; "
                                  f"give a fallback with {{{{ env.{name} | default('...') }}}}")
            if value is None else value for name, value in values.items()}


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
        native, compiled, names = _compile(text)  # outside the limits: linear in the text
        context = {**context, "env": _env_values(names)}
        return _limited(lambda: _render(native, compiled, context))
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


def _render(native: bool, compiled: Any, context: dict[str, Any]) -> Any:
    """The rendered value: chunk by chunk, refused as soon as the output passes the limit."""
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
        str(result)  # StrictUndefined raises here: an undefined name or unset variable
    return result


def _limited(render: Callable[[], Any]) -> Any:
    """Run ``render`` with a deadline and a memory bound, checked on every template line and
    every 16th call into other Python code (jinja2's filters and generators)."""
    import resource  # POSIX, like the platforms dbspec runs on

    deadline = time.monotonic() + MAX_TEMPLATE_SECONDS
    memory = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 + MAX_TEMPLATE_MEMORY
    calls, memory_checked = iter(range(sys.maxsize)), [0.0]

    def on_line(frame: Any, event: str, arg: Any) -> Any:
        now = time.monotonic()
        if now > deadline:
            _refuse(f"the template ran longer than {MAX_TEMPLATE_SECONDS:g} s")
        if now > memory_checked[0] + 0.001:  # getrusage is a system call: once a millisecond
            memory_checked[0] = now
            if resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 > memory:
                _refuse(f"the template used more than {MAX_TEMPLATE_MEMORY // 2**20} MB")
        return on_line

    def on_call(frame: Any, event: str, arg: Any) -> Any:
        if frame.f_code.co_filename == "<template>":
            return on_line
        if next(calls) % 16 == 0:
            on_line(frame, event, arg)
        return None

    previous = sys.gettrace()
    sys.settrace(on_call)
    try:
        return render()
    finally:
        sys.settrace(previous)


def _lookup(context: dict[str, Any], name: str, attribute: Optional[str]) -> Any:
    """A plain name's value without jinja2, or ``_MISSING`` to let jinja2 render (or report) it."""
    value = context.get(name, _MISSING)
    if name == "env":  # the whole environment, an unset or a refused name: jinja2 says why
        if attribute is None or attribute not in os.environ or attribute in _MAPPING_METHODS:
            return _MISSING
        return _env_values([attribute])[attribute]
    if attribute is None or value is _MISSING:
        return value
    known = isinstance(value, dict) and attribute in value
    return dict.__getitem__(value, attribute) if known else _MISSING


def _undefined_message(raw: str, context: dict[str, Any]) -> str:
    name = re.match(r"'([^']+)' is undefined", raw)
    if raw.startswith("environment variable") or not name:
        return raw if raw.startswith("environment variable") else f"template error: {raw}"
    names = [k for k in context if k not in ("env", "vars")]
    return (f"undefined name '{name[1]}'{did_you_mean(name[1], names)}; names come from 'vars' "
            f"(defined so far: {', '.join(sorted(names)) or 'none'}; a var sees only the vars "
            f"above it), the environment from {{{{ env.NAME }}}}")


@dataclass
class _Rendering:
    """One pass over a document: the names templates see, errors, vars rendered from env."""

    document: Document
    context: dict[str, Any] = field(default_factory=dict)
    errors: list[Diagnostic] = field(default_factory=list)
    tainted: set[str] = field(default_factory=set)

    def tree(self, node: Node, path: tuple) -> bool:
        """Render the templates under ``node``; whether any of them read the environment."""
        if isinstance(node.value, (dict, list)):
            items = node.value.items() if isinstance(node.value, dict) else enumerate(node.value)
            return any([self.tree(child, path + (key,)) for key, child in items])
        text = node.value
        if not is_template(text):
            return False
        try:
            node.value = _as_node(render_value(text, self.context), node).value
        except ValueError as exc:
            self.errors.append(Diagnostic(self.document.file, node.line, node.column,
                                          format_path(path), str(exc), "error", node.origin))
            return False
        names = "|".join(re.escape(n) for n in (*self.tainted, "vars"))
        from_env = any(n in os.environ for n in _ENV_NAME.findall(text)) or \
            bool(self.tainted and re.search(rf"\b(?:{names})\b", text))  # over-approximated
        for inner, leaf in node.walk() if from_env else ():
            for shown in (*inner[-1:], leaf.value):  # keys of rendered mappings, then values
                register_secret(shown, text)
        return from_env


def _as_node(value: Any, at: Node) -> Node:
    """A rendered value as a node at ``at``'s place (rendered lists and mappings as nodes)."""
    if isinstance(value, dict):
        value = {str(k): _as_node(v, at) for k, v in value.items()}
    elif isinstance(value, (list, tuple)):
        value = [_as_node(v, at) for v in value]
    return Node(value, at.line, at.column, origin=at.origin)


def render_document(document: Document) -> Document:
    """Render every template in the document; report every failure at once.

    ``vars`` are rendered first, in order, each seeing the environment and the vars before it;
    the rest of the spec then sees all vars. A value rendered from the environment (directly,
    or through a var that read it) is registered as a secret, shown as its template.

    Raises:
        SpecError: a template does not compile, names an undefined var, or fails.
    """
    if not any(is_template(node.value) for _, node in document.root.walk()):
        return document
    root, rendering = document.root.copy(), _Rendering(document)
    vars_node = root.value.get("vars")
    own_vars = vars_node.value if vars_node is not None and isinstance(vars_node.value, dict) \
        else {}
    rendered: dict[str, Any] = {}
    for key, child in own_vars.items():
        rendering.context = dict(rendered)
        if rendering.tree(child, ("vars", key)):
            rendering.tainted.add(key)
        rendered[key] = child.to_data()
    rendering.context = {**rendered, "vars": rendered}
    for key, child in root.value.items():
        if key not in ("vars", "targets"):  # targets are templated when they are merged in
            rendering.tree(child, (key,))
    if rendering.errors:
        raise SpecError(rendering.errors)
    return Document(document.file, root, document.text)
