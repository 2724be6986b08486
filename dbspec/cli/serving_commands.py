"""Commands that serve models or deploy them to Databricks: serve, predict, endpoint, jobs."""

from __future__ import annotations

import argparse

from dbspec.cli.options import Command, add_registry_options, add_spec_options
from dbspec.cli.serving_handlers import add_predict_arguments, add_serve_arguments


def _serve(args: argparse.Namespace) -> int:
    from dbspec.cli.serving_handlers import model_choice, say, serve_flags
    from dbspec.serving.use_cases import serve_model

    serve_model(model_choice(args), serve_flags(args), say=say)
    return 0


def _predict(args: argparse.Namespace) -> int:
    from dbspec.cli.serving_handlers import (RowProgress, model_choice, predict_flags,
                                             print_prediction, say)
    from dbspec.serving.use_cases import predict_table

    progress = RowProgress()
    done = predict_table(model_choice(args), predict_flags(args), progress=progress, say=say)
    progress.clear()
    print_prediction(done)
    return 0


def _endpoint_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="SPEC", help="spec file")
    add_spec_options(parser)
    parser.add_argument("--endpoint", metavar="NAME",
                        help="endpoint name (default: the spec's name and target, "
                             "<name>-<target>, <name>-default without a target)")
    parser.add_argument("--alias", help="follow this alias instead of the spec's")
    parser.add_argument("--wait", action="store_true",
                        help="wait until the new version serves; exit 1 if it fails")
    parser.add_argument("--dry-run", action="store_true",
                        help="report what would be created or changed; change nothing")
    add_registry_options(parser)


def _endpoint(args: argparse.Namespace) -> int:
    from dbspec.cli.serving_handlers import endpoint_flags
    from dbspec.serving.use_cases import update_endpoint

    print(update_endpoint(endpoint_flags(args)).describe())
    return 0


def _jobs_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="SPEC", help="spec file")
    parser.add_argument("--target", "-t", dest="targets", action="append", default=[],
                        metavar="NAME", help="a target to generate (repeatable; default: all)")
    parser.add_argument("--set", dest="assignments", action="append", default=[],
                        metavar="PATH=VALUE", help="override one value (repeatable)")
    parser.add_argument("--format", choices=("bundle", "jobs-json"), default="bundle")
    parser.add_argument("-o", "--output", metavar="DIR", required=True, help="output directory")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 when the files in DIR are out of date")


def _jobs(args: argparse.Namespace) -> int:
    from dbspec.jobs import run_jobs

    return run_jobs(args)


COMMANDS = (
    Command("serve", "serve a registered model over HTTP (MLflow's scoring protocol)",
            add_serve_arguments, _serve,
            "Serve a registered model on uvicorn: POST /invocations (inputs, instances, "
            "dataframe_split, dataframe_records), GET /ping, /health, /version, /metrics. "
            "Settings default to the spec's serving.realtime section."),
    Command("predict", "score a table with a registered model (local Arrow streaming or Spark)",
            add_predict_arguments, _predict,
            "Batch inference: read CSV, Parquet, Delta (any version) or a Spark table; write "
            "Delta or Parquet with the prediction columns and the model's name and version. "
            "Settings default to the spec's serving.batch section."),
    Command("endpoint", "create or move a Databricks serving endpoint to the version the "
                        "alias holds",
            _endpoint_arguments, _endpoint,
            "Read the version the spec's alias holds (serving.model_alias, else the promotion "
            "alias). No Databricks Model Serving endpoint yet: create it serving that version "
            "with the spec's settings (GPU workload for a model trained on GPUs, scale to "
            "zero, serving.realtime.inference_table as the AI Gateway inference table). An "
            "endpoint: update it only when it serves another version; its other settings are "
            "kept. With roles in the spec, set the endpoint's permissions to theirs (replacing "
            "others; the caller keeps CAN_MANAGE). No version holds the alias: nothing to "
            "serve, exit 0. The generated job's update_endpoint task runs it. Credentials: the "
            "job's, else DATABRICKS_HOST/DATABRICKS_TOKEN or a profile."),
    Command("jobs", "generate Databricks job definitions (bundle or Jobs API JSON) from a spec",
            _jobs_arguments, _jobs,
            "Write a Databricks Asset Bundle (databricks.yml, resources/, specs/) or one Jobs "
            "API 2.2 jobs/create payload per target. Tasks mirror the plan and hand stages "
            "over through MLflow (--run-key {{job.run_id}}). Output is deterministic; --check "
            "exits 1 when DIR is out of date."),
)
