"""``dbspec endpoint``: the job's task creates the serving endpoint on the alias holder, moves it
only when the alias moved, and sets the roles' permissions on it each run.

A Databricks workspace cannot be reached from the tests, so the workspace is a FAKE: an object
with databricks-sdk's ``serving_endpoints`` (``get``, ``create``, ``update_config``,
``set_permissions``, ``update_permissions``) and ``current_user.me`` that holds real SDK values
(``ServingEndpointDetailed``, ``ServingEndpointAccessControlRequest``), records every call, and
keeps the permissions the way the API does (set replaces, update merges). The registry is REAL:
MLflow's SQLite store in a temporary directory, with versions created directly (no training),
so the alias lookups are the ones a job makes. What the real Serving API would refuse (a model
it cannot find, a workload the workspace lacks) is not tested here.
"""

from __future__ import annotations

import copy
import datetime

import pytest
from databricks.sdk.service.serving import ServingEndpointDetailed

from tests.conftest import run_main

SPEC = """\
name: diabetes
data: {source: {kind: sklearn, name: diabetes}, task: regression}
model: {layers: [{linear: {out: 1}}]}
registry:
  name: diabetes_endpoint_model
  promotion: {alias: champion}
serving: {mode: realtime}
"""
NAME = "diabetes_endpoint_model"
UC_NAME = "main.ml_models.diabetes_endpoint"
SP = "6f1c3c1e-2b0d-4f55-9a7e-0c1d2e3f4a5b"
#: A Unity Catalog model trained on a GPU, with an inference table and roles.
ROLES_SPEC = f"""\
name: diabetes
data: {{source: {{kind: sklearn, name: diabetes}}, task: regression}}
model: {{layers: [{{linear: {{out: 1}}}}]}}
compute: {{kind: single_gpu}}
registry:
  name: {UC_NAME}
  promotion: {{alias: champion}}
serving:
  mode: realtime
  realtime: {{inference_table: {{}}}}
roles:
  admin: [ml-admins]
  data_scientist: [carol@example.com]
  analyst: [service_principal:{SP}]
targets:
  prod: {{mode: production}}
"""


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    """Three versions of NAME in a fresh SQLite registry; @champion on v2."""
    import mlflow

    from dbspec.tracking.mlflow_tracking import quiet_mlflow

    quiet_mlflow()
    root = tmp_path_factory.mktemp("endpoint-registry")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    client = mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)
    (root / "model").mkdir()
    for name in (NAME, UC_NAME):
        client.create_registered_model(name)
        for _ in range(3):
            client.create_model_version(name, str(root / "model"))
        client.set_registered_model_alias(name, "champion", "2")
    client.create_registered_model("diabetes_rejected")  # a first model that failed the gates
    client.create_model_version("diabetes_rejected", str(root / "model"))
    return uri


@pytest.fixture
def spec_file(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC)
    return str(path)


@pytest.fixture
def roles_file(tmp_path):
    path = tmp_path / "roles.yaml"
    path.write_text(ROLES_SPEC)
    return str(path)


def detail(version: str = "1", *, name: str = "champion", state: str = "NOT_UPDATING",
           pending: str | None = None, entity: str = NAME, extra_entities=(), traffic=None,
           table: dict | None = None):
    """A ``ServingEndpointDetailed`` as ``GET /serving-endpoints/NAME`` returns it."""
    from databricks.sdk.service.serving import ServingEndpointDetailed

    def served(v):
        return {"name": name, "entity_name": entity, "entity_version": v,
                "workload_size": "Small", "workload_type": "GPU_SMALL",
                "scale_to_zero_enabled": False, "environment_vars": {"MODE": "prod"},
                "creator": "someone@example.com", "creation_timestamp": 1,
                "state": {"deployment": "DEPLOYMENT_READY"}}

    body = {"name": "ep", "id": "ep-id", "state": {"ready": "READY", "config_update": state},
            "config": {"config_version": 3,
                       "served_entities": [served(version), *extra_entities],
                       "traffic_config": traffic or {"routes": [
                           {"served_entity_name": name, "traffic_percentage": 100}]}}}
    if pending is not None:
        body["pending_config"] = {"served_entities": [served(pending)]}
    if table is not None:
        body["ai_gateway"] = {"inference_table_config": table}
    return ServingEndpointDetailed.from_dict(body)


class FakeWait:
    def __init__(self, outcome, response=None):
        self.outcome = outcome
        self.response = response
        self.waited = False

    def result(self, timeout):
        assert isinstance(timeout, datetime.timedelta)
        self.waited = True
        if isinstance(self.outcome, Exception):
            raise self.outcome
        return self.outcome


class FakeEndpoints:
    """``WorkspaceClient().serving_endpoints`` with at most one endpoint, ``ep``."""

    def __init__(self, endpoint, outcome=None):
        self.endpoint = endpoint
        self.outcome = outcome
        self.updates: list[dict] = []
        self.created: list[dict] = []
        self.waits: list[FakeWait] = []
        self.permission_calls: list[tuple[str, str]] = []  # (method, endpoint id)
        #: The endpoint's direct permissions, by endpoint id, as the API keeps them.
        self.acl: dict[str, list] = {}

    def get(self, name):
        from databricks.sdk.errors import NotFound

        if self.endpoint is None or name != self.endpoint.name:
            raise NotFound(f"Endpoint with name '{name}' does not exist.")
        return copy.deepcopy(self.endpoint)

    def create(self, name, *, config=None, ai_gateway=None, **others):
        from databricks.sdk.service.serving import ServingEndpointDetailed

        assert self.endpoint is None and not others
        self.created.append({"name": name, "config": config, "ai_gateway": ai_gateway})
        self.endpoint = ServingEndpointDetailed.from_dict({
            "name": name, "id": "new-endpoint-id", "creator": "deployer@example.com",
            "state": {"ready": "NOT_READY", "config_update": "IN_PROGRESS"},
            "pending_config": {"served_entities": config.as_dict()["served_entities"]}})
        self.waits.append(FakeWait(self.outcome, response=copy.deepcopy(self.endpoint)))
        return self.waits[-1]

    def update_config(self, name, **kwargs):
        self.updates.append({"name": name, **kwargs})
        self.waits.append(FakeWait(self.outcome))
        return self.waits[-1]

    def set_permissions(self, serving_endpoint_id, *, access_control_list=None):
        self.permission_calls.append(("set", serving_endpoint_id))
        self.acl[serving_endpoint_id] = list(access_control_list or [])

    def update_permissions(self, serving_endpoint_id, *, access_control_list=None):
        self.permission_calls.append(("update", serving_endpoint_id))
        kept = self.acl.setdefault(serving_endpoint_id, [])
        kept.extend(access_control_list or [])


class FakeCurrentUser:
    def __init__(self, user_name):
        self.user_name = user_name
        self.calls = 0

    def me(self):
        from databricks.sdk.service.iam import User

        self.calls += 1
        return User(user_name=self.user_name)


class FakeWorkspace:
    def __init__(self, endpoint, outcome=None, caller="deployer@example.com"):
        self.serving_endpoints = FakeEndpoints(endpoint, outcome)
        self.current_user = FakeCurrentUser(caller)


def run(monkeypatch, spec_file, registry, workspace, *args, endpoint="ep"):
    import dbspec.serving.databricks_endpoint as module

    monkeypatch.setattr(module, "workspace_client", lambda: workspace)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_REGISTRY_URI", raising=False)
    named = ["--endpoint", endpoint] if endpoint else []
    return run_main("endpoint", spec_file, *named, "--tracking-uri", registry, *args)


def levels(acl) -> list[tuple[str, str, str]]:
    """(field, principal, level) of each access control entry."""
    out = []
    for entry in acl:
        row = entry.as_dict()
        level = row.pop("permission_level")
        ((field, name),) = row.items()
        out.append((field, name, level))
    return out


#: The roles' levels on the endpoint, after the caller's CAN_MANAGE.
ROLE_ACL = [("user_name", "deployer@example.com", "CAN_MANAGE"),
            ("group_name", "ml-admins", "CAN_MANAGE"),
            ("user_name", "carol@example.com", "CAN_QUERY"),
            ("service_principal_name", SP, "CAN_VIEW")]


def test_a_moved_alias_updates_the_endpoint_and_keeps_its_settings(monkeypatch, spec_file,
                                                                   registry):
    workspace = FakeWorkspace(detail("1"))
    code, out, err = run(monkeypatch, spec_file, registry, workspace, "--wait")
    assert (code, err) == (0, "")
    assert out.strip() == "endpoint ep: v1 -> v2 (@champion moved)"
    (update,) = workspace.serving_endpoints.updates
    (entity,) = update["served_entities"]
    assert entity.as_dict() == {"name": "champion", "entity_name": NAME, "entity_version": "2",
                                "workload_size": "Small", "workload_type": "GPU_SMALL",
                                "scale_to_zero_enabled": False,
                                "environment_vars": {"MODE": "prod"}}
    assert update["traffic_config"].as_dict() == {
        "routes": [{"served_entity_name": "champion", "traffic_percentage": 100}]}
    assert update["auto_capture_config"] is None


def test_an_endpoint_on_the_alias_holder_is_left_alone(monkeypatch, spec_file, registry):
    workspace = FakeWorkspace(detail("2"))
    code, out, _ = run(monkeypatch, spec_file, registry, workspace)
    assert code == 0
    assert out.strip() == "endpoint ep serves v2 = @champion: nothing to do"
    assert workspace.serving_endpoints.updates == []


def test_an_update_already_under_way_to_the_holder_is_nothing_to_do(monkeypatch, spec_file,
                                                                    registry):
    workspace = FakeWorkspace(detail("1", state="IN_PROGRESS", pending="2"))
    code, out, _ = run(monkeypatch, spec_file, registry, workspace)
    assert code == 0 and "serves v2 = @champion: nothing to do" in out
    assert workspace.serving_endpoints.updates == []


def test_a_dry_run_reports_and_changes_nothing(monkeypatch, spec_file, registry):
    workspace = FakeWorkspace(detail("1"))
    code, out, _ = run(monkeypatch, spec_file, registry, workspace, "--dry-run")
    assert code == 0 and out.strip() == \
        "endpoint ep: v1 -> v2 (@champion moved) [dry run: not changed]"
    assert workspace.serving_endpoints.updates == []


def test_a_version_named_entity_is_renamed_and_its_traffic_follows(monkeypatch, spec_file,
                                                                   registry):
    other = {"name": "baseline", "entity_name": "main.ml.other", "entity_version": "7",
             "workload_size": "Small", "scale_to_zero_enabled": True}
    traffic = {"routes": [{"served_entity_name": f"{NAME}-1", "traffic_percentage": 90},
                          {"served_entity_name": "baseline", "traffic_percentage": 10}]}
    workspace = FakeWorkspace(detail("1", name=f"{NAME}-1", extra_entities=[other],
                                     traffic=traffic))
    code, _, _ = run(monkeypatch, spec_file, registry, workspace, "--alias", "champion")
    assert code == 0
    (update,) = workspace.serving_endpoints.updates
    assert [(e.name, e.entity_version) for e in update["served_entities"]] == \
        [(f"{NAME}-2", "2"), ("baseline", "7")]  # the other model is untouched
    assert [(r.served_entity_name, r.traffic_percentage)
            for r in update["traffic_config"].routes] == [(f"{NAME}-2", 90), ("baseline", 10)]


def test_the_latest_version_is_followed_without_an_alias(monkeypatch, tmp_path, registry):
    path = tmp_path / "latest.yaml"
    path.write_text(SPEC.replace("  promotion: {alias: champion}\n", ""))
    workspace = FakeWorkspace(detail("2"))
    code, out, _ = run(monkeypatch, str(path), registry, workspace)
    assert code == 0 and out.strip() == "endpoint ep: v2 -> v3 (a newer version)"


@pytest.mark.parametrize("endpoint, args, message", [
    (detail("1", entity="main.ml.other"), [],
     "error: endpoint ep serves no version of diabetes_endpoint_model (it serves "
     "main.ml.other v1)"),
    (detail("1", state="IN_PROGRESS", pending="1"), [],
     "error: endpoint ep is being updated (to v1); rerun once the update has finished"),
    (detail("1", state="IN_PROGRESS"), [],  # another change (its AI Gateway, say)
     "error: endpoint ep is being updated; rerun once the update has finished"),
    (ServingEndpointDetailed.from_dict({"name": "ep", "id": "ep-id", "state": {
        "ready": "NOT_READY", "config_update": "UPDATE_FAILED"}}), [],
     "error: endpoint ep serves nothing (its creation failed, or its config was removed): "
     "delete it (databricks serving-endpoints delete ep) and rerun, which creates it again"),
])
def test_what_cannot_be_done_is_a_clear_error(monkeypatch, spec_file, registry, endpoint, args,
                                              message):
    workspace = FakeWorkspace(endpoint)
    code, out, err = run(monkeypatch, spec_file, registry, workspace, *args)
    assert code == 1 and out == ""
    assert err.startswith(message), err
    assert "Traceback" not in err
    assert workspace.serving_endpoints.updates == workspace.serving_endpoints.created == []


def test_a_failed_rollout_fails_the_task(monkeypatch, spec_file, registry):
    from databricks.sdk.errors import OperationFailed

    failure = OperationFailed("failed to reach NOT_UPDATING, got UPDATE_FAILED")
    workspace = FakeWorkspace(detail("1"), outcome=failure)
    code, _, err = run(monkeypatch, spec_file, registry, workspace, "--wait")
    assert code == 1
    assert "error: endpoint ep: the update to v2 failed (failed to reach NOT_UPDATING, got " \
           "UPDATE_FAILED); it still serves v1" in err


def test_a_first_run_creates_the_endpoint_on_the_alias_holder(monkeypatch, roles_file,
                                                              registry):
    workspace = FakeWorkspace(None)
    code, out, err = run(monkeypatch, roles_file, registry, workspace, "--target", "prod",
                         "--wait", endpoint=None)
    assert (code, err) == (0, "")
    endpoints = workspace.serving_endpoints
    (created,) = endpoints.created
    assert created["name"] == "diabetes-prod"  # the spec's name and target, as the job's
    assert created["config"].as_dict() == {"name": "diabetes-prod", "served_entities": [{
        "name": "champion", "entity_name": UC_NAME, "entity_version": "2",
        "workload_size": "Small", "workload_type": "GPU_SMALL",  # trained on a GPU
        "scale_to_zero_enabled": True}]}
    assert created["ai_gateway"].as_dict() == {"inference_table_config": {
        "catalog_name": "main", "schema_name": "ml_models",
        "table_name_prefix": "diabetes_prod", "enabled": True}}
    assert endpoints.permission_calls == [("set", "new-endpoint-id")]
    assert levels(endpoints.acl["new-endpoint-id"]) == ROLE_ACL
    assert [w.waited for w in endpoints.waits] == [True]
    assert endpoints.updates == []
    assert out.splitlines() == [
        "endpoint diabetes-prod: created serving v2 = @champion (served entity champion, "
        "Small GPU_SMALL, scale to zero, inference table main.ml_models.diabetes_prod_*)",
        "endpoint diabetes-prod: permissions set: deployer@example.com CAN_MANAGE, ml-admins "
        f"CAN_MANAGE, carol@example.com CAN_QUERY, {SP} CAN_VIEW"]


def test_a_created_endpoint_is_moved_only_when_the_alias_moves(monkeypatch, roles_file,
                                                                 registry):
    import mlflow

    workspace = FakeWorkspace(None)
    first = run(monkeypatch, roles_file, registry, workspace, "--target", "prod")
    assert first[0] == 0 and len(workspace.serving_endpoints.created) == 1
    # Databricks finished the rollout: the endpoint serves v2
    endpoints = workspace.serving_endpoints
    endpoints.endpoint = detail("2", entity=UC_NAME, table={
        "catalog_name": "main", "schema_name": "ml_models", "table_name_prefix": "ep",
        "enabled": True})
    code, out, _ = run(monkeypatch, roles_file, registry, workspace, "--target", "prod")
    assert code == 0 and out.splitlines()[0] == "endpoint ep serves v2 = @champion: nothing to do"
    assert endpoints.updates == [] and len(endpoints.created) == 1
    client = mlflow.MlflowClient(tracking_uri=registry, registry_uri=registry)
    client.set_registered_model_alias(UC_NAME, "champion", "3")
    try:
        code, out, _ = run(monkeypatch, roles_file, registry, workspace, "--target", "prod")
    finally:
        client.set_registered_model_alias(UC_NAME, "champion", "2")
    assert code == 0 and out.splitlines()[0] == "endpoint ep: v2 -> v3 (@champion moved)"
    (update,) = endpoints.updates
    assert [e.entity_version for e in update["served_entities"]] == ["3"]
    assert len(endpoints.created) == 1
    # the permissions are set on every run, the moves or not
    assert endpoints.permission_calls == [("set", "new-endpoint-id"), ("set", "ep-id"),
                                          ("set", "ep-id")]


def test_permissions_are_set_not_added_so_a_removed_principal_loses_access(
        monkeypatch, tmp_path, roles_file, registry):
    workspace = FakeWorkspace(detail("2", entity=UC_NAME))
    assert run(monkeypatch, roles_file, registry, workspace, "--target", "prod",
               "--endpoint", "ep")[0] == 0
    endpoints = workspace.serving_endpoints
    assert levels(endpoints.acl["ep-id"]) == ROLE_ACL
    fewer = tmp_path / "fewer.yaml"
    fewer.write_text(ROLES_SPEC.replace("  data_scientist: [carol@example.com]\n", ""))
    code, out, _ = run(monkeypatch, str(fewer), registry, workspace, "--target", "prod")
    assert code == 0
    assert levels(endpoints.acl["ep-id"]) == [ROLE_ACL[0], ROLE_ACL[1], ROLE_ACL[3]]
    assert [method for method, _ in endpoints.permission_calls] == ["set", "set"]
    assert "carol" not in out


def test_a_service_principal_running_the_job_keeps_can_manage(monkeypatch, roles_file,
                                                              registry):
    runner = "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"
    workspace = FakeWorkspace(detail("2", entity=UC_NAME), caller=runner)
    assert run(monkeypatch, roles_file, registry, workspace, "--target", "prod")[0] == 0
    acl = levels(workspace.serving_endpoints.acl["ep-id"])
    assert acl[0] == ("service_principal_name", runner, "CAN_MANAGE")
    assert acl[1:] == ROLE_ACL[1:]


def test_without_roles_the_permissions_are_left_alone(monkeypatch, spec_file, registry):
    workspace = FakeWorkspace(None)
    code, out, _ = run(monkeypatch, spec_file, registry, workspace)
    assert code == 0
    (created,) = workspace.serving_endpoints.created
    (entity,) = created["config"].served_entities
    assert entity.workload_type.value == "CPU" and entity.entity_version == "2"
    assert created["ai_gateway"] is None  # no inference table in the spec
    assert workspace.serving_endpoints.permission_calls == []
    assert workspace.current_user.calls == 0
    assert "permissions" not in out


@pytest.mark.parametrize("endpoint", [None, detail("1")], ids=["first-run", "existing"])
def test_no_alias_holder_is_nothing_to_serve_and_no_failure(monkeypatch, tmp_path, registry,
                                                            endpoint):
    path = tmp_path / "rejected.yaml"
    path.write_text(SPEC.replace(NAME, "diabetes_rejected"))
    workspace = FakeWorkspace(endpoint)
    code, out, err = run(monkeypatch, str(path), registry, workspace)
    assert (code, err) == (0, "")
    assert out.strip() == (
        "endpoint ep: nothing to serve: no version of 'diabetes_rejected' holds the alias "
        "'champion': promote one, e.g. the latest: dbspec promote diabetes_rejected 1 --alias "
        "champion; the endpoint is left as it is")
    endpoints = workspace.serving_endpoints
    assert (endpoints.created, endpoints.updates, endpoints.permission_calls) == ([], [], [])


def test_the_promote_hint_parses_when_pasted(monkeypatch, tmp_path, registry):
    """The hint was ``dbspec promote ... --version N``: no such flag, a usage error."""
    from dbspec.cli.parser import parse_arguments

    path = tmp_path / "rejected.yaml"
    path.write_text(SPEC.replace(NAME, "diabetes_rejected"))
    _, out, _ = run(monkeypatch, str(path), registry, FakeWorkspace(None))
    pasted = out.split("e.g. the latest: ")[1].split(";")[0].split()
    args = parse_arguments(pasted[1:])
    assert (args.command, args.name, args.version, args.alias) == (
        "promote", "diabetes_rejected", "1", "champion")


def test_an_unknown_alias_is_nothing_to_serve_too(monkeypatch, spec_file, registry):
    workspace = FakeWorkspace(detail("1"))
    code, out, _ = run(monkeypatch, spec_file, registry, workspace, "--alias", "staging")
    assert code == 0 and "nothing to serve: no version of 'diabetes_endpoint_model' holds " \
        "the alias 'staging'" in out
    assert workspace.serving_endpoints.updates == []


def test_a_registry_that_does_not_answer_fails_the_task(monkeypatch, registry):
    import dbspec.serving.databricks_endpoint as module
    from dbspec.errors import DbspecError
    from dbspec.registry import RegistryError
    from dbspec.serving.source import ModelTarget

    def unanswered(client, target):
        raise RegistryError("the registry did not answer: 503 Service Unavailable")

    monkeypatch.setattr(module, "resolve_version", unanswered)
    workspace = FakeWorkspace(detail("1"))
    with pytest.raises(DbspecError, match="endpoint ep: the registry did not answer: 503"):
        module.follow_alias(workspace, None, ModelTarget(NAME, "champion"), "ep",
                            config=lambda version: pytest.fail("nothing to create"))


def test_a_dry_run_reports_what_it_would_create(monkeypatch, roles_file, registry):
    workspace = FakeWorkspace(None)
    code, out, _ = run(monkeypatch, roles_file, registry, workspace, "--target", "prod",
                       "--dry-run")
    assert code == 0
    assert out.splitlines() == [
        "endpoint ep: would create it serving v2 = @champion (served entity champion, Small "
        "GPU_SMALL, scale to zero, inference table main.ml_models.ep_*) [dry run: not "
        "changed]",
        "endpoint ep: permissions would set: deployer@example.com CAN_MANAGE, ml-admins "
        f"CAN_MANAGE, carol@example.com CAN_QUERY, {SP} CAN_VIEW"]
    endpoints = workspace.serving_endpoints
    assert (endpoints.created, endpoints.updates, endpoints.permission_calls) == ([], [], [])


def test_a_failed_start_of_a_new_endpoint_fails_the_task(monkeypatch, spec_file, registry):
    from databricks.sdk.errors import OperationFailed

    failure = OperationFailed("failed to reach NOT_UPDATING, got UPDATE_FAILED")
    workspace = FakeWorkspace(None, outcome=failure)
    code, _, err = run(monkeypatch, spec_file, registry, workspace, "--wait")
    assert code == 1
    assert "error: endpoint ep: starting the new endpoint on v2 failed (failed to reach " \
           "NOT_UPDATING, got UPDATE_FAILED); it serves nothing" in err


def test_an_inference_table_the_spec_does_not_give_is_reported_not_changed(
        monkeypatch, roles_file, registry):
    workspace = FakeWorkspace(detail("2", entity=UC_NAME))  # created by hand, no table
    code, out, _ = run(monkeypatch, roles_file, registry, workspace, "--target", "prod")
    assert code == 0
    assert out.splitlines()[-1] == (
        "endpoint ep: inference table none is not the spec's (main.ml_models.ep_*); an "
        "existing endpoint's AI Gateway is left as it is: change it in the Serving UI")
    assert workspace.serving_endpoints.updates == []


@pytest.mark.parametrize("name, expected", [
    ("dev_jane_doe_" + "x" * 60, "dev_jane_doe_" + "x" * 50),
    ("ok-name_1", "ok-name_1"),
])
def test_endpoint_names_are_cut_to_the_serving_limit(name, expected):
    from dbspec.serving.databricks_endpoint import checked_name

    assert checked_name(name) == expected


def test_an_endpoint_name_with_other_characters_is_a_usage_error(monkeypatch, spec_file,
                                                                 registry):
    code, _, err = run(monkeypatch, spec_file, registry, FakeWorkspace(None),
                       endpoint="my endpoint")
    assert code == 2  # a usage error, before any workspace call
    assert "--endpoint 'my endpoint': a serving endpoint name has letters, digits, dashes " \
           "and underscores only" in err


def test_a_workspace_without_credentials_is_a_clear_error(monkeypatch, tmp_path):
    import os

    from dbspec.errors import DbspecError
    from dbspec.serving.databricks_endpoint import workspace_client

    for name in [n for n in os.environ if n.startswith(("DATABRICKS_", "ARM_", "AZURE_"))]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.databrickscfg
    monkeypatch.setenv("DATABRICKS_CONFIG_FILE", str(tmp_path / "none.cfg"))
    with pytest.raises(DbspecError, match="not authenticated to a Databricks workspace: "
                                          "default auth: cannot configure default credentials"):
        workspace_client()
