"""The ``dbspec`` command line.

Each command imports what it needs inside its handler: ``validate``, ``plan`` and ``schema``
stay free of torch, mlflow, pyspark, optuna and deepspeed, so a pull-request check is fast.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from typing import Callable, Optional, Sequence

from dbspec import __version__
from dbspec.errors import DbspecError, Diagnostic, SpecError, UsageError, redact

_VALIDATE_FORMATS = ("text", "json", "github", "sarif")
#: ``dbspec run --fail-on-reject``: the run worked and the gates said no (1 is a failure).
EXIT_REJECTED = 3
_LIGHT_COMMANDS = ("validate", "plan", "schema", "diff", "jobs", "init", "gc")


def _add_spec_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", "-t", metavar="NAME",
                        help="apply the spec's targets.NAME overrides")
    parser.add_argument("--set", dest="assignments", action="append", default=[],
                        metavar="PATH=VALUE",
                        help="override one value, e.g. --set training.epochs=5 (repeatable)")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every command."""
    parser = argparse.ArgumentParser(
        prog="dbspec",
        description="Compile one YAML model spec into training, search, registration and "
                    "serving runs.")
    parser.add_argument("--version", action="version", version=f"dbspec {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True

    validate = commands.add_parser(
        "validate", help="check specs and report every error (exit 1 when invalid)",
        description="Check spec files. Without --target, the spec and each of its targets are "
                    "checked. Exit codes: 0 valid, 1 invalid, 2 usage error or unreadable file.")
    validate.add_argument("files", nargs="+", metavar="FILE", help="spec files")
    _add_spec_options(validate)
    validate.add_argument("--format", choices=_VALIDATE_FORMATS, default="text",
                          help="text (default), json, github workflow annotations, or sarif "
                               "(2.1.0, for code scanning)")
    validate.add_argument("--strict", action="store_true", help="treat warnings as errors")
    validate.set_defaults(handler=_cmd_validate)

    plan = commands.add_parser("plan", help="show the stage DAG a spec compiles to",
                               description="Compile a spec into its DAG of stages.")
    plan.add_argument("file", metavar="FILE", help="spec file")
    _add_spec_options(plan)
    plan.add_argument("--format", choices=("text", "json", "mermaid"), default="text",
                      help="text (default), json or mermaid")
    plan.add_argument("--state-dir", metavar="DIR", default=None,
                      help="show each stage's status (cached, stale, resumable, new) against "
                           "this state dir (default: .dbspec, when it exists)")
    plan.add_argument("--smoke", action="store_true",
                      help="the status against the --smoke runs' state")
    plan.set_defaults(handler=_cmd_plan)

    init = commands.add_parser(
        "init", help="write a first spec for a CSV, Parquet or Delta file",
        description="Read a data file's columns and a sample of its rows, infer the target, "
                    "the task and the features, and write a commented spec that validates and "
                    "runs (try `dbspec run SPEC --smoke` first).")
    init.add_argument("data", metavar="DATA", help="a CSV or Parquet file, or a Delta table")
    init.add_argument("-o", "--output", metavar="SPEC",
                      help="where to write the spec (default: <data name>.yaml here)")
    init.add_argument("--target", metavar="COLUMN",
                      help="the column to predict (default: one named target/label/y/class..., "
                           "else the last)")
    init.add_argument("--task", choices=("regression", "binary", "multiclass"),
                      help="the task (default: inferred from the target's values)")
    init.add_argument("--delimiter", default=",", help="CSV field delimiter (default: ,)")
    init.add_argument("--name", help="the spec's name (default: from the data file's name)")
    init.add_argument("--force", action="store_true", help="overwrite an existing spec file")
    init.set_defaults(handler=_cmd_init)

    run = commands.add_parser(
        "run", help="run the spec's pipeline (data, tune, train, evaluate, register, promote)",
        description="Run every stage of the spec's plan (in this process, or with a Spark "
                    "session for --executor spark). Unchanged stages are "
                    "skipped; MLflow tracking and registry default to .dbspec/mlflow.db.")
    run.add_argument("file", metavar="FILE", help="spec file")
    _add_spec_options(run)
    stages = run.add_mutually_exclusive_group()
    stages.add_argument("--only", metavar="STAGE[,STAGE...]", action="append", default=[],
                        help="run only these stages, on recorded inputs (repeatable)")
    stages.add_argument("--from", dest="from_stage", metavar="STAGE",
                        help="rerun this stage and everything after it")
    run.add_argument("--resume", action="store_true",
                     help="continue an interrupted run (training from its last checkpoint)")
    run.add_argument("--smoke", action="store_true",
                     help="every stage on a tiny slice of the data for one epoch (for CI)")
    run.add_argument("--summary-json", metavar="PATH", help="also write the summary as JSON")
    run.add_argument("--state-dir", metavar="DIR", default=".dbspec",
                     help="where stage state, the default MLflow store and artifacts live "
                          "(default: .dbspec)")
    run.add_argument("--executor", choices=("local", "spark"),
                     help="run stages in this process (local) or with a Spark session "
                          "(default: the spec's executor)")
    run.add_argument("--master", metavar="URL",
                     help="Spark master URL; implies --executor spark (default: spark.master, "
                          "SPARK_MASTER, local[*])")
    run.add_argument("--shared-dir", metavar="DIR",
                     help="a directory every cluster node mounts, for training ranks and search "
                          "trials on executors (default: DBSPEC_SHARED_DIR, spark.shared_dir)")
    run.add_argument("--run-key", metavar="KEY",
                     help="keep stage state and files in the MLflow run tagged with KEY instead "
                          "of the state dir, so separate processes (job tasks) hand stages over; "
                          "generated jobs pass {{job.run_id}}")
    run.add_argument("--fail-on-reject", action="store_true",
                     help=f"exit {EXIT_REJECTED} when the promotion gates reject the new "
                          "version (default: exit 0, the rejection is in the summary)")
    run.add_argument("--quiet", "-q", action="store_true", help="no progress output")
    run.add_argument("--verbose", action="store_true",
                     help="also show what Spark and its JVM print as they start (hidden by "
                          "default: log4j notices, pyspark's pandas warning)")
    run.set_defaults(handler=_cmd_run)

    gc = commands.add_parser(
        "gc", help="remove stage cache entries beyond the bound",
        description="Remove, per stage, the least recently used cache entries beyond --keep "
                    "(and unfinished ones); the current entries always stay. Exit 1 when a "
                    "run directory was skipped because a run holds it.")
    gc.add_argument("file", metavar="SPEC", nargs="?",
                    help="only this spec's runs (all its targets and --smoke runs)")
    gc.add_argument("--keep", metavar="N",
                    help="entries kept per stage, the current one included (default: "
                         "DBSPEC_CACHE_KEEP, else 5)")
    gc.add_argument("--dry-run", action="store_true",
                    help="say what would be removed and how many bytes; delete nothing")
    gc.add_argument("--state-dir", metavar="DIR", default=".dbspec",
                    help="the state directory of local runs (default: .dbspec)")
    gc.set_defaults(handler=_cmd_gc)

    models = commands.add_parser("models", help="list a registered model's versions and aliases")
    models.add_argument("name", metavar="NAME", help="registered model name")
    models.add_argument("--format", choices=("text", "json"), default="text")
    _add_registry_options(models)
    models.set_defaults(handler=_cmd_models)

    promote = commands.add_parser("promote", help="point an alias at a version (gates re-checked)")
    promote.add_argument("name", metavar="NAME", help="registered model name")
    promote.add_argument("version", metavar="VERSION", help="version to promote")
    promote.add_argument("--alias", required=True, help="alias to move, e.g. production")
    promote.add_argument("--force", action="store_true", help="skip the gate re-check")
    _add_registry_options(promote)
    promote.set_defaults(handler=_cmd_promote)

    rollback = commands.add_parser("rollback", help="point an alias back at an earlier version")
    rollback.add_argument("name", metavar="NAME", help="registered model name")
    rollback.add_argument("--alias", required=True, help="alias to move back")
    rollback.add_argument("--to", metavar="VERSION",
                          help="version to restore (default: the one that held it before)")
    _add_registry_options(rollback)
    rollback.set_defaults(handler=_cmd_rollback)

    endpoint = commands.add_parser(
        "endpoint", help="create or move a Databricks serving endpoint to the version the "
                         "alias holds",
        description="Read the version the spec's alias holds (serving.model_alias, else the "
                    "promotion alias). No Databricks Model Serving endpoint yet: create it "
                    "serving that version with the spec's settings (GPU workload for a model "
                    "trained on GPUs, scale to zero, serving.realtime.inference_table as the "
                    "AI Gateway inference table). An endpoint: update it only when it serves "
                    "another version; its other settings are kept. With roles in the spec, "
                    "set the endpoint's permissions to theirs (replacing others; the caller "
                    "keeps CAN_MANAGE). No version holds the alias: nothing to serve, exit 0. "
                    "The generated job's update_endpoint task runs it. Credentials: the job's, "
                    "else DATABRICKS_HOST/DATABRICKS_TOKEN or a profile.")
    endpoint.add_argument("file", metavar="SPEC", help="spec file")
    _add_spec_options(endpoint)
    endpoint.add_argument("--endpoint", metavar="NAME",
                          help="endpoint name (default: the spec's name and target, "
                               "<name>-<target>, <name>-default without a target)")
    endpoint.add_argument("--alias", help="follow this alias instead of the spec's")
    endpoint.add_argument("--wait", action="store_true",
                          help="wait until the new version serves; exit 1 if it fails")
    endpoint.add_argument("--dry-run", action="store_true",
                          help="report what would be created or changed; change nothing")
    _add_registry_options(endpoint)
    endpoint.set_defaults(handler=_cmd_endpoint)

    diff = commands.add_parser(
        "diff", help="the values that changed between two specs and the stages that would rerun",
        description="Compare two specs (after targets, --set and templates) and list changed "
                    "values and the stages whose fingerprints change. OLD or NEW may be a git "
                    "revision and path, REV:PATH (e.g. origin/main:specs/diabetes.yaml).")
    diff.add_argument("old", metavar="OLD", help="spec file, or REV:PATH from git")
    diff.add_argument("new", metavar="NEW", help="spec file, or REV:PATH from git")
    _add_spec_options(diff)
    diff.add_argument("--format", choices=("text", "json"), default="text")
    diff.set_defaults(handler=_cmd_diff)

    jobs = commands.add_parser(
        "jobs", help="generate Databricks job definitions (bundle or Jobs API JSON) from a spec",
        description="Write a Databricks Asset Bundle (databricks.yml, resources/, specs/) or one "
                    "Jobs API 2.2 jobs/create payload per target. Tasks mirror the plan and "
                    "hand stages over through MLflow (--run-key {{job.run_id}}). Output is "
                    "deterministic; --check exits 1 when DIR is out of date.")
    jobs.add_argument("file", metavar="FILE", help="spec file")
    jobs.add_argument("--target", "-t", dest="targets", action="append", default=[],
                      metavar="NAME", help="a target to generate (repeatable; default: all)")
    jobs.add_argument("--set", dest="assignments", action="append", default=[],
                      metavar="PATH=VALUE", help="override one value (repeatable)")
    jobs.add_argument("--format", choices=("bundle", "jobs-json"), default="bundle")
    jobs.add_argument("-o", "--output", metavar="DIR", required=True, help="output directory")
    jobs.add_argument("--check", action="store_true",
                      help="write nothing; exit 1 when the files in DIR are out of date")
    jobs.set_defaults(handler=_cmd_jobs)

    board = commands.add_parser(
        "tensorboard", help="show a training run's TensorBoard event files",
        description="Fetch the event files a run logged (tracking.tensorboard: true) and start "
                    "TensorBoard on 127.0.0.1, or print the --logdir to use.")
    board.add_argument("run", metavar="RUN_ID|SPEC",
                       help="an MLflow run id, or a spec (its last local training run)")
    board.add_argument("--target", "-t", metavar="NAME", help="the spec's target")
    board.add_argument("--port", type=int, default=6006, help="port (default: 6006)")
    board.add_argument("--logdir-only", action="store_true",
                       help="fetch the files and print the log directory; start nothing")
    board.add_argument("--smoke", action="store_true",
                       help="the spec's --smoke training (default: the full one, else the smoke "
                            "one)")
    _add_registry_options(board)
    board.set_defaults(handler=_cmd_tensorboard)

    serve = commands.add_parser(
        "serve", help="serve a registered model over HTTP (MLflow's scoring protocol)",
        description="Serve a registered model on uvicorn: POST /invocations (inputs, instances, "
                    "dataframe_split, dataframe_records), GET /ping, /health, /version, /metrics."
                    " Settings default to the spec's serving.realtime section.")
    from dbspec.serving.commands import (  # no heavy imports
        add_predict_arguments, add_serve_arguments)

    add_serve_arguments(serve)
    serve.set_defaults(handler=_cmd_serve)

    predict = commands.add_parser(
        "predict", help="score a table with a registered model (local Arrow streaming or Spark)",
        description="Batch inference: read Parquet, Delta (any version) or a Spark table; write "
                    "Delta or Parquet with the prediction columns and the model's name and "
                    "version. Settings default to the spec's serving.batch section.")
    add_predict_arguments(predict)
    predict.add_argument("--verbose", action="store_true",
                         help="also show what Spark and its JVM print as they start")
    predict.set_defaults(handler=_cmd_predict)

    schema = commands.add_parser("schema", help="print the JSON schema of specs",
                                 description="Write the JSON schema (draft 2020-12) of a spec.")
    schema.add_argument("-o", "--output", metavar="PATH", help="write to PATH instead of stdout")
    schema.set_defaults(handler=_cmd_schema)
    return parser


def _cmd_validate(args: argparse.Namespace) -> int:
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
    if args.format == "json":
        print(json.dumps([d.to_dict() for d in results], indent=2))
    elif args.format == "github":
        from dbspec.spec.report import github_annotation

        for diag in results:
            print(github_annotation(diag))
    elif args.format == "sarif":
        from dbspec.spec.report import sarif

        print(json.dumps(sarif(results, version=__version__), indent=2))
    _print_summary(args.files, results, to=sys.stdout if args.format == "text" else sys.stderr)
    return status


def _print_text(file: str, found: list[Diagnostic]) -> None:
    for diag in found:
        print(diag.format())
    if not any(d.severity == "error" for d in found):
        warnings = sum(d.severity == "warning" for d in found)
        print(f"{file}: ok" + (f" ({warnings} warning{'s' * (warnings != 1)})" if warnings else ""))


def _print_summary(files: Sequence[str], results: list[Diagnostic], *, to) -> None:
    errors = sum(d.severity == "error" for d in results)
    warnings = len(results) - errors
    bad = len({d.file for d in results if d.severity == "error"})
    noun = "file" if len(files) == 1 else "files"
    verdict = "all valid" if not bad else f"{bad} invalid"
    print(f"{len(files)} {noun} checked: {verdict}, {errors} error{'s' * (errors != 1)}, "
          f"{warnings} warning{'s' * (warnings != 1)}", file=to)


def _load(args: argparse.Namespace):
    from dbspec.spec.loader import load_spec

    loaded = load_spec(args.file, target=args.target, assignments=args.assignments)
    for diag in loaded.warnings:
        print(diag.format(), file=sys.stderr)
    return loaded


def _cmd_plan(args: argparse.Namespace) -> int:
    from pathlib import Path

    from dbspec.executors.plan_status import plan_with_statuses
    from dbspec.plan.render import RENDERERS

    loaded = _load(args)
    state_dir = Path(args.state_dir) if args.state_dir is not None else None
    plan, statuses, note = plan_with_statuses(loaded, state_dir, smoke=args.smoke)
    if note:
        print(f"warning: {note}", file=sys.stderr)
    print(RENDERERS[args.format](plan, statuses))
    return 0


def _cmd_gc(args: argparse.Namespace) -> int:
    from pathlib import Path

    from dbspec.executors.gc import gc_command

    code, text = gc_command(Path(args.state_dir), spec_file=args.file, keep=args.keep,
                            dry_run=args.dry_run)
    print(text)
    return code


def _cmd_diff(args: argparse.Namespace) -> int:
    from dbspec.plan.diff import render_diff, spec_diff
    from dbspec.spec.loader import build, default_target

    specs = []
    for given in (args.old, args.new):
        document = _read_revision(given)
        target = args.target or default_target(document)
        loaded = build(document, target=target, assignments=args.assignments)
        specs.append(loaded.spec)
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


def _add_registry_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tracking-uri", metavar="URI",
                        help="MLflow tracking/registry URI (default: MLFLOW_TRACKING_URI, else "
                             ".dbspec/mlflow.db)")
    parser.add_argument("--state-dir", metavar="DIR", default=".dbspec",
                        help="the state directory of local runs (default: .dbspec)")


def _cmd_init(args: argparse.Namespace) -> int:
    from pathlib import Path

    from dbspec.paths import NAME_PATTERN, NAME_RULE, check_name
    from dbspec.scaffold import infer, render, spec_name

    data = Path(args.data)
    name = args.name or spec_name(data)
    check_name(name, "--name", pattern=NAME_PATTERN, rule=NAME_RULE)
    output = Path(args.output or f"{name}.yaml")
    if output.exists() and not args.force:
        raise UsageError(f"{output} exists; give another -o, or --force to overwrite it")
    if len(args.delimiter) != 1:
        raise UsageError(f"--delimiter must be one character, not {args.delimiter!r}")
    scaffold = infer(data, target=args.target, task=args.task, delimiter=args.delimiter)
    text = render(scaffold, name=name)
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot write {output}: {exc.strerror or exc}") from None
    print(f"wrote {output}: {scaffold.task} on {len(scaffold.features)} feature(s), target "
          f"{scaffold.target!r}" + (f"; left out (not numeric): {', '.join(scaffold.skipped)}"
                                    if scaffold.skipped else ""), file=sys.stderr)
    print(f"next: dbspec validate {output} && dbspec run {output} --smoke", file=sys.stderr)
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    import shlex
    from pathlib import Path

    from dbspec.executors.local import LocalExecutor, SparkExecutor
    from dbspec.executors.summary import build_summary, render_summary
    from dbspec.stages.base import Reporter, RunOptions

    loaded = _load(args)
    from dbspec.paths import writable_directory
    from dbspec.spark.placement import resolve_shared_dir

    writable_directory(args.state_dir, "--state-dir")
    kind = _run_executor(args, loaded.spec)
    shared_dir = resolve_shared_dir(loaded.spec, args.shared_dir)
    options = RunOptions(smoke=args.smoke, resume=args.resume, show_progress=not args.quiet,
                         shared_dir=shared_dir, master=args.master)
    common = {"options": options, "reporter": Reporter(enabled=not args.quiet),
              "resume_command": shlex.join(_resume_command(args, loaded.target, kind))}
    executor = SparkExecutor(Path(args.state_dir), master=args.master, **common) \
        if kind == "spark" else LocalExecutor(Path(args.state_dir), **common)
    only = [name.strip() for given in args.only for name in given.split(",") if name.strip()]
    if args.run_key is not None and not args.run_key.strip():
        raise UsageError("--run-key must not be empty")
    record = executor.run(loaded, only=only, from_stage=args.from_stage, run_key=args.run_key)
    summary = build_summary(record)
    print(render_summary(summary))
    if args.summary_json:
        Path(args.summary_json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.summary_json).write_text(json.dumps(summary, indent=2) + "\n")
    if args.fail_on_reject and summary.get("promotion") == "rejected":
        print(f"error: the promotion gates rejected {summary.get('model_name')} "
              f"v{summary.get('model_version')} (--fail-on-reject)", file=sys.stderr)
        return EXIT_REJECTED
    return 0


def _run_executor(args: argparse.Namespace, spec) -> str:
    """``--executor``, else the spec's; ``--master`` means Spark and is never ignored."""
    if args.master and args.executor == "local":
        raise UsageError(f"--master {args.master} needs the spark executor; drop "
                         "--executor local, or drop --master")
    if args.master and (args.executor or spec.executor) != "spark":
        print(f"--master {args.master}: running on the spark executor", file=sys.stderr)
        return "spark"
    return args.executor or spec.executor


def _resume_command(args: argparse.Namespace, target: Optional[str], kind: str) -> list[str]:
    """The same invocation, for the resume hint: every option that chooses state or data."""
    command = ["dbspec", "run", args.file] + (["--target", target] if target else [])
    command += [f"--set={a}" for a in args.assignments] + (["--smoke"] if args.smoke else [])
    if args.state_dir != ".dbspec":
        command += ["--state-dir", args.state_dir]
    if args.shared_dir:
        command += ["--shared-dir", args.shared_dir]
    if args.run_key:
        command += ["--run-key", args.run_key]
    if kind == "spark":
        command += ["--executor", "spark"] + (["--master", args.master] if args.master else [])
    return command


def _cmd_models(args: argparse.Namespace) -> int:
    from pathlib import Path

    from dbspec.registry.commands import describe_models, open_registry, render_models

    described = describe_models(open_registry(args.tracking_uri, Path(args.state_dir)), args.name)
    print(json.dumps(described, indent=2) if args.format == "json" else render_models(described))
    return 0


def _cmd_promote(args: argparse.Namespace) -> int:
    from pathlib import Path

    from dbspec.registry.commands import alias_argument, open_registry, promote

    alias_argument(args.alias)  # before opening any store
    result = promote(open_registry(args.tracking_uri, Path(args.state_dir)), args.name,
                     args.version, args.alias, force=args.force)
    for gate in result["gates"]:
        print(f"  gate {gate}")
    was = f" (was v{result['previous']})" if result["previous"] else ""
    print(f"{result['name']}@{result['alias']} -> v{result['version']}{was}")
    return 0


def _cmd_rollback(args: argparse.Namespace) -> int:
    from pathlib import Path

    from dbspec.registry.commands import open_registry, rollback

    result = rollback(open_registry(args.tracking_uri, Path(args.state_dir)), args.name,
                      args.alias, args.to)
    was = f"v{result['previous']}" if result["previous"] else "unset: deleted outside dbspec"
    print(f"{result['name']}@{result['alias']} -> v{result['version']} (rolled back from {was})")
    return 0


def _cmd_endpoint(args: argparse.Namespace) -> int:
    from dbspec.serving.databricks_endpoint import run_endpoint

    return run_endpoint(args)


def _cmd_jobs(args: argparse.Namespace) -> int:
    from dbspec.jobs import run_jobs

    return run_jobs(args)


def _cmd_tensorboard(args: argparse.Namespace) -> int:
    from pathlib import Path

    from dbspec.monitoring.commands import fetch_event_files, start_tensorboard
    from dbspec.registry.commands import open_registry

    state_dir = Path(args.state_dir)
    run_id, tracking_uri = args.run, args.tracking_uri
    if args.run.endswith((".yaml", ".yml")) or os.path.exists(args.run):
        from dbspec.executors.local import LocalExecutor
        from dbspec.executors.state import LocalState
        from dbspec.spec.loader import load_spec
        from dbspec.tracking.mlflow_tracking import resolve_tracking_uri

        from dbspec.stages.base import RunOptions

        loaded = load_spec(args.run, target=args.target)
        trainings = {}
        for smoke in ((True,) if args.smoke else (False, True)):
            run_dir = LocalExecutor(state_dir, options=RunOptions(smoke=smoke)).run_dir(loaded)
            train = LocalState(run_dir).load()["stages"].get("train", {})
            if train.get("status") == "done":
                trainings[smoke] = train["output"]["run_id"]
        if not trainings:
            kind = "smoke training" if args.smoke else "finished training (full or --smoke)"
            raise DbspecError(f"{args.run}: no {kind} in {state_dir}: run it first")
        if False not in trainings:
            print(f"{args.run}: showing its --smoke training (there is no full one)",
                  file=sys.stderr)
        run_id = trainings.get(False, trainings.get(True))
        tracking_uri = tracking_uri or resolve_tracking_uri(loaded.spec, state_dir)
    if args.port < 0 or args.port > 65535:
        raise UsageError(f"--port must be between 0 and 65535, not {args.port}")
    client = open_registry(tracking_uri, state_dir).client
    from dbspec.paths import inside

    logdir = fetch_event_files(client, run_id, inside(state_dir / "tensorboard", run_id))
    if args.logdir_only:
        print(logdir)
        return 0
    return start_tensorboard(logdir, args.port)


def _cmd_serve(args: argparse.Namespace) -> int:
    from dbspec.serving.commands import run_serve

    return run_serve(args)


def _cmd_predict(args: argparse.Namespace) -> int:
    from dbspec.serving.commands import run_predict

    return run_predict(args)


def _cmd_schema(args: argparse.Namespace) -> int:
    from dbspec.spec.schema import schema_text

    text = schema_text()
    if args.output:
        try:
            directory = os.path.dirname(args.output)
            if directory:
                os.makedirs(directory, exist_ok=True)
            with open(args.output, "w", encoding="utf-8") as handle:
                handle.write(text)
        except OSError as exc:
            raise UsageError(f"cannot write {args.output}: {exc.strerror or exc}") from None
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the CLI; returns the exit code (0 ok, 1 invalid spec or failed run, 2 usage)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        _check_names(args)
    except DbspecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    if getattr(args, "verbose", False):
        os.environ["DBSPEC_VERBOSE"] = "1"  # read where Spark starts (dbspec.spark)
    if args.command in _LIGHT_COMMANDS:
        # Spec models need no third-party pydantic plugins; looking them up scans every
        # installed package's entry points, a large part of a cold `validate`.
        os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    try:
        with _redacted_output():
            return handler(args)
    except SpecError as exc:
        for diag in exc.diagnostics:
            print(diag.format(), file=sys.stderr)
        return exc.exit_code
    except DbspecError as exc:
        print(f"error: {redact(str(exc))}", file=sys.stderr)
        return exc.exit_code
    except ImportError as exc:  # ModuleNotFoundError, importlib.metadata's PackageNotFoundError
        needed = missing_extra(exc)
        if needed is None:
            raise
        print(f"error: dbspec {args.command} needs {needed}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


#: Which extra brings each third-party module (or distribution) a command may import.
_EXTRAS = {
    **dict.fromkeys(("torch", "mlflow", "optuna", "cmaes", "sklearn", "scikit-learn", "numpy",
                     "pandas", "pyarrow", "deltalake", "psutil", "pynvml", "nvidia-ml-py",
                     "matplotlib", "tensorboard", "scipy", "sqlalchemy"), "train"),
    "pyspark": "spark", "py4j": "spark", "deepspeed": "deepspeed", "ray": "ray",
    **dict.fromkeys(("uvicorn", "httptools", "uvloop", "orjson", "httpx"), "serve"),
}


def missing_extra(exc: ImportError) -> Optional[str]:
    """What to install for a missing third-party package, or None when ``exc`` is about
    something else (a module of dbspec itself is a bug, not a missing extra)."""
    from importlib.metadata import PackageNotFoundError

    if isinstance(exc, PackageNotFoundError):
        name = str(exc.args[0]) if exc.args else ""
    elif isinstance(exc, ModuleNotFoundError) and exc.name:
        name = exc.name
    else:
        return None
    extra = _EXTRAS.get(name.split(".")[0])
    if extra is None:
        return None
    return (f"the '{extra}' extra ({name} is not installed): "
            f"pip install 'dbspec[{extra}]' (or 'dbspec[all]')")


class _Redacting:
    """A text stream that masks values read from the environment (:func:`redact`) in what a
    command prints: plans, diffs and summaries show ``{{ env.NAME }}``, never the value."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(redact(text))
        return len(text)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


@contextlib.contextmanager
def _redacted_output():
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _Redacting(sys.stdout), _Redacting(sys.stderr)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved


def _check_names(args: argparse.Namespace) -> None:
    """Names from the command line that become path parts (--target, --run-key) are names."""
    from dbspec.paths import TARGET_PATTERN, TARGET_RULE, check_name

    for target in [getattr(args, "target", None), *getattr(args, "targets", [])]:
        if target is not None:
            check_name(target, "--target", pattern=TARGET_PATTERN, rule=TARGET_RULE)
    key = getattr(args, "run_key", None)
    if key is not None and key.strip():  # an empty key has its own message
        check_name(key, "--run-key")


def entry_point() -> None:
    """Console-script entry: exit with :func:`main`'s code."""
    sys.exit(main())


if __name__ == "__main__":
    entry_point()
