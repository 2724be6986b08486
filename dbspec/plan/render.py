"""Plans as text for people, JSON for tools and Mermaid for docs."""

from __future__ import annotations

import json

from dbspec.plan.compile import Plan


def render_text(plan: Plan) -> str:
    """An aligned table: stage, fingerprint, dependencies, what it reads."""
    rows = [("stage", "fingerprint", "depends on", "reads")]
    rows += [(s.name, s.fingerprint, ", ".join(s.depends_on) or "-", ", ".join(s.reads))
             for s in plan.stages]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = [f"plan for {plan.spec_name}: {len(plan.stages)} stages"]
    for row in rows:
        lines.append("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:3]))
                     + "  " + row[3])
    return "\n".join(lines)


def render_json(plan: Plan) -> str:
    """``{"stages": [{"name", "depends_on", "reads", "fingerprint"}]}``."""
    return json.dumps(plan.to_dict(), indent=2)


def render_mermaid(plan: Plan) -> str:
    """A Mermaid flowchart, one node per stage, one edge per dependency."""
    lines = ["flowchart TD"]
    for stage in plan.stages:
        lines.append(f'    {stage.name}["{stage.name}<br/><small>{stage.fingerprint}</small>"]')
    for stage in plan.stages:
        for dep in stage.depends_on:
            lines.append(f"    {dep} --> {stage.name}")
    return "\n".join(lines)


RENDERERS = {"text": render_text, "json": render_json, "mermaid": render_mermaid}
