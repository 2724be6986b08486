"""``dbspec endpoint``: the serving endpoint follows the alias, and only when it moved.

A Databricks workspace cannot be reached from the tests, so the workspace is a FAKE: an object
with databricks-sdk's ``serving_endpoints.get`` / ``update_config`` that holds real SDK
``ServingEndpointDetailed`` values and records every update. The registry is REAL: MLflow's
SQLite store in a temporary directory, with versions created directly (no training), so the
alias lookups are the ones a job makes.
"""

from __future__ import annotations

import copy
import datetime

import pytest

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


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    """Three versions of NAME in a fresh SQLite registry; @champion on v2."""
    import mlflow

    from dbspec.tracking.mlflow_tracking import quiet_mlflow

    quiet_mlflow()
    root = tmp_path_factory.mktemp("endpoint-registry")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    client = mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)
    client.create_registered_model(NAME)
    (root / "model").mkdir()
    for _ in range(3):
        client.create_model_version(NAME, str(root / "model"))
    client.set_registered_model_alias(NAME, "champion", "2")
    return uri


@pytest.fixture
def spec_file(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC)
    return str(path)


def detail(version: str = "1", *, name: str = "champion", state: str = "NOT_UPDATING",
           pending: str | None = None, entity: str = NAME, extra_entities=(), traffic=None):
    """A ``ServingEndpointDetailed`` as ``GET /serving-endpoints/NAME`` returns it."""
    from databricks.sdk.service.serving import ServingEndpointDetailed

    def served(v):
        return {"name": name, "entity_name": entity, "entity_version": v,
                "workload_size": "Small", "workload_type": "GPU_SMALL",
                "scale_to_zero_enabled": False, "environment_vars": {"MODE": "prod"},
                "creator": "someone@example.com", "creation_timestamp": 1,
                "state": {"deployment": "DEPLOYMENT_READY"}}

    body = {"name": "ep", "state": {"ready": "READY", "config_update": state},
            "config": {"config_version": 3,
                       "served_entities": [served(version), *extra_entities],
                       "traffic_config": traffic or {"routes": [
                           {"served_entity_name": name, "traffic_percentage": 100}]}}}
    if pending is not None:
        body["pending_config"] = {"served_entities": [served(pending)]}
    return ServingEndpointDetailed.from_dict(body)


class FakeWait:
    def __init__(self, outcome):
        self.outcome = outcome

    def result(self, timeout):
        assert isinstance(timeout, datetime.timedelta)
        if isinstance(self.outcome, Exception):
            raise self.outcome
        return self.outcome


class FakeEndpoints:
    """``WorkspaceClient().serving_endpoints`` with one endpoint, ``ep``."""

    def __init__(self, endpoint, outcome=None):
        self.endpoint = endpoint
        self.outcome = outcome
        self.updates: list[dict] = []

    def get(self, name):
        from databricks.sdk.errors import NotFound

        if self.endpoint is None or name != self.endpoint.name:
            raise NotFound(f"Endpoint with name '{name}' does not exist.")
        return copy.deepcopy(self.endpoint)

    def update_config(self, name, **kwargs):
        self.updates.append({"name": name, **kwargs})
        return FakeWait(self.outcome)


class FakeWorkspace:
    def __init__(self, endpoint, outcome=None):
        self.serving_endpoints = FakeEndpoints(endpoint, outcome)


def run(monkeypatch, spec_file, registry, workspace, *args):
    import dbspec.serving.databricks_endpoint as module

    monkeypatch.setattr(module, "workspace_client", lambda: workspace)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_REGISTRY_URI", raising=False)
    return run_main("endpoint", spec_file, "--endpoint", "ep", "--tracking-uri", registry, *args)


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
    (detail("1"), ["--alias", "staging"],
     "error: endpoint ep: nothing to serve: no version of 'diabetes_endpoint_model' holds the "
     "alias 'staging'"),
    (None, [], "error: endpoint ep does not exist in this workspace: deploy the bundle first"),
    (detail("1", entity="main.ml.other"), [],
     "error: endpoint ep serves no version of diabetes_endpoint_model (it serves "
     "main.ml.other v1)"),
    (detail("1", state="IN_PROGRESS", pending="1"), [],
     "error: endpoint ep is being updated (to v1); rerun once the update has finished"),
])
def test_what_cannot_be_done_is_a_clear_error(monkeypatch, spec_file, registry, endpoint, args,
                                              message):
    workspace = FakeWorkspace(endpoint)
    code, out, err = run(monkeypatch, spec_file, registry, workspace, *args)
    assert code == 1 and out == ""
    assert err.startswith(message), err
    assert "Traceback" not in err
    assert workspace.serving_endpoints.updates == []


def test_a_failed_rollout_fails_the_task(monkeypatch, spec_file, registry):
    from databricks.sdk.errors import OperationFailed

    failure = OperationFailed("failed to reach NOT_UPDATING, got UPDATE_FAILED")
    workspace = FakeWorkspace(detail("1"), outcome=failure)
    code, _, err = run(monkeypatch, spec_file, registry, workspace, "--wait")
    assert code == 1
    assert "error: endpoint ep: the update to v2 failed (failed to reach NOT_UPDATING, got " \
           "UPDATE_FAILED); it still serves v1" in err


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
