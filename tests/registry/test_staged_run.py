"""Staged promotion end to end through the CLI: ``dbspec run`` moves @staging and asks for
approval at @production, ``dbspec approve`` moves it (who and when recorded, the previous
holder archived), ``dbspec models`` shows the states, ``rollback`` restores the archived
version. Once on SQLite and once on the session's real ``mlflow server``. And the staged
promote stage fails closed on a registry answering errors."""

from __future__ import annotations

import json
import os
import time
from types import SimpleNamespace

import pytest

from tests.conftest import run_in_process
from tests.registry.test_fail_closed import ALIAS_LOOKUP, _first_version, _unset

SPEC = """\
name: staged-e2e
data:
  source: {{kind: sklearn, name: diabetes}}
  task: regression
  preprocessing: [{{standard_scale: all}}]
model:
  layers: [{{linear: {{out: 8}}}}, relu, {{linear: {{out: 1}}}}]
training: {{optimizer: {{name: adam, lr: 0.01}}, epochs: 3}}
tracking: {{experiment: staged-e2e, system_metrics: false, monitor: false}}
registry:
  name: {name}
  promotion:
    - alias: staging
      gates:
        - {{metric: test_rmse, max: 1000}}
        - {{metric: test_rmse, better_than: staging, tolerance: 1000}}
    - alias: production
      gates: [{{metric: test_rmse, better_than: production, tolerance: 1000}}]
      approval: required
serving: {{mode: realtime}}
"""


@pytest.fixture(params=["sqlite", "server"])
def tracking(request, tmp_path):
    """(tracking URI, a model name of this test's own)."""
    if request.param == "server":
        uri = request.getfixturevalue("mlflow_server").uri
    else:
        uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    return uri, f"staged_e2e_{request.param}_{time.time_ns()}"


def test_run_approve_models_rollback(tracking, tmp_path):
    uri, name = tracking
    (tmp_path / "spec.yaml").write_text(SPEC.format(name=name))
    env = {"MLFLOW_TRACKING_URI": uri, "MLFLOW_TRACKING_USERNAME": "carol"}

    def dbspec(*args: str):
        return run_in_process(*args, cwd=tmp_path, env=env, timeout=600)

    first = dbspec("run", "spec.yaml", "--summary-json", "first.json")
    assert first.returncode == 0, first.stderr
    summary = json.loads((tmp_path / "first.json").read_text())
    assert summary["promotion"] == "awaiting_approval"
    assert summary["aliases_set"] == {"staging": "1"}
    assert [g.split(":")[0] for g in summary["gates"]] == ["@staging", "@staging", "@production"]
    said = first.stdout + first.stderr
    assert f"@production: v1 awaits approval: dbspec approve {name} 1 --alias production" in said
    assert "this run's model awaits approval for @production" in summary["serve"]["problem"]

    approved = dbspec("approve", name, "1", "--alias", "production")
    assert approved.returncode == 0, approved.stderr
    assert f"{name}@production -> v1, approved by carol" in approved.stdout

    second = dbspec("run", "spec.yaml", "--set", "training.optimizer.lr=0.02", "--summary-json",
                    "second.json")
    assert second.returncode == 0, second.stderr
    summary = json.loads((tmp_path / "second.json").read_text())
    assert summary["promotion"] == "awaiting_approval" and summary["model_version"] == "2"
    assert summary["aliases_set"] == {"staging": "2"}
    assert any(g.startswith("@production:") and "@production has" in g and "(v1)" in g
               for g in summary["gates"])  # v1 re-scored on this run's test split
    assert summary["serve"]["model_version"] == "1"  # production still serves v1

    approved = dbspec("approve", name, "2", "--alias", "production")
    assert approved.returncode == 0, approved.stderr
    assert "-> v2 (was v1, now archived), approved by carol" in approved.stdout
    again = dbspec("approve", name, "2", "--alias", "production")
    assert again.returncode == 1 and f"{name} v2 already holds @production" in again.stderr

    listed = dbspec("models", name, "--format", "json")
    versions = {v["version"]: v for v in json.loads(listed.stdout)["versions"]}
    assert versions["2"]["lifecycle"]["state"] == "Production"
    assert versions["1"]["lifecycle"]["state"] == "Archived"
    assert [e["event"] for e in versions["2"]["history"]] == [
        "entered @staging", "awaits approval for @production", "entered @production",
        "approved for @production"]
    text = dbspec("models", name).stdout
    assert "  v2    Production" in text and "  v1    Archived" in text
    assert "approved for @production by carol" in text

    back = dbspec("rollback", name, "--alias", "production")
    assert back.returncode == 0 and "-> v1 (rolled back from v2)" in back.stdout
    versions = {v["version"]: v for v in json.loads(
        dbspec("models", name, "--format", "json").stdout)["versions"]}
    assert versions["1"]["lifecycle"]["state"] == "Production"
    assert versions["2"]["lifecycle"]["state"] == "Staging"  # it still holds @staging
    assert versions["1"]["history"][-1]["event"] == "restored"


def test_the_staged_promote_stage_fails_closed(flaky_proxy, mlflow_server, tmp_path):
    """The first stage's alias lookups answer 503: the stage fails with the registry's error,
    no alias moves and no approval is asked for; with the model's reads failing, the approval
    stage of a one-stage list fails the same way."""
    import mlflow

    from dbspec.registry import RegistryUnavailable
    from dbspec.spec.loader import load_spec
    from dbspec.stages.base import Reporter, RunOptions, StageContext
    from dbspec.stages.lifecycle import PromoteStage
    from dbspec.stages.outputs import EvaluateOutput, RegisterOutput, TrainOutput

    real = mlflow.MlflowClient(mlflow_server.uri)

    def stage_context(name: str, version: str, spec: str) -> StageContext:
        (tmp_path / "s.yaml").write_text(spec)
        return StageContext(
            loaded=load_spec(str(tmp_path / "s.yaml")), directory=tmp_path,
            project_dir=tmp_path,
            upstream={"register": RegisterOutput(name, version).to_json(),
                      "evaluate": EvaluateOutput({"test_rmse": 50.0},
                                                 diagnosis="converged").to_json(),
                      "train": TrainOutput("r1", "0", mlflow_server.uri, "models:/m-1", None,
                                           False, "cpu", 1, 9, 1, 1, 100.0).to_json()},
            upstream_dirs={}, options=RunOptions(), reporter=Reporter(enabled=False),
            _tracker=SimpleNamespace(client=mlflow.MlflowClient(flaky_proxy.uri)))

    name = f"fail_closed_staged_{time.time_ns()}"
    version = _first_version(real, name)
    flaky_proxy.failing.append(ALIAS_LOOKUP)
    with pytest.raises(RegistryUnavailable, match="did not answer"):
        PromoteStage().run(stage_context(name, version, SPEC.format(name=name)))
    assert _unset(real, name, "staging") and _unset(real, name, "production")
    assert "dbspec.approval.production" not in real.get_model_version(name, version).tags

    name = f"fail_closed_approval_{time.time_ns()}"
    version = _first_version(real, name)
    only_approval = SPEC.format(name=name).split("    - alias: staging")[0] + \
        "    - alias: production\n      gates: [{diagnosis: converged}]\n" \
        "      approval: required\n"
    flaky_proxy.failing.append(("GET", "/api/2.0/mlflow/registered-models/get"))
    with pytest.raises(RegistryUnavailable, match="did not answer"):
        PromoteStage().run(stage_context(name, version, only_approval))
    assert "dbspec.approval.production" not in real.get_model_version(name, version).tags


GATED = """\
name: staged-stage
data: {{source: {{kind: sklearn, name: diabetes}}, task: regression}}
model: {{layers: [{{linear: {{out: 1}}}}]}}
registry:
  name: {name}
  promotion:
{promotion}"""
TWO_STAGES = """\
    - alias: staging
      gates: [{metric: test_rmse, max: 80}]
    - alias: production
      gates: [{metric: test_rmse, max: 80}, {diagnosis: not_overfitting}]
      approval: required
      four_eyes: true
"""
ONE_WITH_APPROVAL = """\
    alias: production
    gates: [{metric: test_rmse, max: 80}]
    approval: required
"""


def _promote_on_sqlite(store, tmp_path, promotion: str, diagnosis: str):
    """The promote stage of a run on the SQLite ``store`` (gates without better_than: nothing
    to re-score, so no training is needed)."""
    from dbspec.spec.loader import load_spec
    from dbspec.stages.base import Reporter, RunOptions, StageContext
    from dbspec.stages.lifecycle import PromoteStage
    from dbspec.stages.outputs import EvaluateOutput, RegisterOutput, TrainOutput
    from tests.registry.conftest import NAME

    uri, client, _ = store
    version = str(client.create_model_version(  # as register tags it
        NAME, str(tmp_path / "model"), tags={"metric.test_rmse": "50"}).version)
    (tmp_path / "s.yaml").write_text(GATED.format(name=NAME, promotion=promotion))
    ctx = StageContext(
        loaded=load_spec(str(tmp_path / "s.yaml")), directory=tmp_path, project_dir=tmp_path,
        upstream={"register": RegisterOutput(NAME, version).to_json(),
                  "evaluate": EvaluateOutput({"test_rmse": 50.0},
                                             diagnosis=diagnosis).to_json(),
                  "train": TrainOutput("r1", "0", uri, "models:/m-1", None, False, "cpu", 1, 9,
                                       1, 1, 100.0).to_json()},
        upstream_dirs={}, options=RunOptions(), reporter=Reporter(enabled=False),
        _tracker=SimpleNamespace(client=client))
    return version, PromoteStage().run(ctx), client.get_model_version(NAME, version).tags


def test_the_walk_stops_at_approval(store, tmp_path):
    from dbspec.registry import alias_holder
    from tests.registry.conftest import NAME

    version, output, tags = _promote_on_sqlite(store, tmp_path, TWO_STAGES, "converged")
    assert output.decision == "awaiting_approval" and output.passed
    assert output.aliases_set() == {"staging": version} and output.alias == "production"
    assert [(s["alias"], s["outcome"], s["moved"]) for s in output.stages] == [
        ("staging", "promoted", True), ("production", "awaiting_approval", False)]
    assert output.gates[-1] == "@production: diagnosis=converged not overfitting: pass"
    assert str(alias_holder(store[1], NAME, "staging").version) == version
    assert alias_holder(store[1], NAME, "production") is None
    request = json.loads(tags["dbspec.approval.production"])
    assert request["state"] == "pending" and request["verified"] is False
    assert request["by"] == request["os_user"] or request["by"] == \
        os.environ.get("MLFLOW_TRACKING_USERNAME")  # who asked: four eyes compares with it
    assert json.loads(tags["dbspec.stages"])[1]["four_eyes"] is True
    assert tags["dbspec.decision"] == "promoted"
    assert [json.loads(tags[f"dbspec.gate.{i}"])["stage"] for i in range(3)] == [
        "staging", "production", "production"]


def test_a_stage_that_fails_stops_the_walk_there(store, tmp_path):
    from dbspec.registry import alias_holder
    from tests.registry.conftest import NAME

    version, output, tags = _promote_on_sqlite(store, tmp_path, TWO_STAGES, "overfitting")
    assert output.decision == "rejected" and not output.passed
    assert [(s["alias"], s["outcome"]) for s in output.stages] == [
        ("staging", "promoted"), ("production", "rejected")]
    assert output.aliases_set() == {"staging": version}
    assert "dbspec.approval.production" not in tags and tags["dbspec.decision"] == "rejected"
    assert alias_holder(store[1], NAME, "production") is None


def test_one_stage_with_approval_waits_and_is_approved(store, tmp_path):
    from tests.conftest import run_main
    from tests.registry.conftest import NAME

    version, output, tags = _promote_on_sqlite(store, tmp_path, ONE_WITH_APPROVAL, "converged")
    assert output.decision == "awaiting_approval" and output.aliases_set() == {}
    assert output.gates == ["test_rmse=50 <= 80: pass"]  # a single promotion: no stage prefix
    assert json.loads(tags["dbspec.stages"])[0]["approval"] == "required"
    code, out, err = run_main("approve", NAME, version, "--alias", "production",
                              "--tracking-uri", store[0])
    assert code == 0 and f"{NAME}@production -> v{version}" in out, err


def test_a_single_promotion_records_what_it_always_did(store, tmp_path):
    version, output, tags = _promote_on_sqlite(
        store, tmp_path, "    alias: production\n    gates: [{metric: test_rmse, max: 80}]\n",
        None)
    assert (output.decision, output.alias, output.aliases_set()) == (
        "promoted", "production", {"production": version})
    assert "dbspec.stages" not in tags and not any(k.startswith("dbspec.approval") for k in tags)
    assert json.loads(tags["dbspec.gate.0"]) == {
        "metric": "test_rmse", "condition": "<= 80", "value": 50.0, "reference": None,
        "passed": True, "note": ""}
