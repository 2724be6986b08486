"""Plans as text for people, JSON for tools and Mermaid for docs."""

from __future__ import annotations

import json
from typing import Mapping, Optional

from dbspec.plan.compile import Plan


def render_text(plan: Plan, statuses: Optional[Mapping[str, str]] = None) -> str:
    """An aligned table: stage, fingerprint, dependencies, what it reads; with ``statuses``
    (stage name to ``cached`` / ``stale`` / ``new`` / ``resumable``) a status column too."""
    head = ("stage", "fingerprint") + (("status",) if statuses is not None else ()) + \
        ("depends on", "reads")
    rows = [head]
    rows += [(s.name, s.fingerprint)
             + ((statuses.get(s.name, "new"),) if statuses is not None else ())
             + (", ".join(s.depends_on) or "-", ", ".join(s.reads)) for s in plan.stages]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head) - 1)]
    lines = [f"plan for {plan.spec_name}: {len(plan.stages)} stages"]
    for row in rows:
        lines.append("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:-1]))
                     + "  " + row[-1])
    return "\n".join(lines)


def render_json(plan: Plan, statuses: Optional[Mapping[str, str]] = None) -> str:
    """``{"stages": [{"name", "depends_on", "reads", "fingerprint"[, "status"]}]}``."""
    data = plan.to_dict()
    if statuses is not None:
        for stage in data["stages"]:
            stage["status"] = statuses.get(stage["name"], "new")
    return json.dumps(data, indent=2)


def render_mermaid(plan: Plan, statuses: Optional[Mapping[str, str]] = None) -> str:
    """A Mermaid flowchart, one node per stage (with its status, when given), one edge per
    dependency."""
    lines = ["flowchart TD"]
    for stage in plan.stages:
        status = f" {statuses.get(stage.name, 'new')}" if statuses is not None else ""
        lines.append(f'    {stage.name}["{stage.name}<br/><small>{stage.fingerprint}'
                     f'{status}</small>"]')
    for stage in plan.stages:
        for dep in stage.depends_on:
            lines.append(f"    {dep} --> {stage.name}")
    return "\n".join(lines)


RENDERERS = {"text": render_text, "json": render_json, "mermaid": render_mermaid}
