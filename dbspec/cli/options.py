"""What every command group shares: the command record and the common options."""

from __future__ import annotations

import argparse
from typing import Callable, NamedTuple, Optional


class Command(NamedTuple):
    """One sub-command of ``dbspec``: ``help`` is its line in ``dbspec --help``,
    ``description`` the text of ``dbspec NAME --help``; ``handler`` returns the exit code."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    handler: Callable[[argparse.Namespace], int]
    description: str


class DeprecatedAlias(argparse.Action):
    """An old spelling kept for scripts: hidden from ``--help``, it warns and stores into the
    new option's ``dest`` (``const`` for a flag that takes no value)."""

    def __init__(self, option_strings, dest, *, use: str, **kwargs):
        super().__init__(option_strings, dest, help=argparse.SUPPRESS, **kwargs)
        self.use = use

    def __call__(self, parser, namespace, values, option_string=None):
        import sys

        print(f"warning: {option_string} is deprecated; use {self.use}", file=sys.stderr)
        setattr(namespace, self.dest, self.const if self.nargs == 0 else values)


def add_format_option(parser: argparse.ArgumentParser, *choices: str,
                      help: Optional[str] = None) -> None:
    """``--format`` (``text`` by default), the one way every command asks for JSON output."""
    parser.add_argument("--format", choices=("text", *choices), default="text",
                        help=help or f"text (default) or {' or '.join(choices)}")


def add_spec_options(parser: argparse.ArgumentParser) -> None:
    """``--target`` and ``--set``, for commands that load one spec."""
    parser.add_argument("--target", "-t", metavar="NAME",
                        help="apply the spec's targets.NAME overrides")
    parser.add_argument("--set", dest="assignments", action="append", default=[],
                        metavar="PATH=VALUE",
                        help="override one value, e.g. --set training.epochs=5 (repeatable)")


def add_registry_options(parser: argparse.ArgumentParser) -> None:
    """``--tracking-uri`` and ``--state-dir``, for commands that open the model registry."""
    parser.add_argument("--tracking-uri", metavar="URI",
                        help="MLflow tracking/registry URI (default: MLFLOW_TRACKING_URI, else "
                             ".dbspec/mlflow.db)")
    parser.add_argument("--state-dir", metavar="DIR", default=".dbspec",
                        help="the state directory of local runs (default: .dbspec)")


def load_spec_arguments(args: argparse.Namespace):
    """The spec ``args.file`` for ``--target`` and ``--set``; its warnings go to stderr."""
    import sys

    from dbspec.spec.loader import load_spec

    loaded = load_spec(args.file, target=args.target, assignments=args.assignments)
    for diag in loaded.warnings:
        print(diag.format(), file=sys.stderr)
    return loaded
