"""Per-environment targets and ``--set`` overrides, applied to the located node tree."""

from __future__ import annotations

import re

from dbspec.errors import SpecError, UsageError, did_you_mean
from dbspec.spec.document import Document, Node, parse_value

#: Keys of a target that describe it rather than override the spec.
TARGET_META = ("mode", "default")
_SEGMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*$|^\d+$")


def list_targets(document: Document) -> list[str]:
    """Names of the targets the spec declares (empty when it declares none)."""
    targets = document.root.value.get("targets")
    if targets is None or not isinstance(targets.value, dict):
        return []
    return list(targets.value)


def apply_target(document: Document, target: str) -> Document:
    """Merge ``targets.<target>`` over the spec's own sections.

    Mappings merge key by key; lists and scalars are replaced. A section whose selector
    (``kind``; the ``name`` of the optimizer and scheduler) the target changes is replaced
    whole, so ``compute: {kind: ray}`` does not inherit the base's ``torch_distributor``
    settings. A target's ``mode`` and ``default`` describe it and are not merged.

    Raises:
        UsageError: the spec has no such target.
    """
    names = list_targets(document)
    if target not in names:
        known = ", ".join(names) if names else "none"
        raise UsageError(f"{document.file}: unknown target '{target}'"
                         f"{did_you_mean(target, names)}; the spec defines: {known}")
    root = document.root.copy()
    override = root.value["targets"].value[target]
    for key, child in (override.value if isinstance(override.value, dict) else {}).items():
        if key not in TARGET_META:
            _merge_into(root.value, key, child)
    return Document(document.file, root, document.text)


#: Where a key other than ``kind`` selects a section's kind (discriminated unions on ``name``).
_NAME_SELECTED = {("training", "optimizer"), ("training", "scheduler")}


def _switches_kind(path: tuple, existing: dict[str, Node], incoming: dict[str, Node]) -> bool:
    """Whether ``incoming`` changes the kind of the section at ``path``."""
    selectors = ("kind", "name") if path in _NAME_SELECTED else ("kind",)
    return any(k in existing and k in incoming and existing[k].value != incoming[k].value
               for k in selectors)


def _merge_into(mapping: dict[str, Node], key: str, incoming: Node, path: tuple = ()) -> None:
    existing = mapping.get(key)
    here = path + (key,)
    if existing is not None and isinstance(existing.value, dict) and \
            isinstance(incoming.value, dict) and not _switches_kind(here, existing.value,
                                                                    incoming.value):
        for sub_key, sub_child in incoming.value.items():
            _merge_into(existing.value, sub_key, sub_child, here)
    else:
        mapping[key] = incoming.copy()


def parse_assignment(text: str) -> tuple[tuple, object]:
    """Parse one ``--set dotted.path=value``; the value is read as YAML (``5`` is an int).

    Raises:
        UsageError: no ``=``, an empty or malformed path, or a value that is not valid YAML.
    """
    key, sep, raw_value = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise UsageError(f"--set {text!r}: expected dotted.path=value, e.g. training.epochs=5")
    segments = key.split(".")
    if not all(_SEGMENT.match(s) for s in segments):
        raise UsageError(f"--set {text!r}: '{key}' is not a dotted path of keys and list indices")
    try:
        value = parse_value(raw_value, "--set")
    except SpecError as exc:
        raise UsageError(f"--set {text!r}: {exc.diagnostics[0].message}") from None
    return tuple(int(s) if s.isdigit() else s for s in segments), value


def apply_assignments(document: Document, assignments: list[str]) -> Document:
    """Apply ``--set`` assignments in order; later ones win.

    Raises:
        UsageError: a path runs through a scalar, or a list index is out of range.
    """
    if not assignments:
        return document
    root = document.root.copy()
    for text in assignments:
        path, value = parse_assignment(text)
        set_path(root, path, value, origin=f"--set {text}")
    return Document(document.file, root, document.text)


def set_path(root: Node, path: tuple, value: object, *, origin: str) -> None:
    """Set ``value`` at ``path`` in a node tree, creating missing mappings on the way.

    Raises:
        UsageError: the path runs through a scalar or past the end of a list.
    """
    node = root
    for depth, element in enumerate(path):
        last = depth == len(path) - 1
        where = ".".join(str(p) for p in path[: depth + 1])
        if isinstance(node.value, dict):
            key = str(element)
            if last:
                node.value[key] = _node_from_value(value, origin, node.value.get(key))
                return
            if key not in node.value:
                node.value[key] = Node({}, origin=origin)
            node = node.value[key]
        elif isinstance(node.value, list):
            if not isinstance(element, int) or element >= len(node.value):
                raise UsageError(f"{origin}: '{where}' is not an index of a list of "
                                 f"{len(node.value)} items")
            if last:
                node.value[element] = _node_from_value(value, origin, node.value[element])
                return
            node = node.value[element]
        else:
            raise UsageError(f"{origin}: cannot set '{where}': its parent holds the value "
                             f"{node.value!r}, not a mapping")


def _node_from_value(value: object, origin: str, old: Node | None) -> Node:
    if isinstance(value, dict):
        built: object = {str(k): _node_from_value(v, origin, None) for k, v in value.items()}
    elif isinstance(value, list):
        built = [_node_from_value(v, origin, None) for v in value]
    else:
        built = value
    old = old or Node(None)  # keep the spot in the file, so errors still point somewhere useful
    return Node(built, old.line, old.column, old.key_line, old.key_column, origin)
