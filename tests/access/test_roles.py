"""Roles as MLflow permissions, on a real ``mlflow server --app-name basic-auth``.

A data scientist runs the spec (creating the experiment and the model, so MLflow makes them
its MANAGE), the run grants the other roles; an admin's ``dbspec grant`` sets everyone's,
the data scientist's own included. Then each role does, or is refused, what it may.
"""

from __future__ import annotations

import json

import pytest

from tests.access.conftest import (ADMIN, EXPERIMENT, MODEL, SPEC, admin_permission, as_user)
from tests.conftest import run_in_process

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def registered(auth_server, tmp_path_factory):
    """The spec run once by bob (data_scientist): v1 of the model holds @production."""
    work = tmp_path_factory.mktemp("roles-run")
    (work / "spec.yaml").write_text(SPEC)
    result = run_in_process("run", "spec.yaml", cwd=work,
                            env=auth_server.env("bob@example.com"), timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    return work, result


def _grant(server, work, user=ADMIN[0], *extra):
    return run_in_process("grant", "spec.yaml", *extra, cwd=work, env=server.env(user))


def _holder(server, alias):
    import mlflow
    from mlflow.exceptions import MlflowException

    with as_user(server, *ADMIN):
        try:
            return mlflow.MlflowClient(server.uri).get_model_version_by_alias(MODEL,
                                                                               alias).version
        except MlflowException:
            return None


def _experiment_id(server):
    import mlflow

    with as_user(server, *ADMIN):
        return mlflow.MlflowClient(server.uri).get_experiment_by_name(EXPERIMENT).experiment_id


def test_the_run_grants_the_other_roles_and_leaves_its_own(auth_server, registered):
    _, result = registered
    said = result.stdout + result.stderr
    assert "alice@example.com (analyst): READ on registered model 'roles_regressor': granted" \
        in said, said
    assert "carol@example.com (admin): MANAGE on registered model" in said
    assert "skipped group:analysts: MLflow's own auth has users only" in said
    # MLflow made bob, who created them, their MANAGE; he does not lower his own
    assert f"bob@example.com (data_scientist): EDIT on registered model '{MODEL}': left as " \
        "MANAGE" in said
    experiment = _experiment_id(auth_server)
    for kind, resource in (("registered_model", MODEL), ("experiment", experiment)):
        assert admin_permission(auth_server, "alice@example.com", kind, resource) == "READ"
        assert admin_permission(auth_server, "carol@example.com", kind, resource) == "MANAGE"


def test_grant_sets_every_role_and_is_idempotent(auth_server, registered):
    work, _ = registered
    first = _grant(auth_server, work)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "as admin (MLflow admin)" in first.stdout
    experiment = _experiment_id(auth_server)
    expected = {"carol@example.com": "MANAGE", "bob@example.com": "EDIT",
                "alice@example.com": "READ"}
    for user, permission in expected.items():
        for kind, resource in (("registered_model", MODEL), ("experiment", experiment)):
            assert admin_permission(auth_server, user, kind, resource) == permission
    again = _grant(auth_server, work)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "0 permission(s) granted or changed" in again.stdout
    assert again.stdout.count(": unchanged") == 6, again.stdout


def test_grant_reports_users_the_server_does_not_know(auth_server, registered):
    work, _ = registered
    result = _grant(auth_server, work, ADMIN[0], "--set",
                    "roles.analyst=[user:alice@example.com, user:ghost@example.com]")
    assert result.returncode == 1
    assert "ghost@example.com: no such user on the tracking server" in result.stdout
    assert "not on the tracking server: ghost@example.com" in result.stderr
    assert "Traceback" not in result.stderr
    assert admin_permission(auth_server, "alice@example.com", "registered_model",
                            MODEL) == "READ"


def test_grant_needs_manage(auth_server, registered):
    work, _ = registered
    result = _grant(auth_server, work, "alice@example.com")
    assert result.returncode == 1
    assert "alice@example.com may not grant permissions on" in result.stderr
    assert "needs MANAGE" in result.stderr


def test_grant_needs_a_server_with_auth(tmp_path, registered):
    work, _ = registered
    result = run_in_process("grant", "spec.yaml", "--tracking-uri",
                            f"sqlite:///{tmp_path / 'mlflow.db'}", cwd=work)
    assert result.returncode == 1
    assert "is no tracking server" in result.stderr


def test_grant_needs_roles(auth_server, registered):
    work, _ = registered
    (work / "no_roles.yaml").write_text(SPEC.split("roles:")[0])
    result = run_in_process("grant", "no_roles.yaml", cwd=work,
                            env=auth_server.env(*ADMIN))
    assert result.returncode == 1
    assert "has no roles section" in result.stderr


MOVE = "needs EDIT or MANAGE on the registered model; ask an admin (roles.admin)"


@pytest.mark.parametrize("command, refusal", [
    # aliases no other test sets: a request that needs no write (the alias holds the version
    # already) is only told so, as MLflow answers reads
    (("promote", MODEL, "1", "--alias", "audit"),
     f"alice@example.com may not move @audit of {MODEL}: {MOVE}"),
    (("rollback", MODEL, "--alias", "audit", "--to", "1"),
     f"alice@example.com may not move @audit of {MODEL}: {MOVE}"),
    (("approve", MODEL, "1", "--alias", "production"),
     f"alice@example.com may not approve {MODEL} v1 for @production: needs MANAGE on the "
     "registered model (only roles.admin deploys and approves)")])
def test_an_analyst_may_not_move_an_alias(auth_server, registered, command, refusal):
    work, _ = registered
    before = {alias: _holder(auth_server, alias)
              for alias in ("audit", "challenger", "staging", "production")}
    result = run_in_process(*command, cwd=work, env=auth_server.env("alice@example.com"))
    assert result.returncode == 1, result.stdout + result.stderr
    assert refusal in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and "did not answer" not in result.stderr
    assert {alias: _holder(auth_server, alias) for alias in before} == before


def test_a_user_without_a_role_may_not_read(auth_server, registered):
    work, _ = registered
    result = run_in_process("models", MODEL, cwd=work, env=auth_server.env("dave@example.com"))
    assert result.returncode == 1
    assert f"dave@example.com may not read registered model '{MODEL}': needs READ" \
        in result.stderr, result.stderr


def test_a_wrong_password_is_said_so(auth_server, registered):
    work, _ = registered
    result = run_in_process("models", MODEL, cwd=work,
                            env=auth_server.env("alice@example.com", "not-her-password"))
    assert result.returncode == 1
    assert "did not accept the login of alice@example.com" in result.stderr, result.stderr


def test_a_data_scientist_moves_an_alias_short_of_the_last_stage(auth_server, registered):
    work, _ = registered
    assert _grant(auth_server, work).returncode == 0  # bob: EDIT, not the creator's MANAGE
    result = run_in_process("promote", MODEL, "1", "--alias", "challenger", cwd=work,
                            env=auth_server.env("bob@example.com"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert _holder(auth_server, "challenger") == "1"


@pytest.mark.parametrize("command", [("approve", MODEL, "1", "--alias", "production"),
                                     ("promote", MODEL, "1", "--alias", "production",
                                      "--force")])
def test_only_an_admin_deploys(auth_server, registered, command):
    """MLflow lets EDIT set any alias; the last stage and approvals are roles.admin's."""
    work, _ = registered
    assert _grant(auth_server, work).returncode == 0
    before = _holder(auth_server, "production")
    result = run_in_process(*command, cwd=work, env=auth_server.env("bob@example.com"))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "bob@example.com may not" in result.stderr and "needs MANAGE on the registered " \
        "model (only roles.admin deploys and approves); ask an admin (roles.admin) to do it" \
        in result.stderr, result.stderr
    assert _holder(auth_server, "production") == before


def test_an_admin_approves(auth_server, registered):
    import mlflow

    work, _ = registered
    assert _grant(auth_server, work).returncode == 0
    with as_user(auth_server, *ADMIN):
        if _holder(auth_server, "production") is not None:  # another test's approval
            mlflow.MlflowClient(auth_server.uri).delete_registered_model_alias(MODEL,
                                                                               "production")
    result = run_in_process("approve", MODEL, "1", "--alias", "production", cwd=work,
                            env=auth_server.env("carol@example.com"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert _holder(auth_server, "production") == "1"
    # the server vouches for carol: recorded as verified, said without a caveat
    assert "approved by carol@example.com\n" in result.stdout, result.stdout
    with as_user(auth_server, *ADMIN):
        tags = mlflow.MlflowClient(auth_server.uri).get_model_version(MODEL, "1").tags
    approval = json.loads(tags["dbspec.approval.production"])
    assert (approval["by"], approval["verified"]) == ("carol@example.com", True)


def test_deploying_needs_manage(auth_server, registered):
    from dbspec.registry.access import require_deployer
    from dbspec.registry.errors import RegistryPermissionError

    work, _ = registered
    assert _grant(auth_server, work).returncode == 0
    with as_user(auth_server, "bob@example.com"):
        with pytest.raises(RegistryPermissionError) as refused:
            require_deployer(auth_server.uri, MODEL, f"approve {MODEL} v1 for @production")
    assert str(refused.value) == (
        f"bob@example.com may not approve {MODEL} v1 for @production: needs MANAGE on the "
        "registered model (only roles.admin deploys and approves); ask an admin (roles.admin) "
        "to do it")
    with as_user(auth_server, "carol@example.com"):
        require_deployer(auth_server.uri, MODEL, "approve")  # roles.admin: MANAGE


def test_a_manager_who_cannot_read_levels_sets_them_anew(auth_server, registered):
    """carol (MANAGE, no MLflow admin) may grant but not read others' permissions."""
    from dbspec.registry.access import Resource, apply_roles
    from dbspec.spec.sections.roles import RolesSpec

    work, _ = registered
    assert _grant(auth_server, work).returncode == 0
    roles = RolesSpec(admin=["user:carol@example.com"], data_scientist=["user:bob@example.com"])
    with as_user(auth_server, "carol@example.com"):
        report = apply_roles(auth_server.uri, roles,
                             [Resource("registered_model", MODEL, f"registered model '{MODEL}'")])
    assert report.lines == [
        f"  carol@example.com (admin): MANAGE on registered model '{MODEL}': unchanged",
        f"  bob@example.com (data_scientist): EDIT on registered model '{MODEL}': set (its "
        "earlier level is not readable by carol@example.com)"]
    assert admin_permission(auth_server, "bob@example.com", "registered_model", MODEL) == "EDIT"


def test_a_run_whose_caller_may_not_grant_says_so(auth_server, registered):
    """The run's grants never fail it: a caller without MANAGE is told to ask an admin."""
    from types import SimpleNamespace

    import mlflow

    from dbspec.registry.access import grant_after_register
    from dbspec.spec.sections.roles import RolesSpec

    work, _ = registered
    assert _grant(auth_server, work).returncode == 0
    spec = SimpleNamespace(roles=RolesSpec(analyst=["user:dave@example.com"]))
    with as_user(auth_server, "bob@example.com"):  # EDIT now, not MANAGE
        tracker = SimpleNamespace(client=mlflow.MlflowClient(auth_server.uri),
                                  experiment_id=_experiment_id(auth_server),
                                  experiment_name=EXPERIMENT)
        lines = grant_after_register(tracker, spec, MODEL)
    assert len(lines) == 1 and lines[0].startswith(
        "  roles not applied: bob@example.com may not grant permissions on experiment "
        f"'{EXPERIMENT}'"), lines
    assert "needs MANAGE on the experiment" in lines[0] and "dbspec grant SPEC" in lines[0]


def test_a_run_on_a_store_without_auth_grants_nothing(tmp_path):
    from types import SimpleNamespace

    import mlflow

    from dbspec.registry.access import grant_after_register
    from dbspec.spec.sections.roles import RolesSpec

    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    tracker = SimpleNamespace(client=client, experiment_id="0", experiment_name="Default")
    spec = SimpleNamespace(roles=RolesSpec(analyst=["user:dave@example.com"]))
    assert grant_after_register(tracker, spec, MODEL) == []


def test_grant_refuses_a_server_without_auth(mlflow_server, registered):
    work, _ = registered
    result = run_in_process("grant", "spec.yaml", "--tracking-uri", mlflow_server.uri, cwd=work)
    assert result.returncode == 1
    assert f"the tracking server at {mlflow_server.uri} has no auth" in result.stderr


def test_an_analyst_reads_the_model(auth_server, registered):
    work, _ = registered
    assert _grant(auth_server, work).returncode == 0
    result = run_in_process("models", MODEL, cwd=work, env=auth_server.env("alice@example.com"))
    assert result.returncode == 0, result.stderr
    assert MODEL in result.stdout


def test_an_analyst_may_not_train_into_the_experiment(auth_server, registered, tmp_path):
    work, _ = registered
    assert _grant(auth_server, work).returncode == 0
    (tmp_path / "spec.yaml").write_text(SPEC)
    result = run_in_process("run", "spec.yaml", cwd=tmp_path,
                            env=auth_server.env("alice@example.com"), timeout=300)
    assert result.returncode == 1
    assert "alice@example.com may not write the train stage's results to the experiment " \
        f"'{EXPERIMENT}': needs EDIT on the experiment" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_no_login_is_said_so(auth_server, registered):
    work, _ = registered
    env = {**auth_server.env("alice@example.com"), "MLFLOW_TRACKING_USERNAME": "",
           "MLFLOW_TRACKING_PASSWORD": ""}
    result = run_in_process("models", MODEL, cwd=work, env=env)
    assert result.returncode == 1
    assert "the tracking server requires a login to read registered model " \
           f"'{MODEL}': set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD" \
        in result.stderr, result.stderr


def test_grant_with_a_wrong_password_is_said_so(auth_server, registered):
    work, _ = registered
    result = run_in_process("grant", "spec.yaml", cwd=work,
                            env=auth_server.env("carol@example.com", "not-her-password"))
    assert result.returncode == 1
    assert "did not accept the login of carol@example.com to use the tracking server" \
        in result.stderr, result.stderr


def test_grant_before_anything_exists_says_run_first(auth_server, registered):
    work, _ = registered
    result = _grant(auth_server, work, ADMIN[0], "--set", "registry.name=not_registered_yet",
                    "--set", "tracking.experiment=not-created-yet")
    assert result.returncode == 1
    assert "neither experiment 'not-created-yet' nor registered model 'not_registered_yet' " \
           "exists" in result.stderr and "run the spec first" in result.stderr, result.stderr


def test_grant_needs_a_tracking_uri(registered):
    work, _ = registered
    result = run_in_process("grant", "spec.yaml", cwd=work, env={"MLFLOW_TRACKING_URI": ""})
    assert result.returncode == 1
    assert "dbspec grant needs a tracking server" in result.stderr


def test_a_registration_the_server_refuses_names_the_permission(auth_server, registered,
                                                                 tmp_path):
    """alice may write runs (EDIT on the experiment) but only read the model."""
    from mlflow.server.auth.client import AuthServiceClient

    work, _ = registered
    assert _grant(auth_server, work).returncode == 0
    experiment = _experiment_id(auth_server)
    with as_user(auth_server, *ADMIN):
        users = AuthServiceClient(auth_server.uri)
        users.revoke_user_permission("alice@example.com", "experiment", experiment)
        users.grant_user_permission("alice@example.com", "experiment", experiment, "EDIT")
    try:
        (tmp_path / "spec.yaml").write_text(SPEC)
        result = run_in_process("run", "spec.yaml", cwd=tmp_path,
                                env=auth_server.env("alice@example.com"), timeout=300)
    finally:
        assert _grant(auth_server, work).returncode == 0  # alice: READ again
    assert result.returncode == 1
    assert "stage 'register' failed: alice@example.com may not register a version of " \
           f"{MODEL}: needs EDIT on the registered model" in result.stderr, result.stderr
