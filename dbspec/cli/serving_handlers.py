"""The arguments of ``dbspec serve``, ``predict`` and ``endpoint``, read into the typed records
their use cases take (:mod:`dbspec.serving.use_cases`), and how their results are shown.

Flag values that are wrong whatever the model are refused here, before any registry call, so a
usage error never depends on what the registry holds.
"""

from __future__ import annotations

import argparse
import sys
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


#: The smallest value of each numeric flag of ``dbspec serve``.
_SERVE_MINIMA = {"port": 0, "max_batch_size": 1, "max_body_bytes": 1, "max_wait_ms": 0,
                 "max_header_bytes": 1024, "max_connections": 1}


def check_serve_arguments(args: argparse.Namespace) -> None:
    """Refuse flag values that are wrong whatever the model: before any registry call,
    so a usage error never depends on what the registry holds."""
    if args.port is not None and args.port > 65535:
        raise UsageError(f"--port must be 0 to 65535, not {args.port}")
    for name, low in _SERVE_MINIMA.items():
        value = getattr(args, name)
        if value is not None and not value >= low:  # a NaN is refused too
            raise UsageError(f"--{name.replace('_', '-')} must be "
                             f"{'0 or more' if low == 0 else f'at least {low}'}, not {value}")
    for flag, value in (("--header-timeout", args.header_timeout),
                        ("--keep-alive-timeout", args.keep_alive_timeout)):
        if value is not None and not 0 < value <= 3600:
            raise UsageError(f"{flag} must be over 0 and at most 3600 seconds, not {value}")
    if not args.watch_interval > 0 or args.watch_interval == float("inf"):
        raise UsageError(f"--watch-interval must be positive, not {args.watch_interval}")


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
    parser.add_argument("--engine", metavar="ENGINE",
                        help="local: stream Arrow batches in this process; spark: score on "
                             "Spark; or the engine of an installed serving-target plugin "
                             "(default: serving.batch.engine, local)")
    parser.add_argument("--master", metavar="URL",
                        help="Spark master URL for --engine spark (default: local[*])")
    parser.add_argument("--verbose", action="store_true",
                        help="also show what Spark and its JVM print as they start")


def model_choice(args: argparse.Namespace) -> Any:
    """The :class:`~dbspec.serving.use_cases.ModelChoice` of the model arguments."""
    from dbspec.serving.use_cases import ModelChoice

    return ModelChoice(args.model, target=args.target, assignments=tuple(args.assignments),
                       alias=args.alias, tracking_uri=args.tracking_uri,
                       state_dir=args.state_dir)


def serve_flags(args: argparse.Namespace) -> Any:
    """The checked :class:`~dbspec.serving.use_cases.ServeFlags` of ``dbspec serve``."""
    from dbspec.serving.use_cases import ServeFlags

    check_serve_arguments(args)
    return ServeFlags(**{name: getattr(args, name) for name in ServeFlags._fields})


def predict_flags(args: argparse.Namespace) -> Any:
    """The checked :class:`~dbspec.serving.use_cases.PredictFlags` of ``dbspec predict``."""
    from dbspec.serving.use_cases import PredictFlags

    if args.input_version is not None and args.input_version < 0:
        raise UsageError(f"--input-version must be 0 or more, not {args.input_version}")
    if args.engine is not None:
        from dbspec.seams.targets import find_target

        find_target("batch", args.engine)  # an unknown engine is a usage error, found first
    return PredictFlags(**{name: getattr(args, name) for name in PredictFlags._fields})


def endpoint_flags(args: argparse.Namespace) -> Any:
    """The :class:`~dbspec.serving.use_cases.EndpointFlags` of ``dbspec endpoint``."""
    from dbspec.serving.use_cases import EndpointFlags

    values = {name: getattr(args, name) for name in EndpointFlags._fields}
    return EndpointFlags(**{**values, "assignments": tuple(args.assignments)})


def say(text: str) -> None:
    """A progress line on stderr (stdout keeps the command's result)."""
    print(text, file=sys.stderr, flush=True)


class RowProgress:
    """Rows scored so far, rewritten in place on a terminal's stderr (nothing elsewhere)."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()

    def __call__(self, rows: int, seconds: float) -> None:
        if self.tty:
            sys.stderr.write(f"\r  {rows:,} rows  {rows / max(seconds, 1e-9):,.0f} rows/s\x1b[K")

    def clear(self) -> None:
        """Remove the progress line before the summary."""
        if self.tty:
            sys.stderr.write("\r\x1b[K")


def print_prediction(done: Any) -> None:
    """``wrote N rows to OUTPUT (...) in S s, R rows/s, with MODEL vV``, and the out-of-range
    warning on stderr."""
    from dbspec.serving.batch import out_of_range_line

    result = done.result
    written = f"Delta version {result.output_version}" if result.output_version is not None \
        else done.format
    print(f"wrote {result.rows:,} rows to {done.output} ({written}) in {result.seconds:.1f}s, "
          f"{result.rows / max(result.seconds, 1e-9):,.0f} rows/s, with {done.model_name} "
          f"v{done.model_version}")
    if result.out_of_range_rows:
        print(f"warning: {out_of_range_line(result)}", file=sys.stderr)
