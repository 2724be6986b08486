"""Commands that run a spec's pipeline and look after what runs leave: run, gc, tensorboard."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Optional

from dbspec.cli.options import Command, add_registry_options, add_spec_options, load_spec_arguments
from dbspec.errors import DbspecError, UsageError

#: ``dbspec run --fail-on-reject``: the run worked and the gates said no (1 is a failure).
EXIT_REJECTED = 3


def _run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="SPEC", help="spec file")
    add_spec_options(parser)
    stages = parser.add_mutually_exclusive_group()
    stages.add_argument("--only", metavar="STAGE[,STAGE...]", action="append", default=[],
                        help="run only these stages, on recorded inputs (repeatable)")
    stages.add_argument("--from", dest="from_stage", metavar="STAGE",
                        help="rerun this stage and everything after it")
    parser.add_argument("--resume", action="store_true",
                        help="continue an interrupted run (training from its last checkpoint)")
    parser.add_argument("--smoke", action="store_true",
                        help="every stage on a tiny slice of the data for one epoch (for CI)")
    parser.add_argument("--summary-json", metavar="PATH", help="also write the summary as JSON")
    parser.add_argument("--state-dir", metavar="DIR", default=".dbspec",
                        help="where stage state, the default MLflow store and artifacts live "
                             "(default: .dbspec)")
    parser.add_argument("--tracking-uri", metavar="URI",
                        help="MLflow tracking URI, the registry's too unless MLFLOW_REGISTRY_URI "
                             "or tracking.registry_uri names another (default: "
                             "MLFLOW_TRACKING_URI, tracking.tracking_uri, mlflow.db in the state dir)")
    _placement_arguments(parser)
    parser.add_argument("--fail-on-reject", action="store_true",
                        help=f"exit {EXIT_REJECTED} when the promotion gates reject the new "
                             "version (default: exit 0, the rejection is in the summary)")
    parser.add_argument("--quiet", "-q", action="store_true", help="no progress output")
    parser.add_argument("--verbose", action="store_true",
                        help="also show what Spark and its JVM print as they start (hidden by "
                             "default: log4j notices, pyspark's pandas warning)")


def _placement_arguments(parser: argparse.ArgumentParser) -> None:
    """Where ``run`` runs stages, and how separate processes hand them over."""
    parser.add_argument("--executor", choices=("local", "spark"),
                        help="run stages in this process (local) or with a Spark session "
                             "(default: the spec's executor)")
    parser.add_argument("--master", metavar="URL",
                        help="Spark master URL; implies --executor spark (default: "
                             "spark.master, SPARK_MASTER, local[*])")
    parser.add_argument("--shared-dir", metavar="DIR",
                        help="a directory every cluster node mounts, for training ranks and "
                             "search trials on executors (default: DBSPEC_SHARED_DIR, "
                             "spark.shared_dir)")
    parser.add_argument("--run-key", metavar="KEY",
                        help="keep stage state and files in the MLflow run tagged with KEY "
                             "instead of the state dir, so separate processes (job tasks) hand "
                             "stages over; generated jobs pass {{job.run_id}}")


def _run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from dbspec.executors.summary import RunSummary

    if args.tracking_uri:  # read there, by training ranks and search trials too
        os.environ["MLFLOW_TRACKING_URI"] = args.tracking_uri
    loaded = load_spec_arguments(args)
    executor = _executor(args, loaded)
    only = [name.strip() for given in args.only for name in given.split(",") if name.strip()]
    if args.run_key is not None and not args.run_key.strip():
        raise UsageError("--run-key must not be empty")
    record = executor.run(loaded, only=only, from_stage=args.from_stage, run_key=args.run_key)
    summary = RunSummary.of(record)
    print(summary.render())
    if args.summary_json:
        Path(args.summary_json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.summary_json).write_text(json.dumps(summary.to_json(), indent=2) + "\n")
    if args.fail_on_reject and summary.promotion == "rejected":
        print(f"error: the promotion gates rejected {summary.model_name} "
              f"v{summary.model_version} (--fail-on-reject)", file=sys.stderr)
        return EXIT_REJECTED
    return 0


def _executor(args: argparse.Namespace, loaded):
    """The executor ``run`` asked for, with its options and the resume hint."""
    import shlex
    from pathlib import Path

    from dbspec.executors import LocalExecutor, SparkExecutor
    from dbspec.paths import writable_directory
    from dbspec.spark.placement import resolve_shared_dir
    from dbspec.stages.base import Reporter, RunOptions

    writable_directory(args.state_dir, "--state-dir")
    kind = _run_executor(args, loaded.spec)
    options = RunOptions(smoke=args.smoke, resume=args.resume, show_progress=not args.quiet,
                         shared_dir=resolve_shared_dir(loaded.spec, args.shared_dir),
                         master=args.master)
    reporter = Reporter(enabled=not args.quiet)
    resume = shlex.join(_resume_command(args, loaded.target, kind))
    if kind == "spark":
        return SparkExecutor(Path(args.state_dir), master=args.master, options=options,
                             reporter=reporter, resume_command=resume)
    return LocalExecutor(Path(args.state_dir), options=options, reporter=reporter,
                         resume_command=resume)


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
    if args.tracking_uri:
        command += ["--tracking-uri", args.tracking_uri]
    if args.shared_dir:
        command += ["--shared-dir", args.shared_dir]
    if args.run_key:
        command += ["--run-key", args.run_key]
    if kind == "spark":
        command += ["--executor", "spark"] + (["--master", args.master] if args.master else [])
    return command


def _gc_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="SPEC", nargs="?",
                        help="only this spec's runs (all its targets and --smoke runs)")
    parser.add_argument("--keep", metavar="N",
                        help="entries kept per stage, the current one included (default: "
                             "DBSPEC_CACHE_KEEP, else 5)")
    parser.add_argument("--dry-run", action="store_true",
                        help="say what would be removed and how many bytes; delete nothing")
    parser.add_argument("--state-dir", metavar="DIR", default=".dbspec",
                        help="the state directory of local runs (default: .dbspec)")


def _gc(args: argparse.Namespace) -> int:
    from pathlib import Path

    from dbspec.executors.gc import gc_command

    code, text = gc_command(Path(args.state_dir), spec_file=args.file, keep=args.keep,
                            dry_run=args.dry_run)
    print(text)
    return code


def _tensorboard_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", metavar="RUN_ID|SPEC",
                        help="an MLflow run id, or a spec (its last local training run)")
    parser.add_argument("--target", "-t", metavar="NAME", help="the spec's target")
    parser.add_argument("--port", type=int, default=6006, help="port (default: 6006)")
    parser.add_argument("--logdir-only", action="store_true",
                        help="fetch the files and print the log directory; start nothing")
    parser.add_argument("--smoke", action="store_true",
                        help="the spec's --smoke training (default: the full one, else the "
                             "smoke one)")
    add_registry_options(parser)


def _tensorboard(args: argparse.Namespace) -> int:
    from pathlib import Path

    from dbspec.observability.tensorboard_runs import fetch_event_files, start_tensorboard
    from dbspec.paths import inside
    from dbspec.registry.commands import open_registry

    state_dir = Path(args.state_dir)
    run_id, tracking_uri = args.run, args.tracking_uri
    if args.run.endswith((".yaml", ".yml")) or os.path.exists(args.run):
        run_id, tracking_uri = _training_run_of_spec(args, state_dir)
    if args.port < 0 or args.port > 65535:
        raise UsageError(f"--port must be between 0 and 65535, not {args.port}")
    client = open_registry(tracking_uri, state_dir).client
    logdir = fetch_event_files(client, run_id, inside(state_dir / "tensorboard", run_id))
    if args.logdir_only:
        print(logdir)
        return 0
    return start_tensorboard(logdir, args.port)


def _training_run_of_spec(args: argparse.Namespace, state_dir) -> tuple[str, str]:
    """The MLflow run of the spec's last local training (the full one, else ``--smoke``), and
    the tracking URI to read it from (``--tracking-uri``, else the one the spec trains to)."""
    from dbspec.executors.local import LocalExecutor
    from dbspec.executors.state import LocalState
    from dbspec.spec.loader import load_spec
    from dbspec.stages.base import RunOptions
    from dbspec.stages.outputs import TrainOutput
    from dbspec.tracking.mlflow_tracking import resolve_tracking_uri

    loaded = load_spec(args.run, target=args.target)
    trainings: dict[bool, str] = {}
    for smoke in ((True,) if args.smoke else (False, True)):
        run_dir = LocalExecutor(state_dir, options=RunOptions(smoke=smoke)).run_dir(loaded)
        train = LocalState(run_dir).load().entry("train")
        if train is not None and train.done:
            trainings[smoke] = TrainOutput.from_json(train.output).run_id
    if not trainings:
        kind = "smoke training" if args.smoke else "finished training (full or --smoke)"
        raise DbspecError(f"{args.run}: no {kind} in {state_dir}: run it first")
    if False not in trainings:
        print(f"{args.run}: showing its --smoke training (there is no full one)",
              file=sys.stderr)
    run_id = trainings[False] if False in trainings else trainings[True]
    return run_id, args.tracking_uri or resolve_tracking_uri(loaded.spec, state_dir)


COMMANDS = (
    Command("run", "run the spec's pipeline (data, tune, train, evaluate, register, promote)",
            _run_arguments, _run,
            "Run every stage of the spec's plan (in this process, or with a Spark session for "
            "--executor spark). Unchanged stages are skipped; MLflow tracking and registry "
            "default to .dbspec/mlflow.db."),
    Command("gc", "remove stage cache entries beyond the bound", _gc_arguments, _gc,
            "Remove, per stage, the least recently used cache entries beyond --keep (and "
            "unfinished ones); the current entries always stay. Exit 1 when a run directory "
            "was skipped because a run holds it."),
    Command("tensorboard", "show a training run's TensorBoard event files",
            _tensorboard_arguments, _tensorboard,
            "Fetch the event files a run logged (tracking.tensorboard: true) and start "
            "TensorBoard on 127.0.0.1, or print the --logdir to use."),
)
