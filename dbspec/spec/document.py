"""YAML text to a tree of located nodes, and the edits made on it before validation.

A spec is parsed once into :class:`Node` objects that remember their line and column. Targets,
``--set`` overrides and templating all work on this tree, so a value that came from a target or
from the command line still points at the place it was written.
"""

from __future__ import annotations

from typing import Any, Iterator, NamedTuple

import yaml

from dbspec.errors import Diagnostic, Severity, SpecError, UsageError

MAX_BYTES = 1_000_000
MAX_DEPTH = 64
MAX_NODES = 100_000

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_MERGE_TAG = "tag:yaml.org,2002:merge"
_STR_TAG = "tag:yaml.org,2002:str"
_TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"
_constructor = yaml.constructor.SafeConstructor()


class Node:
    """One value of the spec with the place it was written.

    ``value`` is a ``dict[str, Node]``, a ``list[Node]`` or a plain scalar. ``line`` and ``column``
    are 1-based positions of the value; ``key_line``/``key_column`` of its mapping key, if any.
    ``origin`` names a source other than the file (``--set a=b``).
    """

    __slots__ = ("value", "line", "column", "key_line", "key_column", "origin")

    def __init__(self, value: Any, line: int = 0, column: int = 0, key_line: int = 0,
                 key_column: int = 0, origin: str = ""):
        self.value = value
        self.line, self.column = line, column
        self.key_line, self.key_column = key_line, key_column
        self.origin = origin

    def __repr__(self) -> str:
        return f"Node({self.value!r}, line={self.line}, column={self.column})"

    def to_data(self) -> Any:
        """The plain Python value (dicts, lists, scalars) without positions."""
        if isinstance(self.value, dict):
            return {k: v.to_data() for k, v in self.value.items()}
        if isinstance(self.value, list):
            return [v.to_data() for v in self.value]
        return self.value

    def copy(self) -> "Node":
        """A deep copy, so edits for one target or trial leave the original alone."""
        if isinstance(self.value, dict):
            value: Any = {k: v.copy() for k, v in self.value.items()}
        elif isinstance(self.value, list):
            value = [v.copy() for v in self.value]
        else:
            value = self.value
        return Node(value, self.line, self.column, self.key_line, self.key_column, self.origin)

    def child(self, element: Any) -> Node | None:
        """The node at key or index ``element`` below this one, or None."""
        if isinstance(self.value, dict):
            return self.value.get(element)
        if isinstance(self.value, list) and isinstance(element, int) and \
                0 <= element < len(self.value):
            return self.value[element]
        return None

    def walk(self, path: tuple = ()) -> Iterator[tuple[tuple, "Node"]]:
        """Yield ``(path, node)`` for this node and every node below it."""
        yield path, self
        if isinstance(self.value, dict):
            for key, child in self.value.items():
                yield from child.walk(path + (key,))
        elif isinstance(self.value, list):
            for index, child in enumerate(self.value):
                yield from child.walk(path + (index,))


class Document(NamedTuple):
    """A parsed spec file: its name, root node and text."""

    file: str
    root: Node
    text: str = ""

    def locate(self, path: tuple) -> tuple[tuple, Node, bool]:
        """Find the deepest node along ``path``.

        Elements that are not in the tree (pydantic's union tags, a missing key) are skipped.

        Returns:
            The matched path, the deepest node, and whether the last element of ``path`` was
            found (so a message can point at a key rather than its parent).
        """
        node, matched, found_last = self.root, [], False
        for i, element in enumerate(path):
            child = node.child(element)
            if child is None:
                continue
            node = child
            matched.append(element)
            found_last = i == len(path) - 1
        return tuple(matched), node, found_last

    def diagnostic(self, path: tuple, message: str, severity: Severity = "error", *,
                   at_key: bool = False) -> Diagnostic:
        """Build a diagnostic positioned at ``path`` (or its nearest existing parent)."""
        _, node, found = self.locate(path)
        at_key = at_key and found and bool(node.key_line)
        return Diagnostic(self.file, node.key_line if at_key else node.line,
                          node.key_column if at_key else node.column, format_path(path), message,
                          severity, node.origin)


def format_path(path: tuple) -> str:
    """``('model', 'layers', 0, 'linear')`` -> ``model.layers.0.linear``."""
    return ".".join(str(p) for p in path)


def read_document(path: str) -> Document:
    """Read and parse a spec file.

    Raises:
        UsageError: the file is missing, unreadable, not UTF-8 or too large.
        SpecError: the YAML is malformed, empty, not a mapping, too deep, or has duplicate keys.
    """
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_BYTES + 1)
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise UsageError(f"{path}: is a directory, expected a YAML spec file") from None
    except OSError as exc:
        raise UsageError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if len(raw) > MAX_BYTES:
        raise SpecError([Diagnostic(path, 1, 1, "", f"file is larger than {MAX_BYTES:,} bytes; "
                                    "a spec this size is not a model spec")])
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError([Diagnostic(path, 1, 1, "", f"file is not UTF-8 text ({exc.reason} at "
                                    f"byte {exc.start})")]) from None
    return parse_document(text, path)


def parse_document(text: str, file: str = "<string>") -> Document:
    """Parse YAML text into a located :class:`Document`; see :func:`read_document`."""
    try:
        composed = yaml.compose(text, Loader=_Loader)
    except yaml.MarkedYAMLError as exc:
        raise SpecError([_yaml_diagnostic(exc, file, text)]) from None
    except yaml.reader.ReaderError as exc:
        line = text.count("\n", 0, exc.position) + 1
        column = exc.position - (text.rfind("\n", 0, exc.position) + 1) + 1
        char = exc.character if isinstance(exc.character, str) else chr(exc.character)
        raise SpecError([Diagnostic(file, line, column, "", f"invalid YAML: the character "
                                    f"{char!r} is not allowed in YAML text")]) from None
    except yaml.YAMLError as exc:
        raise SpecError([Diagnostic(file, 1, 1, "", f"invalid YAML: {exc}")]) from None
    except RecursionError:
        raise SpecError([Diagnostic(file, 1, 1, "", f"nesting is deeper than {MAX_DEPTH} levels")]) \
            from None
    if composed is None:
        raise SpecError([Diagnostic(file, 1, 1, "", "file is empty; a spec is a mapping with at "
                                    "least 'name', 'data' and 'model'")])
    builder = _TreeBuilder(file)
    root = builder.build(composed, ())
    if builder.errors:
        raise SpecError(builder.errors)
    if not isinstance(root.value, dict):
        found = "a list" if isinstance(root.value, list) else f"the scalar {root.value!r}"
        raise SpecError([Diagnostic(file, root.line, root.column, "", f"expected a mapping "
                                    f"(key: value lines) at the top level, found {found}")])
    return Document(file, root, text)


def parse_value(text: str, origin: str) -> Any:
    """A command-line value read as YAML, with the same scalar rules as spec files.

    Raises:
        SpecError: the text is not valid YAML.
    """
    if not text.strip():
        return ""
    try:
        composed = yaml.compose(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SpecError([Diagnostic(origin, 0, 0, "", f"not a valid YAML value ({problem}); "
                                    "quote it")]) from None
    builder = _TreeBuilder(origin)
    value = builder.build(composed, ()).to_data() if composed is not None else None
    if builder.errors:
        raise SpecError(builder.errors)
    return value


def _yaml_diagnostic(exc: yaml.MarkedYAMLError, file: str, text: str) -> Diagnostic:
    mark = exc.problem_mark or exc.context_mark
    line, column = (mark.line + 1, mark.column + 1) if mark else (1, 1)
    problem = exc.problem or "invalid YAML"
    if exc.context:
        problem = f"{exc.context}: {problem}" if "while" not in exc.context else \
            f"{problem} ({exc.context})"
    lines = text.splitlines()
    if "\t" in problem or (0 < line <= len(lines) and "\t" in lines[line - 1][:column]):
        problem += "; YAML does not allow tabs for indentation, use spaces"
    return Diagnostic(file, line, column, "", f"invalid YAML: {problem}")


class _TreeBuilder:
    """Turns PyYAML's composed nodes into located :class:`Node` trees, with limits."""

    def __init__(self, file: str):
        self.file = file
        self.count = 0
        self.errors: list[Diagnostic] = []

    def build(self, node: yaml.Node, path: tuple) -> Node:
        self.count += 1
        line, column = node.start_mark.line + 1, node.start_mark.column + 1
        if self.count > MAX_NODES:
            raise SpecError([Diagnostic(self.file, line, column, "", f"the document expands to "
                                        f"more than {MAX_NODES:,} values (too many aliases?)")])
        if len(path) > MAX_DEPTH:
            raise SpecError([Diagnostic(self.file, line, column, "",
                                        f"nesting is deeper than {MAX_DEPTH} levels")])
        if isinstance(node, yaml.MappingNode):
            return Node(self._mapping(node, path), line, column)
        if isinstance(node, yaml.SequenceNode):
            return Node([self.build(item, path + (i,)) for i, item in enumerate(node.value)],
                        line, column)
        if node.tag == _TIMESTAMP_TAG:
            return Node(node.value, line, column)  # keep dates as written; fields parse them
        try:
            value = _constructor.construct_object(node)
        except Exception as exc:  # PyYAML raises ValueError/KeyError/IndexError for bad !!tags
            problem = getattr(exc, "problem", None) or f"{node.value!r} is not a valid {node.tag}"
            self.errors.append(Diagnostic(self.file, line, column, format_path(path),
                                          f"invalid YAML value: {problem}"))
            value = node.value
        return Node(value, line, column)

    def _mapping(self, node: yaml.MappingNode, path: tuple) -> dict[str, Node]:
        result: dict[str, Node] = {}
        merged: dict[str, Node] = {}
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG:
                for source in self._merge_sources(value_node, path):
                    for key, child in source.items():
                        merged.setdefault(key, child)
                continue
            line, column = key_node.start_mark.line + 1, key_node.start_mark.column + 1
            if not isinstance(key_node, yaml.ScalarNode):
                self.errors.append(Diagnostic(self.file, line, column, "",
                                              "mapping keys must be plain strings"))
                continue
            key = str(key_node.value)
            if key in result:
                first = result[key]
                self.errors.append(Diagnostic(
                    self.file, line, column, format_path(path + (key,)), f"duplicate key '{key}' (first defined at line "
                    f"{first.key_line}); remove one of them"))
                continue
            child = self.build(value_node, path + (key,))
            child.key_line, child.key_column = line, column
            result[key] = child
        for key, child in merged.items():
            result.setdefault(key, child)
        return result

    def _merge_sources(self, value_node: yaml.Node, path: tuple) -> list[dict[str, Node]]:
        nodes = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
        sources = []
        for item in nodes:
            built = self.build(item, path + ("<<",))
            if isinstance(built.value, dict):
                sources.append(built.value)
            else:
                self.errors.append(Diagnostic(self.file, built.line, built.column, "",
                                              "'<<' merges only mappings"))
        return sources
