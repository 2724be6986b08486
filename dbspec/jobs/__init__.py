"""``dbspec jobs``: Databricks job definitions (bundle or Jobs API JSON) generated from a spec."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional, Sequence

from dbspec.errors import UsageError

FORMATS = ("bundle", "jobs-json")
_GENERATED = {"bundle": ("databricks.yml", "resources/*.yml", "specs/*", "scripts/*.sh"),
              "jobs-json": ("*.json", "scripts/*.sh")}


def generate(spec_file: str, *, targets: Sequence[str] = (), assignments: Sequence[str] = (),
             fmt: str = "bundle") -> tuple[dict[str, str], list[str]]:
    """(relative path -> content, warnings) for ``spec_file`` and the chosen targets.

    Raises:
        UsageError: unknown target, unreadable spec.
        SpecError: the spec (or one of its targets) is invalid.
    """
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
    modes = {n: declared[n].mode if n in declared else "development" for n in specs}
    if not declared:
        default: Optional[str] = "default"
    else:
        default = next((n for n in specs if declared[n].default), None) or (
            names[0] if len(names) == 1 else None)
    shown = _shown_path(spec_file)
    warnings = [f"{name}: {w}" for name, spec in specs.items() for w in warnings_for(spec)]
    command = "dbspec jobs " + shown + "".join(f" --target {t}" for t in targets) + \
        "".join(f" --set {a}" for a in assignments) + f" --format {fmt} -o DIR"
    if fmt == "jobs-json":
        from dbspec.jobs.resources import jobs_json_warnings

        warnings += [f"{name}: {w}" for name, spec in specs.items()
                     for w in [*_principal(spec), *jobs_json_warnings(spec)]]
        return jobs_json_files(specs, spec_file=shown, spec_targets=spec_targets,
                               command=command), warnings
    text = Path(spec_file).read_text(encoding="utf-8")
    return bundle_files(specs, modes, default,
                        spec_file=shown, spec_text=text, command=command,
                        spec_targets=spec_targets, base=base), warnings


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


def run_jobs(args) -> int:
    """The ``jobs`` command: write the files, or with ``--check`` compare them."""
    from dbspec.jobs.render import check, generated_by_dbspec, write

    files, warnings = generate(args.file, targets=args.targets, assignments=args.assignments,
                               fmt=args.format)
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    directory = Path(args.output)
    patterns = _GENERATED[args.format]
    if args.check:
        problems, foreign = check(directory, files, patterns)
        for problem in problems:
            print(f"{directory / problem.path}: {problem.text}")
        for relative in foreign:
            print(f"{directory / relative}: foreign (not written by dbspec; left alone)")
        if problems:
            print(f"{len(problems)} generated file(s) out of date: rerun without --check",
                  file=sys.stderr)
            return 1
        print(f"{directory}: {len(files)} generated file(s) up to date")
        return 0
    if directory.exists() and not directory.is_dir():
        raise UsageError(f"-o {directory}: exists and is not a directory")
    clashes = [r for r in sorted(files) if (directory / r).exists()
               and not generated_by_dbspec(directory / r)
               and (directory / r).read_text(encoding="utf-8", errors="replace") != files[r]]
    if clashes:
        raise UsageError(f"-o {directory}: " + ", ".join(clashes) + " would be overwritten but "
                         "was not written by dbspec (no generated header); move it away or "
                         "choose another -o directory")
    try:
        changed = write(directory, files, patterns)
    except OSError as exc:
        raise UsageError(f"cannot write to {directory}: {exc.strerror or exc}") from None
    for relative in changed:
        print(f"wrote {directory / relative}" if not relative.endswith("(removed)")
              else f"removed {directory / relative.removesuffix(' (removed)')}")
    if not changed:
        print(f"{directory}: {len(files)} generated file(s) already up to date")
    return 0
