"""``dbspec diff OLD NEW``: the spec values that changed and the stages they would rerun.

Both specs are compiled into plans; a stage reruns when its fingerprint changes, because of a
value it reads itself or because an upstream stage reruns. Values are compared after targets,
``--set`` and templates are applied, so ``vars.hidden`` shows up with the layer widths it sets.
"""

from __future__ import annotations

from typing import Any

from dbspec.plan.compile import compile_plan

_ABSENT = "<absent>"


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Leaves of a JSON-like value by dotted path (``model.layers[0].linear.out``); an empty
    mapping or list is a leaf."""
    if isinstance(value, dict) and (value or not prefix):
        items = [(f"{prefix}.{key}" if prefix else str(key), item) for key, item in value.items()]
    elif isinstance(value, list) and value:
        items = [(f"{prefix}[{i}]", item) for i, item in enumerate(value)]
    else:
        return {prefix: value}
    return {path: leaf for key, item in items for path, leaf in flatten(item, key).items()}


def _reads(path: str, prefixes: tuple[str, ...]) -> bool:
    return any(path == p or path.startswith(p + ".") or path.startswith(p + "[")
               for p in prefixes)


def spec_diff(old, new) -> dict[str, Any]:
    """Changed values and affected stages between two validated specs (``Spec`` objects)."""
    before = flatten(old.model_dump(mode="json"))
    after = flatten(new.model_dump(mode="json"))
    changes = [{"path": path, "old": before.get(path, _ABSENT), "new": after.get(path, _ABSENT)}
               for path in sorted(set(before) | set(after), key=_order(before, after))
               if before.get(path, _ABSENT) != after.get(path, _ABSENT)]
    old_plan, new_plan = compile_plan(old), compile_plan(new)
    stages = []
    for stage in new_plan:
        if stage.name not in old_plan.names:
            stages.append({"stage": stage.name, "action": "added", "because": []})
            continue
        if old_plan[stage.name].fingerprint == stage.fingerprint:
            continue
        own = [c["path"] for c in changes if _reads(c["path"], stage.reads)]
        upstream = [d for d in stage.depends_on
                    if any(s["stage"] == d for s in stages)]
        because = own + [f"upstream {d} reruns" for d in upstream]
        stages.append({"stage": stage.name, "action": "reruns",
                       "because": because or ["its inputs changed"]})
    for name in old_plan.names:
        if name not in new_plan.names:
            stages.append({"stage": name, "action": "removed", "because": []})
    unchanged = [s.name for s in new_plan if s.name in old_plan.names
                 and old_plan[s.name].fingerprint == s.fingerprint]
    return {"changes": changes, "stages": stages, "unchanged": unchanged}


def _order(before: dict, after: dict):
    """Document order: paths of the new spec first as they appear, then removed ones."""
    position = {path: i for i, path in enumerate(list(after) + [p for p in before
                                                                  if p not in after])}
    return lambda path: position[path]


def render_diff(diff: dict[str, Any], old_name: str, new_name: str) -> str:
    """A reviewer's summary: changed values, then what reruns and why."""
    import json

    def show(value: Any) -> str:
        return value if value == _ABSENT else json.dumps(value)

    lines = [f"--- {old_name}", f"+++ {new_name}"]
    if not diff["changes"]:
        lines.append("no value changed")
    for change in diff["changes"]:
        lines.append(f"  {change['path']}: {show(change['old'])} -> {show(change['new'])}")
    lines.append("")
    if not diff["stages"]:
        lines.append("no stage reruns")
    for stage in diff["stages"]:
        reason = f" ({'; '.join(stage['because'])})" if stage["because"] else ""
        lines.append(f"  {stage['stage']:<13} {stage['action']}{reason}")
    if diff["unchanged"] and diff["stages"]:
        lines.append(f"  unchanged     {', '.join(diff['unchanged'])}")
    return "\n".join(lines)
