"""From a spec file to a validated, frozen :class:`Spec`, reporting every problem in one pass.

Steps: read and parse (located nodes) -> merge the target -> apply ``--set`` -> render templates
-> validate types (pydantic) -> semantic checks -> search-space checks.
"""

from __future__ import annotations

import re
from typing import Any, Iterable, NamedTuple, Optional, Sequence

from pydantic import BaseModel, ValidationError

from dbspec.errors import Diagnostic, SpecError, did_you_mean
from dbspec.spec.document import Document, Node, format_path, read_document
from dbspec.spec.layout import encoder_of, is_encoded
from dbspec.spec.sections import Spec
from dbspec.spec.sections.search import FloatDistribution
from dbspec.spec.overrides import apply_assignments, apply_target, list_targets, set_path
from dbspec.spec.semantics import check_spec
from dbspec.spec.templating import is_template, render_document


class LoadedSpec(NamedTuple):
    """A validated spec with where it came from: the ``target`` applied, if any, and the
    ``warnings`` (findings that do not make it invalid).

    ``source`` is the document after target and ``--set``, before templating; search trials
    apply their values there so templates see them.
    """

    spec: Spec
    source: Document
    target: Optional[str] = None
    warnings: tuple[Diagnostic, ...] = ()

    @property
    def file(self) -> str:
        """The spec file."""
        return self.source.file


def default_target(document: Document) -> Optional[str]:
    """The target marked ``default: true``, if any."""
    targets = document.root.value.get("targets")
    nodes = targets.value if targets is not None and isinstance(targets.value, dict) else {}
    return next((name for name, node in nodes.items() if isinstance(node.value, dict)
                 and getattr(node.value.get("default"), "value", False) is True), None)


def load_spec(path: str, *, target: Optional[str] = None,
              assignments: Sequence[str] = ()) -> LoadedSpec:
    """Load and validate one spec for one target (``None``: the default target, if any).

    Raises:
        UsageError: unreadable file, unknown target, malformed ``--set``.
        SpecError: the spec is invalid; ``diagnostics`` holds every finding.
    """
    document = read_document(path)
    target = target or default_target(document)
    return build(document, target=target, assignments=assignments)


def build(document: Document, *, target: Optional[str] = None,
          assignments: Sequence[str] = (), check_search: bool = True) -> LoadedSpec:
    """Validate a parsed document for one target; see :func:`load_spec`."""
    source = apply_target(document, target) if target else document
    return _validate(apply_assignments(source, list(assignments)), target=target,
                     check_search=check_search)


def from_source(source: Document, target: Optional[str] = None) -> LoadedSpec:
    """Validate a document that already has its target and ``--set`` applied (a worker's copy)."""
    return _validate(source, target=target, check_search=False)


def apply_values(loaded: LoadedSpec, values: dict[str, Any], *,
                 defaults: Optional[dict[str, Any]] = None) -> LoadedSpec:
    """A new spec with ``values`` set at dotted paths (a search trial's suggestions).

    Raises:
        UsageError: a path runs through a scalar or past a list.
        SpecError: the result is invalid.
    """
    root = loaded.source.root.copy()
    if defaults is None:
        defaults = loaded.spec.model_dump(mode="json", by_alias=True)
        _default_encoders(loaded.spec, defaults)
    for dotted, value in values.items():
        path = tuple(int(p) if p.isdigit() else p for p in dotted.split("."))
        origin = f"search value {dotted}={value!r}"
        _materialize(root, path, defaults, origin)
        _switch_kind(root, path, value)
        set_path(root, path, value, origin=origin)
    return _validate(Document(loaded.source.file, root, loaded.source.text),
                     target=loaded.target, check_search=False)


def _default_encoders(spec: Spec, defaults: dict[str, Any]) -> None:
    """The encoders typed features get by default, written into ``defaults``: a search over
    ``model.encoders.text.dim`` works when the file leaves the encoder to its default."""
    encoders = defaults.get("model", {}).setdefault("encoders", {})
    for feature in spec.data.features or ():
        if is_encoded(feature) and feature.name not in encoders:
            encoders[feature.name] = encoder_of(feature, spec.model).model_dump(mode="json")


def _switch_kind(root: Node, path: tuple, value: Any) -> None:
    """Before a search sets a section's selector (``kind``, or an optimizer's ``name``) to
    another value, drop the settings the new kind does not take: ``hidden`` belongs to a
    ``gru`` encoder, not to the ``bag`` a trial switches it to."""
    if path[-1] not in ("kind", "name") or len(path) < 2:
        return
    node: Optional[Node] = root
    for element in path[:-1]:
        node = node.child(element) if node is not None else None
    if node is None or not isinstance(node.value, dict) or path[-1] not in node.value \
            or node.value[path[-1]].value == value:
        return
    accepted = _kind_settings(path[:-1], path[-1], value)
    if accepted is not None:
        for key in [k for k in node.value if k not in accepted]:
            del node.value[key]


def _kind_settings(path: tuple, selector: str, value: Any) -> Optional[set[str]]:
    """The keys the section at ``path`` takes when its ``selector`` is ``value`` (the member of
    the union of kinds there), or None when no model at ``path`` has that selector value."""
    # loaded only when a search switches a kind
    from dbspec.spec.translate import models_at, select_members

    chosen = select_members(models_at(Spec, path), selector, value)
    return {key for n, f in chosen[0].model_fields.items() for key in (n, f.alias) if key} \
        if chosen else None


def _materialize(root: Node, path: tuple, defaults: dict[str, Any], origin: str) -> None:
    """Write out the sections on ``path`` that the file leaves to defaults.

    Setting ``training.optimizer.lr`` in a file without an optimizer section must keep the
    default optimizer (its ``name``); only the selector keys are written, so that setting the
    selector itself (``training.optimizer.name: sgd``) leaves no settings of the old kind.
    """
    node, value = root, defaults
    for element in path[:-1]:
        value = value.get(element) if isinstance(value, dict) else None
        if not isinstance(node.value, dict) or not isinstance(value, dict):
            return
        if element not in node.value:
            selectors = {k: value[k] for k in ("kind", "name") if k in value}
            set_path(node, (element,), selectors, origin=origin)
        node = node.value[element]


def _validate(source: Document, *, target: Optional[str], check_search: bool) -> LoadedSpec:
    rendered = render_document(source)
    try:
        spec, diagnostics = Spec.model_validate(rendered.root.to_data()), []
    except ValidationError as exc:
        spec, diagnostics = _past_unknown_keys(exc, rendered)
    diagnostics += [rendered.diagnostic(f.path, f.message, "warning" if f.warning else "error",
                                        at_key=f.at_key) for f in check_spec(spec)]
    if check_search and spec.search is not None:
        diagnostics.extend(_check_space(spec, source, diagnostics))
    if any(d.severity == "error" for d in diagnostics):
        raise SpecError(diagnostics)
    return LoadedSpec(spec, source, target, tuple(diagnostics))


def _past_unknown_keys(exc: ValidationError, rendered: Document) -> tuple[Spec, list[Diagnostic]]:
    """The spec without its unknown keys (they change nothing, so the checks across fields
    still tell the truth), and the type errors; a SpecError when a value is wrong too (the
    checks would judge a default in its place)."""
    from dbspec.spec.translate import translate, unknown_keys  # only when something is wrong

    diagnostics = translate(exc, rendered, Spec)
    paths = unknown_keys(exc, rendered)
    if paths is None:
        raise SpecError(diagnostics) from None
    root = rendered.root.copy()
    for path in paths:
        parent: Optional[Node] = root
        for element in path[:-1]:
            parent = parent.child(element) if parent is not None else None
        if parent is not None and isinstance(parent.value, dict):
            parent.value.pop(path[-1], None)
    try:
        return Spec.model_validate(root.to_data()), diagnostics
    except ValidationError as hidden:  # a model's own check, which the unknown keys kept back
        raise SpecError(diagnostics + translate(hidden, rendered, Spec)) from None


def _check_space(spec: Spec, source: Document, known: list[Diagnostic]) -> list[Diagnostic]:
    """Each search path must exist and accept the distribution's values.

    Each bound or choice is applied to the spec and validated; only errors it adds to the
    ``known`` ones are blamed on it.
    """
    out: list[Diagnostic] = []
    baseline = {(d.path, d.message) for d in known}
    loaded = LoadedSpec(spec, source)
    # Linear, not quadratic, in the number of entries: samples are checked on the spec without
    # its search section (a sample does not change it), the defaults are dumped once, and a
    # var that no template names cannot make the spec invalid, so its samples are not tried.
    without_search = LoadedSpec(spec, Document(source.file, Node(
        {k: v for k, v in source.root.value.items() if k != "search"}, source.root.line,
        source.root.column), source.text))
    defaults = spec.model_dump(mode="json", by_alias=True)
    _default_encoders(spec, defaults)
    named = set(re.findall(r"[A-Za-z_]\w*", " ".join(
        node.value for _, node in source.root.walk() if is_template(node.value))))
    for dotted, dist in spec.search.space.items():
        where = ("search", "space", dotted)
        if any(d.path == format_path(where) for d in known):
            continue  # already reported: one complaint per entry
        current, problem = _lookup(spec, dotted)
        if problem:
            out.append(source.diagnostic(where, problem, at_key=True))
            continue
        if isinstance(current, int) and not isinstance(current, bool) and \
                isinstance(dist, FloatDistribution) and not dotted.startswith("vars."):
            out.append(source.diagnostic(where, f"'{dotted}' holds an integer ({current}); use "
                                         "an int distribution", at_key=True))
            continue
        parts = dotted.split(".")
        if parts[0] == "vars" and len(parts) > 1 and parts[1] not in named \
                and "vars" not in named:
            continue
        trial = loaded if parts[0] == "search" else without_search
        for sample in getattr(dist, "low_high", None) or dist.choices:
            try:
                apply_values(trial, {dotted: sample}, defaults=defaults)
            except SpecError as exc:
                new = [d for d in exc.diagnostics if d.severity == "error"
                       and (d.path, d.message) not in baseline]
                if new:
                    out.append(source.diagnostic(where, f"the value {sample!r} makes the spec "
                                                 f"invalid: {new[0].path}: {new[0].message}",
                                                 at_key=True))
                    break
    return out


def _typed_feature(spec: Spec, name: str) -> Any:
    """The typed, non-numeric feature ``name`` of ``data.features``, or None."""
    return next((f for f in spec.data.features or () if is_encoded(f) and f.name == name),
                None)


def _lookup(spec: Spec, dotted: str) -> tuple[Any, Optional[str]]:
    """The value at ``dotted`` in ``spec``, or why there is no value to search there."""
    node: Any = spec
    walked: list[str] = []
    for part in dotted.split("."):
        if isinstance(node, BaseModel):
            fields = {(f.alias or n): n for n, f in type(node).model_fields.items()}
            if part not in fields:
                here = ".".join(walked) or "the spec"
                return None, (f"'{dotted}' is not a field: {here} has no '{part}'"
                              f"{did_you_mean(part, fields)}")
            node = getattr(node, fields[part])
        elif isinstance(node, dict):
            if part in node:
                node = node[part]
            elif walked == ["model", "encoders"] and _typed_feature(spec, part) is not None:
                node = encoder_of(_typed_feature(spec, part), spec.model)  # its default
            else:
                return None, (f"'{dotted}' is not set: {'.'.join(walked)} has no '{part}'"
                              f"{did_you_mean(part, node)}")
        elif isinstance(node, (list, tuple)):
            if not part.isdigit() or int(part) >= len(node):
                return None, (f"'{dotted}': {'.'.join(walked)} has {len(node)} entries, "
                              f"no '{part}'")
            node = node[int(part)]
        elif node is None:
            return None, f"'{dotted}': {'.'.join(walked)} is not set in this spec"
        else:
            return None, f"'{dotted}': {'.'.join(walked)} is a value, not a section"
        walked.append(part)
    if isinstance(node, (BaseModel, dict, list)):
        return None, f"'{dotted}' is a section; search a value inside it"
    return node, None


def validate_file(path: str, *, target: Optional[str] = None,
                  assignments: Sequence[str] = ()) -> list[Diagnostic]:
    """Every finding for a file: for one target, or for the spec and each of its targets.

    Returns:
        Diagnostics (errors and warnings), deduplicated, in file order.

    Raises:
        UsageError: the file cannot be read, or the target does not exist.
    """
    try:
        document = read_document(path)
    except SpecError as exc:
        return list(exc.diagnostics)
    targets = [target] if target else [None, *list_targets(document)]
    found: dict[tuple, Diagnostic] = {}
    for name in targets:
        # the first pass checks the whole targets section; each target's pass needs only that
        # target (validating all of them for each one made this quadratic in the spec's size)
        checked = _only_target(document, name) if name and not target else document
        try:
            diagnostics: Iterable[Diagnostic] = build(checked, target=name,
                                                      assignments=assignments).warnings
        except SpecError as exc:
            diagnostics = exc.diagnostics
        for diag in diagnostics:
            if name and not target:
                diag = diag._replace(message=f"{diag.message} [target {name}]")
            found.setdefault((diag.line, diag.column, diag.path, diag.message.split(" [target")[0]),
                             diag)
    merged = {(d.line, d.column) for d in found.values() if not d.path.startswith("targets.")}
    # a mistake inside a target shows up twice: in targets.<name> and merged; keep the latter
    kept = [d for d in found.values()
            if not (d.path.startswith("targets.") and (d.line, d.column) in merged)]
    return sorted(kept, key=lambda d: (d.line, d.column))


def _only_target(document: Document, target: str) -> Document:
    """The document with its ``targets`` section cut down to ``target`` (nodes shared)."""
    targets = document.root.value["targets"]  # a mapping: list_targets named ``target``
    kept = Node({target: targets.value[target]}, targets.line, targets.column,
                targets.key_line, targets.key_column, targets.origin)
    root = Node({**document.root.value, "targets": kept}, document.root.line,
                document.root.column, origin=document.root.origin)
    return Document(document.file, root, document.text)


__all__ = ["LoadedSpec", "load_spec", "build", "apply_values", "validate_file", "format_path"]
