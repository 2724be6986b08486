"""The argument parser of ``dbspec``, assembled from the command groups."""

from __future__ import annotations

import argparse
from typing import Optional, Sequence

from dbspec import __version__
from dbspec.cli import (access_commands, monitor_commands, registry_commands, run_commands,
                        serving_commands, spec_commands)
from dbspec.cli.options import Command

#: Every sub-command, by group, in the order ``dbspec --help`` lists them.
COMMANDS: tuple[Command, ...] = (spec_commands.COMMANDS + run_commands.COMMANDS
                                 + registry_commands.COMMANDS + access_commands.COMMANDS
                                 + serving_commands.COMMANDS + monitor_commands.COMMANDS)


def build_parser(only: Optional[str] = None) -> argparse.ArgumentParser:
    """The argument parser of every command, or with ``only`` of that command alone (a cold
    ``dbspec validate`` need not build fifteen; its help and errors are the same, a test
    compares them)."""
    parser = argparse.ArgumentParser(
        prog="dbspec",
        description="Compile one YAML model spec into training, search, registration and "
                    "serving runs.")
    parser.add_argument("--version", action="version", version=f"dbspec {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True
    for command in COMMANDS:
        if only is None or only == command.name:
            sub = commands.add_parser(command.name, help=command.help,
                                      description=command.description)
            command.add_arguments(sub)
            sub.set_defaults(handler=command.handler, usage_error=sub.error)
    return parser


def parse_arguments(argv: Sequence[str]) -> argparse.Namespace:
    """Parse a command line, building the parser of the command it names only. An argument
    the command does not know is refused with that command's usage, not the top level's."""
    named = argv[0] if argv and argv[0] in {c.name for c in COMMANDS} else None
    parser = build_parser(only=named)
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        args.usage_error(f"unrecognized arguments: {' '.join(unknown)}")
    return args
