"""Generating a spec's job definitions: every target's spec built, then rendered as a bundle or
as Jobs API bodies, with the warnings a reviewer should see."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional, Sequence

from dbspec.errors import UsageError

#: ``--format`` values.
FORMATS = ("bundle", "jobs-json")


def generate(spec_file: str, *, targets: Sequence[str] = (), assignments: Sequence[str] = (),
             fmt: str = "bundle", output: Optional[str] = None
             ) -> tuple[dict[str, str], list[str]]:
    """(relative path -> content, warnings) for ``spec_file`` and the chosen targets, to be
    written to ``output`` (the wheel's build command names the checkout relative to it).

    Raises:
        UsageError: unknown target, unreadable spec.
        SpecError: the spec (or one of its targets) is invalid.
    """
    from dbspec.jobs.delivery import delivery
    from dbspec.jobs.deployment import deployment_warnings
    from dbspec.jobs.monitor import monitor_warnings
    from dbspec.jobs.render import bundle_files, jobs_json_files, warnings_for
    from dbspec.spec.document import read_document
    from dbspec.spec.loader import build

    document = read_document(spec_file)
    base = build(document, assignments=assignments).spec  # no target: the bundle's defaults
    declared = base.targets
    names = list(targets) or list(declared)
    for name in names:
        if name not in declared:
            known = ", ".join(declared) or "none"
            raise UsageError(f"{spec_file}: no target '{name}' (targets: {known})")
    spec_targets: dict[str, Optional[str]] = {n: n for n in names} or {"default": None}
    specs = {bundle_name: build(document, target=spec_target, assignments=assignments).spec
             for bundle_name, spec_target in spec_targets.items()}
    _refuse_local_paths(document, specs, spec_targets)
    modes = {n: declared[n].mode if n in declared else "development" for n in specs}
    if not declared:
        default: Optional[str] = "default"
    else:
        default = next((n for n in specs if declared[n].default), None) or (
            names[0] if len(names) == 1 else None)
    shown = _shown_path(spec_file)
    warnings = [f"{name}: {w}" for name, spec in specs.items()
                for w in [*warnings_for(spec), *deployment_warnings(spec),
                          *monitor_warnings(spec, modes[name] if fmt == "bundle" else None)]]
    command = "dbspec jobs " + shown + "".join(f" --target {t}" for t in targets) + \
        "".join(f" --set {a}" for a in assignments) + f" --format {fmt} -o DIR"
    how = delivery(output)
    if how.checkout is None:
        warnings.append(f"the tasks install '{how.pinned}' (this dbspec is no source checkout "
                        "to build a wheel from): the workspace's package index must serve it")
    text = Path(spec_file).read_text(encoding="utf-8")
    if fmt == "jobs-json":
        from dbspec.jobs.resources import jobs_json_warnings

        warnings += [f"{name}: {w}" for name, spec in specs.items()
                     for w in [*_principal(spec), *jobs_json_warnings(spec)]]
        return jobs_json_files(specs, spec_file=shown, spec_text=text, command=command,
                               spec_targets=spec_targets, how=how), warnings
    return bundle_files(specs, modes, default,
                        spec_file=shown, spec_text=text, command=command,
                        spec_targets=spec_targets, base=base, how=how), warnings


def _refuse_local_paths(document, specs: dict, spec_targets: dict) -> None:
    """Raise one SpecError for every local path of every target's spec (see local_paths)."""
    local = [d for name, spec in specs.items()
             for d in local_paths(document, spec, spec_targets[name])]
    if local:
        from dbspec.errors import SpecError

        raise SpecError(dict.fromkeys(local))


def local_paths(document, spec, target: Optional[str]) -> list:
    """Located errors for the paths of ``spec`` that name this machine's files (relative, or
    no path a cluster has): a job runs on Databricks, where they do not exist."""
    import re

    batch = getattr(spec.serving, "batch", None)
    found = []
    for path, value in ((("data", "source", "path"), getattr(spec.data.source, "path", None)),
                        (("serving", "batch", "input"), batch and batch.input)):
        text = str(value or "")
        if not text or re.match(r"^([A-Za-z][\w+.-]*:|/)", text) or (
                path[-1] == "input" and "/" not in text and "." in text
                and not re.search(r"\.(csv|parquet|json)$", text)):  # a table name
            continue
        override = ("targets", target, *path)
        where = override if target and document.locate(override)[2] else path
        found.append(document.diagnostic(where, f"'{text}' is relative to where dbspec runs, and "
                                         "a job runs on Databricks, where it does not exist: "
                                         "upload it to a Unity Catalog Volume and give the "
                                         "/Volumes/... path (in a target for the job)"))
    return found


def _principal(spec) -> list[str]:
    """A dedicated cluster with no principal: Jobs API bodies have no current-user reference."""
    from dbspec.spec.clusters import CURRENT_USER, resolve_cluster, serverless

    if serverless(spec):
        return []
    return [f"jobs.{'cluster' if key == 'main' else 'training_cluster'}.single_user_name is "
            "unset: the cluster uses dedicated access mode (Unity Catalog), and a jobs/create "
            "body cannot name the deploying user; set it to the user or group the job runs as"
            for key in ("main", "training")
            if resolve_cluster(spec, key).single_user_name == CURRENT_USER][:1]


def _shown_path(spec_file: str) -> str:
    relative = os.path.relpath(os.path.abspath(spec_file))
    return (relative if not relative.startswith("..") else os.path.abspath(spec_file)) \
        .replace(os.sep, "/")
