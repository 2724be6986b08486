"""``dbspec grant``: the spec's roles as permissions on a tracking server with MLflow's auth."""

from __future__ import annotations

import argparse

from dbspec.cli.options import Command, add_spec_options, load_spec_arguments


def _grant_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="SPEC", help="spec file (its roles section)")
    add_spec_options(parser)
    parser.add_argument("--tracking-uri", metavar="URI",
                        help="the tracking server (default: MLFLOW_TRACKING_URI, else "
                             "tracking.tracking_uri)")
    parser.add_argument("--smoke", action="store_true",
                        help="grant on the smoke runs' model (<name>_smoke)")


def _grant(args: argparse.Namespace) -> int:
    import os

    from dbspec.registry.access import grant_spec
    from dbspec.registry.errors import RegistryError

    spec = load_spec_arguments(args).spec
    uri = args.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or \
        spec.tracking.tracking_uri
    if not uri:
        raise RegistryError("dbspec grant needs a tracking server: give --tracking-uri, "
                            "MLFLOW_TRACKING_URI or tracking.tracking_uri")
    report = grant_spec(spec, uri, smoke=args.smoke)
    assert report.user is not None  # grant_spec refuses a server without auth
    print(f"roles of {spec.name} on {uri}, as {report.user.name}"
          + (" (MLflow admin)" if report.user.is_admin else ""))
    for line in report.lines:
        print(line)
    for what in report.absent:
        print(f"  {what} does not exist yet: dbspec run grants on it once it is created")
    print(f"{report.changed} permission(s) granted or changed")
    if report.missing_users:
        raise RegistryError(f"{len(report.missing_users)} user(s) of the spec's roles are not on "
                            f"the tracking server: {', '.join(report.missing_users)}; an MLflow "
                            "admin creates them (the UI's admin page, or "
                            "mlflow.server.auth.client.AuthServiceClient.create_user), then run "
                            "dbspec grant again")
    return 0


COMMANDS = (
    Command("grant", "give the spec's roles their MLflow permissions (a server with auth)",
            _grant_arguments, _grant,
            "Give each user: principal of the spec's roles its MLflow permission on the "
            "spec's experiment and registered model (admin MANAGE, data_scientist EDIT, "
            "analyst READ) on a tracking server started with `mlflow server --app-name "
            "basic-auth`. Groups and service principals are skipped. Exit 1 when a user of "
            "the roles does not exist on the server."),
)
