"""The handlers of ``dbspec serve`` and ``dbspec predict``: their arguments, read into the
serving use cases (:mod:`dbspec.serving.server`, :mod:`dbspec.serving.batch`)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from dbspec.errors import UsageError


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="SPEC|MODEL_URI",
                        help="a spec file (its registered model and alias), models:/NAME@ALIAS, "
                             "models:/NAME/VERSION or models:/NAME (latest version)")
    parser.add_argument("--target", "-t", metavar="NAME", help="the spec's target to apply")
    parser.add_argument("--set", dest="assignments", action="append", default=[],
                        metavar="PATH=VALUE", help="override a spec value (repeatable)")
    parser.add_argument("--alias", help="serve this alias of the spec's model instead")
    parser.add_argument("--tracking-uri", metavar="URI",
                        help="MLflow tracking/registry URI (default: MLFLOW_TRACKING_URI, the "
                             "spec's tracking.tracking_uri, else .dbspec/mlflow.db)")
    parser.add_argument("--state-dir", metavar="DIR", default=".dbspec",
                        help="the state directory of local runs (default: .dbspec)")
    parser.add_argument("--out-of-range", choices=("warn", "reject", "off"),
                        help="rows with features far outside the training range: score and "
                             "flag them, refuse them, or do not check (default: "
                             "serving.out_of_range.action, warn)")


def open_model(args: argparse.Namespace):
    """(spec or None, registry client, ModelTarget, version) for the command's model argument."""
    from dbspec.serving.source import (open_client, parse_model_uri, resolve_version,
                                       spec_target, tracking_uri_for)

    # a registry that does not answer should fail in seconds, not after MLflow's 7 retries
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")
    spec = None
    if args.model.startswith("models:/"):
        if args.target or args.assignments:
            raise UsageError("--target and --set apply to a spec, not to a models:/ URI")
        target = parse_model_uri(args.model)
        if args.alias:
            target = target._replace(alias=args.alias, version=None)
    else:
        from dbspec.spec.loader import load_spec

        loaded = load_spec(args.model, target=args.target, assignments=args.assignments)
        spec = loaded.spec
        target = spec_target(spec, alias=args.alias)
    client = open_client(tracking_uri_for(spec, args.tracking_uri), Path(args.state_dir))
    return spec, client, target, resolve_version(client, target)


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    parser.add_argument("--host", help="address to bind (default: serving.realtime.host, "
                                       "127.0.0.1)")
    parser.add_argument("--port", type=int, help="port (default: serving.realtime.port, 8080; "
                                                 "0 picks a free one)")
    parser.add_argument("--token-env", metavar="NAME",
                        help="environment variable holding the bearer token (default: "
                             "serving.realtime.auth.token_env, DBSPEC_TOKEN)")
    parser.add_argument("--no-auth", action="store_true",
                        help="serve without a token, even on a non-loopback address")
    parser.add_argument("--max-batch-size", type=int, metavar="ROWS")
    parser.add_argument("--max-wait-ms", type=float, metavar="MS")
    parser.add_argument("--max-body-bytes", type=int, metavar="BYTES")
    parser.add_argument("--max-header-bytes", type=int, metavar="BYTES",
                        help="largest request line plus headers (default: "
                             "serving.realtime.max_header_bytes, 65536)")
    parser.add_argument("--header-timeout", type=float, metavar="SECONDS",
                        help="time allowed for a request's headers (default: "
                             "serving.realtime.header_timeout_seconds, 10)")
    parser.add_argument("--keep-alive-timeout", type=float, metavar="SECONDS",
                        help="close connections idle this long (default: "
                             "serving.realtime.keep_alive_timeout_seconds, 5)")
    parser.add_argument("--max-connections", type=int, metavar="N",
                        help="most open connections (default: serving.realtime.max_connections, "
                             "1000)")
    parser.add_argument("--inference-table", metavar="PATH",
                        help="append every answered request to this Delta table")
    parser.add_argument("--watch-alias", action="store_true",
                        help="follow the alias: load and swap in the version it moves to")
    parser.add_argument("--watch-interval", type=float, default=10.0, metavar="SECONDS",
                        help="how often --watch-alias asks the registry (default: 10)")


def out_of_range(args: argparse.Namespace, spec) -> tuple[str, float]:
    """(action, tolerance) for rows outside the training range: the flag, else the spec's."""
    setting = spec.serving.out_of_range if spec is not None else None
    action = args.out_of_range or (setting.action if setting is not None else "warn")
    return action, (setting.tolerance if setting is not None else 0.5)


def check_serve_arguments(args: argparse.Namespace) -> None:
    """Refuse flag values that are wrong whatever the model: before any registry call,
    so a usage error never depends on what the registry holds."""
    if args.port is not None and args.port > 65535:
        raise UsageError(f"--port must be 0 to 65535, not {args.port}")
    for name in ("port", "max_batch_size", "max_body_bytes"):
        value = getattr(args, name)
        if value is not None and value < (0 if name == "port" else 1):
            raise UsageError(f"--{name.replace('_', '-')} must be "
                             f"{'0 or more' if name == 'port' else 'at least 1'}, not {value}")
    if args.max_wait_ms is not None and not args.max_wait_ms >= 0:
        raise UsageError(f"--max-wait-ms must be 0 or more, not {args.max_wait_ms}")
    if args.max_header_bytes is not None and args.max_header_bytes < 1024:
        raise UsageError(f"--max-header-bytes must be at least 1024, not {args.max_header_bytes}")
    if args.max_connections is not None and args.max_connections < 1:
        raise UsageError(f"--max-connections must be at least 1, not {args.max_connections}")
    for flag, value in (("--header-timeout", args.header_timeout),
                        ("--keep-alive-timeout", args.keep_alive_timeout)):
        if value is not None and not 0 < value <= 3600:
            raise UsageError(f"{flag} must be over 0 and at most 3600 seconds, not {value}")
    if not args.watch_interval > 0 or args.watch_interval == float("inf"):
        raise UsageError(f"--watch-interval must be positive, not {args.watch_interval}")


def serve_options(args: argparse.Namespace, spec) -> Any:
    from dbspec.serving.server import ConnectionLimits, ServeOptions

    realtime = spec.serving.realtime if spec is not None else None

    def pick(given: Any, field: str, default: Any) -> Any:
        if given is not None:
            return given
        return getattr(realtime, field) if realtime is not None else default

    table, queue_size = args.inference_table, 10_000
    if table is None and realtime is not None and realtime.inference_table is not None \
            and realtime.inference_table.enabled:
        table, queue_size = realtime.inference_table.path, realtime.inference_table.queue_size
    token_env = args.token_env or (realtime.auth.token_env if realtime is not None
                                   else "DBSPEC_TOKEN")
    limits = ConnectionLimits(
        max_header_bytes=pick(args.max_header_bytes, "max_header_bytes", 65_536),
        header_timeout_s=pick(args.header_timeout, "header_timeout_seconds", 10.0),
        keep_alive_timeout_s=pick(args.keep_alive_timeout, "keep_alive_timeout_seconds", 5.0),
        max_connections=pick(args.max_connections, "max_connections", 1000))
    action, tolerance = out_of_range(args, spec)
    return ServeOptions(
        host=pick(args.host, "host", "127.0.0.1"), port=pick(args.port, "port", 8080),
        token_env=token_env, no_auth=args.no_auth,
        tokens=tuple(sorted(realtime.auth.tokens.items())) if realtime is not None else (),
        max_batch_size=pick(args.max_batch_size, "max_batch_size", 64),
        max_wait_ms=pick(args.max_wait_ms, "max_wait_ms", 2.0),
        max_body_bytes=pick(args.max_body_bytes, "max_body_bytes", 5_000_000),
        inference_table=Path(table) if table else None, queue_size=queue_size,
        watch_alias=args.watch_alias or bool(realtime is not None and realtime.watch_alias),
        watch_interval_s=args.watch_interval, limits=limits, out_of_range=action,
        out_of_range_tolerance=tolerance)


def run_serve(args: argparse.Namespace) -> int:
    from dbspec.serving.server import resolve_token, resolve_tokens, serve, stderr_line
    from dbspec.serving.source import load_version

    check_serve_arguments(args)
    spec, client, target, version = open_model(args)
    options = serve_options(args, spec)
    resolve_token(options)  # refuse before the slow model load
    resolve_tokens(options)
    loaded = load_version(client, target, version, without_torch=True)
    serve(loaded, options, client=client, target=target, say=stderr_line)
    return 0



def add_predict_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    parser.add_argument("--input", metavar="PATH|TABLE",
                        help="Parquet or CSV file or directory, Delta table path, or (with "
                             "--engine spark) a table name (default: serving.batch.input)")
    parser.add_argument("--input-version", type=int, metavar="N",
                        help="Delta version of the input (default: serving.batch.input_version, "
                             "else the latest)")
    parser.add_argument("--output", metavar="PATH",
                        help="where predictions go (default: serving.batch.output)")
    parser.add_argument("--format", choices=("delta", "parquet"),
                        help="output format (default: serving.batch.format, delta)")
    parser.add_argument("--engine", choices=("local", "spark"),
                        help="stream Arrow batches in this process (local) or score on Spark "
                             "(default: serving.batch.engine, local)")
    parser.add_argument("--master", metavar="URL",
                        help="Spark master URL for --engine spark (default: local[*])")


def run_predict(args: argparse.Namespace) -> int:
    import sys

    from dbspec.serving.batch import out_of_range_line, predict_local, predict_spark
    from dbspec.serving.source import load_version

    spec, client, target, version = open_model(args)
    batch = spec.serving.batch if spec is not None else None
    source = args.input or (batch.input if batch else None)
    output = args.output or (batch.output if batch else None)
    if not source or not output:
        raise UsageError("predict needs --input and --output (or a spec with serving.batch)")
    if args.input_version is not None and args.input_version < 0:
        raise UsageError(f"--input-version must be 0 or more, not {args.input_version}")
    version_of_input = args.input_version if args.input_version is not None else (
        batch.input_version if batch and not args.input else None)
    fmt = args.format or (batch.format if batch else "delta")
    engine = args.engine or (batch.engine if batch else "local")
    ranges = out_of_range(args, spec)
    loaded = load_version(client, target, version)
    tty = sys.stderr.isatty()
    print(f"scoring {source} with {target.uri} (v{version}) on {engine}", file=sys.stderr)

    def progress(rows: int, seconds: float) -> None:
        if tty:
            sys.stderr.write(f"\r  {rows:,} rows  {rows / max(seconds, 1e-9):,.0f} rows/s\x1b[K")

    if engine == "spark":
        from dbspec.spark.session import spark_session

        with spark_session(spec, args.master, say=lambda text: print(text, file=sys.stderr)) \
                as spark:
            result = predict_spark(spark, loaded, source, output, fmt=fmt,
                                   input_version=version_of_input, out_of_range=ranges)
    else:
        result = predict_local(loaded, source, output, fmt=fmt, input_version=version_of_input,
                               progress=progress, out_of_range=ranges)
    if tty:
        sys.stderr.write("\r\x1b[K")
    written = f"Delta version {result.output_version}" if result.output_version is not None \
        else fmt
    print(f"wrote {result.rows:,} rows to {output} ({written}) in {result.seconds:.1f}s, "
          f"{result.rows / max(result.seconds, 1e-9):,.0f} rows/s, with {loaded.name} "
          f"v{loaded.version}")
    if result.out_of_range_rows:
        print(f"warning: {out_of_range_line(result)}", file=sys.stderr)
    return 0
