"""Commands that read specs and change nothing: validate, plan, diff, schema, and init.

They stay free of torch, mlflow, pyspark, optuna and deepspeed (a test checks it), so a
pull-request check is fast: every import of dbspec beyond the spec language happens inside
a handler.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Sequence

from dbspec.cli.options import (Command, DeprecatedAlias, add_format_option, add_spec_options,
                                load_spec_arguments)
from dbspec.errors import DbspecError, Diagnostic, UsageError

_VALIDATE_FORMATS = ("text", "json", "github", "sarif")


def _validate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", metavar="SPEC", help="spec files")
    add_spec_options(parser)
    parser.add_argument("--format", choices=_VALIDATE_FORMATS, default="text",
                        help="text (default), json, github workflow annotations, or sarif "
                             "(2.1.0, for code scanning)")
    parser.add_argument("--strict", action="store_true", help="treat warnings as errors")


def _validate(args: argparse.Namespace) -> int:
    from dbspec.spec.loader import validate_file

    results: list[Diagnostic] = []
    status = 0
    for file in args.files:
        try:
            found = validate_file(file, target=args.target, assignments=args.assignments)
        except DbspecError as exc:
            found = [Diagnostic(file, 0, 0, "", str(exc).removeprefix(f"{file}: "))]
            status = max(status, exc.exit_code)
        if args.strict:
            found = [Diagnostic(**{**d.to_dict(), "severity": "error"}) for d in found]
        if any(d.severity == "error" for d in found):
            status = max(status, 1)
        results.extend(found)
        if args.format == "text":
            _print_text(file, found)
    _print_report(args.format, results)
    _print_summary(args.files, results, to=sys.stdout if args.format == "text" else sys.stderr)
    return status


def _print_text(file: str, found: list[Diagnostic]) -> None:
    for diag in found:
        print(diag.format())
    if not any(d.severity == "error" for d in found):
        warnings = sum(d.severity == "warning" for d in found)
        print(f"{file}: ok" + (f" ({warnings} warning{'s' * (warnings != 1)})" if warnings else ""))


def _print_report(form: str, results: list[Diagnostic]) -> None:
    """The machine-readable report of ``--format`` json, github or sarif (text: printed as
    each file is checked)."""
    if form == "json":
        print(json.dumps([d.to_dict() for d in results], indent=2))
    elif form == "github":
        from dbspec.spec.report import github_annotation

        for diag in results:
            print(github_annotation(diag))
    elif form == "sarif":
        from dbspec import __version__
        from dbspec.spec.report import sarif

        print(json.dumps(sarif(results, version=__version__), indent=2))


def _print_summary(files: Sequence[str], results: list[Diagnostic], *, to) -> None:
    errors = sum(d.severity == "error" for d in results)
    warnings = len(results) - errors
    bad = len({d.file for d in results if d.severity == "error"})
    noun = "file" if len(files) == 1 else "files"
    verdict = "all valid" if not bad else f"{bad} invalid"
    print(f"{len(files)} {noun} checked: {verdict}, {errors} error{'s' * (errors != 1)}, "
          f"{warnings} warning{'s' * (warnings != 1)}", file=to)


def _plan_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="SPEC", help="spec file")
    add_spec_options(parser)
    parser.add_argument("--format", choices=("text", "json", "mermaid"), default="text",
                        help="text (default), json or mermaid")
    parser.add_argument("--state-dir", metavar="DIR", default=None,
                        help="show each stage's status (cached, stale, resumable, new) against "
                             "this state dir (default: .dbspec, when it exists)")
    parser.add_argument("--smoke", action="store_true",
                        help="the status against the --smoke runs' state")


def _plan(args: argparse.Namespace) -> int:
    from dbspec.executors.plan_status import plan_with_statuses
    from dbspec.plan.render import RENDERERS

    loaded = load_spec_arguments(args)
    state_dir = Path(args.state_dir) if args.state_dir is not None else None
    plan, statuses, note = plan_with_statuses(loaded, state_dir, smoke=args.smoke)
    if note:
        print(f"warning: {note}", file=sys.stderr)
    print(RENDERERS[args.format](plan, statuses))
    if args.format == "text":
        from dbspec.spec.layout import describe_inputs

        lines = describe_inputs(loaded.spec)
        if lines:
            print("\n".join(lines))
    return 0


def _diff_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("old", metavar="OLD", help="spec file, or REV:PATH from git")
    parser.add_argument("new", metavar="NEW", help="spec file, or REV:PATH from git")
    add_spec_options(parser)
    add_format_option(parser, "json")


def _diff(args: argparse.Namespace) -> int:
    from dbspec.plan.diff import render_diff, spec_diff
    from dbspec.spec.loader import build, default_target

    specs = []
    for given in (args.old, args.new):
        document = _read_revision(given)
        target = args.target or default_target(document)
        specs.append(build(document, target=target, assignments=args.assignments).spec)
    diff = spec_diff(*specs)
    print(json.dumps(diff, indent=2) if args.format == "json"
          else render_diff(diff, args.old, args.new))
    return 0


def _read_revision(given: str):
    """A spec document from a file, or from ``REV:PATH`` in the current git repository."""
    import subprocess

    from dbspec.spec.document import parse_document, read_document

    if os.path.exists(given) or ":" not in given:
        return read_document(given)
    revision, _, path = given.partition(":")
    if revision.startswith("-"):  # git would take it for an option (--output=FILE writes)
        raise UsageError(f"{given}: not a file, and '{revision}' is not a git revision "
                         "(revisions never start with '-')")
    try:  # after --end-of-options git reads REV:PATH as a revision, never as an option
        shown = subprocess.run(["git", "show", "--end-of-options", f"{revision}:{path}"],
                               capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UsageError(f"{given}: cannot run git: {exc}") from None
    if shown.returncode != 0:
        raise UsageError(f"{given}: no such file, and git cannot show it: "
                         f"{shown.stderr.strip().splitlines()[-1] if shown.stderr else ''}")
    return parse_document(shown.stdout, given)


def _schema_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-o", "--output", metavar="PATH", help="write to PATH instead of stdout")


def _schema(args: argparse.Namespace) -> int:
    from dbspec.spec.schema import schema_text

    text = schema_text()
    if not args.output:
        sys.stdout.write(text)
        return 0
    _write_text(Path(args.output), text)
    print(f"wrote {args.output}", file=sys.stderr)
    return 0


def _write_text(path: Path, text: str) -> None:
    """Write ``path`` (and its directory); an unwritable path is a usage error."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None


def _init_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("data", metavar="DATA", help="a CSV or Parquet file, or a Delta table")
    parser.add_argument("-o", "--output", metavar="SPEC",
                        help="where to write the spec (default: here, the data file's stem and "
                             ".yaml)")
    parser.add_argument("--label", metavar="COLUMN",
                        help="the column to predict (default: one named target/label/y/class..., "
                             "else the last)")
    parser.add_argument("--target", dest="label", action=DeprecatedAlias, use="--label")
    parser.add_argument("--task", choices=("regression", "binary", "multiclass"),
                        help="the task (default: inferred from the target's values)")
    parser.add_argument("--delimiter", default=",", help="CSV field delimiter (default: ,)")
    parser.add_argument("--name", help="the spec's name (default: from the data file's name)")
    parser.add_argument("--force", action="store_true", help="overwrite an existing spec file")


def _init(args: argparse.Namespace) -> int:
    from dbspec.paths import NAME_PATTERN, NAME_RULE, check_name
    from dbspec.scaffold import default_names, infer, render

    data = Path(args.data)
    name, output = default_names(data, name=args.name, output=args.output)
    check_name(name, "--name", pattern=NAME_PATTERN, rule=NAME_RULE)
    if output.exists() and not args.force:
        raise UsageError(f"{output} exists; give another -o, or --force to overwrite it")
    if len(args.delimiter) != 1:
        raise UsageError(f"--delimiter must be one character, not {args.delimiter!r}")
    scaffold = infer(data, target=args.label, task=args.task, delimiter=args.delimiter)
    _write_text(output, render(scaffold, name=name))
    print(f"wrote {output}: {scaffold.task} on {len(scaffold.features)} feature(s), target "
          f"{scaffold.target!r}" + (f"; left out (not numeric): {', '.join(scaffold.skipped)}"
                                    if scaffold.skipped else ""), file=sys.stderr)
    _print_next_steps(output)
    return 0


def _print_next_steps(spec: Path) -> None:
    """What to run next, quoted so that it works when pasted (a data file's name may hold
    spaces)."""
    import shlex

    pasted = shlex.quote(str(spec))
    print(f"next: dbspec validate {pasted} && dbspec run {pasted} --smoke", file=sys.stderr)


COMMANDS = (
    Command("validate", "check specs and report every error (exit 1 when invalid)",
            _validate_arguments, _validate,
            "Check spec files. Without --target, the spec and each of its targets are "
            "checked. Exit codes: 0 valid, 1 invalid, 2 usage error or unreadable file."),
    Command("plan", "show the stage DAG a spec compiles to", _plan_arguments, _plan,
            "Compile a spec into its DAG of stages."),
    Command("init", "write a first spec for a CSV, Parquet or Delta file",
            _init_arguments, _init,
            "Read a data file's columns and a sample of its rows, infer the target, the task "
            "and the features, and write a commented spec that validates and runs (try "
            "`dbspec run SPEC --smoke` first)."),
    Command("diff", "the values that changed between two specs and the stages that would rerun",
            _diff_arguments, _diff,
            "Compare two specs (after targets, --set and templates) and list changed values "
            "and the stages whose fingerprints change. OLD or NEW may be a git revision and "
            "path, REV:PATH (e.g. origin/main:specs/diabetes.yaml)."),
    Command("schema", "print the JSON schema of specs", _schema_arguments, _schema,
            "Write the JSON schema (draft 2020-12) of a spec."),
)
