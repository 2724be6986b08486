"""A run of a model linked to an MLflow deployment job leaves the new version to that job:
nothing moves in the run, and the job's own commands (the tasks ``dbspec jobs`` generates:
``promote``, ``approval``, ``approve``) take it through the stages on the tags the run's
register stage wrote. On a real SQLite store; the link itself is a stand-in, because MLflow's
SQLite store accepts ``deployment_job_id`` but keeps nothing (Unity Catalog keeps it, and no
workspace can run here)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_in_process
from tests.registry.test_staged_run import SPEC


@pytest.fixture
def linked(monkeypatch):
    """Every registered model reads as linked to deployment job 4242 (see the module doc)."""
    from mlflow.entities.model_registry import RegisteredModel

    monkeypatch.setattr(RegisteredModel, "deployment_job_id", property(lambda self: "4242"))


def test_a_linked_model_s_versions_go_through_the_deployment_job(linked, tmp_path):
    import mlflow

    uri, name = f"sqlite:///{tmp_path / 'mlflow.db'}", "handover"
    (tmp_path / "spec.yaml").write_text(SPEC.format(name=name))
    env = {"MLFLOW_TRACKING_URI": uri, "MLFLOW_TRACKING_USERNAME": "carol"}

    def dbspec(*args: str):
        return run_in_process(*args, cwd=tmp_path, env=env, timeout=600)

    run = dbspec("run", "spec.yaml", "--summary-json", "run.json", "--fail-on-reject")
    assert run.returncode == 0, run.stderr
    summary = json.loads((tmp_path / "run.json").read_text())
    assert (summary["promotion"], summary["deployment_job"]) == ("deferred", "4242")
    assert summary["aliases_set"] == {} and summary["gates"] == []
    said = run.stdout + run.stderr
    assert "promotion        deferred to deployment job 4242" in said
    assert "@production: v1 is left to the model's deployment job" in said
    assert "its deployment job, which moves the alias" in summary["serve"]["problem"]
    client = mlflow.MlflowClient(uri)
    assert client.get_registered_model(name).aliases == {}
    # handed over, not pending: a later run must not take it for one whose process died
    assert client.get_model_version(name, "1").tags["dbspec.decision"] == "deferred"
    # the deployment job's tasks, in order, on the version's recorded gates and metrics
    staged = dbspec("promote", name, "1", "--alias", "staging")
    assert staged.returncode == 0, staged.stderr
    assert client.get_model_version(name, "1").tags["dbspec.decision"] == "promoted"
    waiting = dbspec("approval", name, "1", "--alias", "production", "--tag",
                     "approval_production")
    assert waiting.returncode == 1, waiting.stdout + waiting.stderr
    client.set_model_version_tag(name, "1", "approval_production", "approved")  # the UI's button
    passed = dbspec("approval", name, "1", "--alias", "production", "--tag",
                    "approval_production")
    assert passed.returncode == 0, passed.stderr
    approved = dbspec("approve", name, "1", "--alias", "production")
    assert approved.returncode == 0, approved.stderr
    assert client.get_registered_model(name).aliases == {"staging": 1, "production": 1}
