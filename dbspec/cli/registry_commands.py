"""Commands on the model registry: models, promote, approve, rollback."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dbspec.cli.options import Command, add_format_option, add_registry_options


def _registry(args: argparse.Namespace):
    """The registry of ``--tracking-uri`` and ``--state-dir``."""
    from dbspec.registry.commands import open_registry

    return open_registry(args.tracking_uri, Path(args.state_dir))


def _report(decision, line: str) -> int:
    """Print the gates of ``decision``, then ``line``, then its warning (stderr)."""
    for gate in decision.gates:  # none for a rollback
        print(f"  gate {gate}")
    print(line)
    if decision.warning:
        print(f"warning: {decision.warning}", file=sys.stderr)
    return 0


def _models_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="registered model name")
    add_format_option(parser, "json")
    add_registry_options(parser)


def _models(args: argparse.Namespace) -> int:
    from dbspec.registry.commands import describe_models, render_models

    described = describe_models(_registry(args), args.name)
    print(json.dumps(described, indent=2) if args.format == "json" else render_models(described))
    return 0


def _promote_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="registered model name")
    parser.add_argument("version", metavar="VERSION", help="version to promote")
    parser.add_argument("--alias", required=True, help="alias to move, e.g. production")
    parser.add_argument("--force", action="store_true", help="skip the gate re-check")
    add_registry_options(parser)


def _promote(args: argparse.Namespace) -> int:
    from dbspec.registry.promotion import alias_argument, promote

    alias_argument(args.alias)  # before opening any store
    decision = promote(_registry(args), args.name, args.version, args.alias, force=args.force)
    held = f"{decision.name}@{decision.alias}"
    if not decision.moved:  # nothing written: the alias was there already
        return _report(decision, f"{held} holds v{decision.version} already: nothing moved")
    was = f" (was v{decision.previous})" if decision.previous else ""
    return _report(decision, f"{held} -> v{decision.version}{was}")


def _approve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="registered model name")
    parser.add_argument("version", metavar="VERSION", help="version awaiting approval")
    parser.add_argument("--alias", required=True,
                        help="the promotion stage that requires approval, e.g. production")
    add_registry_options(parser)


def _approve(args: argparse.Namespace) -> int:
    from dbspec.registry.promotion import alias_argument, approve

    alias_argument(args.alias)  # before opening any store
    registry = _registry(args)
    decision = approve(registry, args.name, args.version, args.alias)
    was = f" (was v{decision.previous}, now archived)" if decision.previous else ""
    if args.name.count(".") == 2:  # Unity Catalog: the tag a deployment job's approval reads
        registry.client.set_model_version_tag(args.name, str(decision.version),
                                              f"approval_{args.alias}", "approved")
    return _report(decision, f"{decision.name}@{decision.alias} -> v{decision.version}{was}, "
                   f"approved by {decision.by}")


def _approval_arguments(parser: argparse.ArgumentParser) -> None:
    _approve_arguments(parser)
    parser.add_argument("--tag", required=True, help="the approval tag (the approval task's key)")


def _approval(args: argparse.Namespace) -> int:
    from dbspec.registry.errors import RegistryError

    tags = _registry(args).client.get_model_version(args.name, args.version).tags or {}
    if tags.get(args.tag) != "approved":
        raise RegistryError(f"{args.name} v{args.version} is not approved for @{args.alias}: "
                            f"its tag {args.tag} is {tags.get(args.tag)!r}, not 'approved' "
                            "(the Approve button or `dbspec approve` sets it)")
    print(f"{args.name} v{args.version}: {args.tag}=approved")
    return 0


def _rollback_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="registered model name")
    parser.add_argument("--alias", required=True, help="alias to move back")
    parser.add_argument("--to", metavar="VERSION",
                        help="version to restore (default: the one that held it before)")
    parser.add_argument("--expected", metavar="VERSION",
                        help="only while VERSION holds the alias; else nothing moves (exit 0)")
    add_registry_options(parser)


def _rollback(args: argparse.Namespace) -> int:
    from dbspec.registry.promotion import rollback

    decision = rollback(_registry(args), args.name, args.alias, args.to, expected=args.expected)
    if decision.version is None and args.expected:  # moved since: a newer promotion stays
        print(f"{args.name}@{args.alias} holds v{decision.previous}, not v{args.expected}: "
              "left as it is")
        return 0
    was = f"v{decision.previous}" if decision.previous else "unset: deleted outside dbspec"
    return _report(decision, f"{decision.name}@{decision.alias} -> v{decision.version} "
                   f"(rolled back from {was})")


def _link_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="Unity Catalog model (catalog.schema.model)")
    parser.add_argument("job_id", metavar="JOB_ID", help="the deployment job's id")
    add_registry_options(parser)


def _link(args: argparse.Namespace) -> int:
    from dbspec.registry.commands import link_deployment_job

    link_deployment_job(_registry(args), args.name, args.job_id)
    print(f"{args.name}: deployment job {args.job_id}")
    return 0


COMMANDS = (
    Command("models", "list a registered model's versions and aliases",
            _models_arguments, _models,
            "List a registered model's versions, newest first (aliases, gate outcomes, "
            "metrics, lifecycle: promoted, awaiting approval, archived), its promotion "
            "stages and each alias's history."),
    Command("promote", "point an alias at a version (gates re-checked)",
            _promote_arguments, _promote,
            "Point ALIAS at VERSION after re-checking the gates recorded for that stage on "
            "the metrics logged with each version (exit 1 when a gate fails; nothing moves). "
            "A stage that requires approval goes through `dbspec approve`; --force skips the "
            "gates. The version leaving the last stage's alias is archived."),
    Command("approve", "approve a version awaiting approval for a promotion stage (gates "
            "re-checked)", _approve_arguments, _approve,
            "Approve VERSION for the promotion stage ALIAS that requires approval: the gates "
            "are checked again, the alias moves and the approver is recorded. Only the spec's "
            "roles.admin approves on a tracking server with auth."),
    Command("approval", "check a version's approval tag (a deployment job's approval task)",
            _approval_arguments, _approval,
            "Exit 0 when VERSION carries the tag --tag with the value approved (what the "
            "Approve button of a Unity Catalog deployment job and `dbspec approve` set), "
            "else exit 1 naming the tag's value. Moves nothing."),
    Command("link-job", "link a Unity Catalog model to its MLflow deployment job",
            _link_arguments, _link,
            "Set the registered model's deployment_job_id (creating the model if it does not "
            "exist yet), so that MLflow runs the deployment job on each new version. The "
            "generated job's link_deployment_job task runs it."),
    Command("rollback", "point an alias back at an earlier version",
            _rollback_arguments, _rollback,
            "Point ALIAS back at the version that held it before (repeated rollbacks step "
            "further back), or at --to VERSION; with --expected only while that version holds "
            "it. On the last stage's alias the version left is archived and the one reached "
            "restored."),
)
