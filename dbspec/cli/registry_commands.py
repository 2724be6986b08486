"""Commands on the model registry: models, promote, approve, rollback."""

from __future__ import annotations

import argparse
import json

from dbspec.cli.options import Command, add_registry_options


def _warn(warning) -> None:
    import sys

    if warning:
        print(f"warning: {warning}", file=sys.stderr)


def _models_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="registered model name")
    parser.add_argument("--format", choices=("text", "json"), default="text")
    add_registry_options(parser)


def _models(args: argparse.Namespace) -> int:
    from pathlib import Path

    from dbspec.registry.commands import describe_models, open_registry, render_models

    described = describe_models(open_registry(args.tracking_uri, Path(args.state_dir)), args.name)
    print(json.dumps(described, indent=2) if args.format == "json" else render_models(described))
    return 0


def _promote_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="registered model name")
    parser.add_argument("version", metavar="VERSION", help="version to promote")
    parser.add_argument("--alias", required=True, help="alias to move, e.g. production")
    parser.add_argument("--force", action="store_true", help="skip the gate re-check")
    add_registry_options(parser)


def _promote(args: argparse.Namespace) -> int:
    from pathlib import Path

    from dbspec.registry.commands import open_registry
    from dbspec.registry.promotion import alias_argument, promote

    alias_argument(args.alias)  # before opening any store
    decision = promote(open_registry(args.tracking_uri, Path(args.state_dir)), args.name,
                       args.version, args.alias, force=args.force)
    for gate in decision.gates:
        print(f"  gate {gate}")
    if not decision.moved:  # nothing written: the alias was there already
        print(f"{decision.name}@{decision.alias} holds v{decision.version} already: "
              "nothing moved")
    else:
        was = f" (was v{decision.previous})" if decision.previous else ""
        print(f"{decision.name}@{decision.alias} -> v{decision.version}{was}")
    _warn(decision.warning)
    return 0


def _approve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="registered model name")
    parser.add_argument("version", metavar="VERSION", help="version awaiting approval")
    parser.add_argument("--alias", required=True,
                        help="the promotion stage that requires approval, e.g. production")
    add_registry_options(parser)


def _approve(args: argparse.Namespace) -> int:
    from pathlib import Path

    from dbspec.registry.commands import open_registry
    from dbspec.registry.promotion import alias_argument, approve

    alias_argument(args.alias)  # before opening any store
    decision = approve(open_registry(args.tracking_uri, Path(args.state_dir)), args.name,
                       args.version, args.alias)
    for gate in decision.gates:
        print(f"  gate {gate}")
    was = f" (was v{decision.previous}, now archived)" if decision.previous else ""
    print(f"{decision.name}@{decision.alias} -> v{decision.version}{was}, approved by "
          f"{decision.by}")
    _warn(decision.warning)
    return 0


def _rollback_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="registered model name")
    parser.add_argument("--alias", required=True, help="alias to move back")
    parser.add_argument("--to", metavar="VERSION",
                        help="version to restore (default: the one that held it before)")
    add_registry_options(parser)


def _rollback(args: argparse.Namespace) -> int:
    from pathlib import Path

    from dbspec.registry.commands import open_registry
    from dbspec.registry.promotion import rollback

    decision = rollback(open_registry(args.tracking_uri, Path(args.state_dir)), args.name,
                        args.alias, args.to)
    was = f"v{decision.previous}" if decision.previous else "unset: deleted outside dbspec"
    print(f"{decision.name}@{decision.alias} -> v{decision.version} (rolled back from {was})")
    _warn(decision.warning)
    return 0


COMMANDS = (
    Command("models", "list a registered model's versions and aliases",
            _models_arguments, _models),
    Command("promote", "point an alias at a version (gates re-checked)",
            _promote_arguments, _promote),
    Command("approve", "approve a version awaiting approval for a promotion stage (gates "
            "re-checked)", _approve_arguments, _approve),
    Command("rollback", "point an alias back at an earlier version",
            _rollback_arguments, _rollback),
)
