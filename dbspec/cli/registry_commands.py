"""Commands on the model registry: models, promote, approve, rollback."""

from __future__ import annotations

import argparse
import json

from dbspec.cli.options import Command, add_registry_options


def _warn(result: dict) -> None:
    import sys

    if result.get("warning"):
        print(f"warning: {result['warning']}", file=sys.stderr)


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

    from dbspec.registry.commands import alias_argument, open_registry, promote

    alias_argument(args.alias)  # before opening any store
    result = promote(open_registry(args.tracking_uri, Path(args.state_dir)), args.name,
                     args.version, args.alias, force=args.force)
    for gate in result["gates"]:
        print(f"  gate {gate}")
    was = f" (was v{result['previous']})" if result["previous"] else ""
    print(f"{result['name']}@{result['alias']} -> v{result['version']}{was}")
    _warn(result)
    return 0


def _approve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="registered model name")
    parser.add_argument("version", metavar="VERSION", help="version awaiting approval")
    parser.add_argument("--alias", required=True,
                        help="the promotion stage that requires approval, e.g. production")
    add_registry_options(parser)


def _approve(args: argparse.Namespace) -> int:
    from pathlib import Path

    from dbspec.registry.commands import alias_argument, approve, open_registry

    alias_argument(args.alias)  # before opening any store
    result = approve(open_registry(args.tracking_uri, Path(args.state_dir)), args.name,
                     args.version, args.alias)
    for gate in result["gates"]:
        print(f"  gate {gate}")
    was = f" (was v{result['previous']}, now archived)" if result["previous"] else ""
    print(f"{result['name']}@{result['alias']} -> v{result['version']}{was}, approved by "
          f"{result['by']}")
    _warn(result)
    return 0


def _rollback_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="registered model name")
    parser.add_argument("--alias", required=True, help="alias to move back")
    parser.add_argument("--to", metavar="VERSION",
                        help="version to restore (default: the one that held it before)")
    add_registry_options(parser)


def _rollback(args: argparse.Namespace) -> int:
    from pathlib import Path

    from dbspec.registry.commands import open_registry, rollback

    result = rollback(open_registry(args.tracking_uri, Path(args.state_dir)), args.name,
                      args.alias, args.to)
    was = f"v{result['previous']}" if result["previous"] else "unset: deleted outside dbspec"
    print(f"{result['name']}@{result['alias']} -> v{result['version']} (rolled back from {was})")
    _warn(result)
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
