"""``dbspec approve``, ``promote`` to a stage and the lifecycle states, on a real MLflow
registry (SQLite in the test's directory) whose versions are made with the tags a run of a
staged spec records (no training: the commands read only tags and aliases)."""

from __future__ import annotations

import json
import time

import pytest

from tests.conftest import run_main
from tests.registry.conftest import NAME

STAGES = [
    {"alias": "staging", "approval": "none",
     "gates": [{"metric": "test_rmse", "max": 80.0, "tolerance": 0.0},
               {"metric": "test_rmse", "better_than": "staging", "tolerance": 0.0}]},
    {"alias": "production", "approval": "required",
     "gates": [{"metric": "test_rmse", "better_than": "production", "tolerance": 0.0}]},
]


def make_version(store, tmp_path, rmse: float, *, staged: bool = True,
                 awaiting: bool = False, **tags: str) -> str:
    """A version tagged as a run of a staged spec tags it (``awaiting``: its run passed the
    production gates and asked for approval)."""
    from dbspec.registry import DECISION_TAG, GATES_TAG
    from dbspec.registry.lifecycle import MODEL_STAGES_TAG, STAGES_TAG

    _, client, _ = store
    recorded = {GATES_TAG: json.dumps(STAGES[0]["gates"]), DECISION_TAG: "promoted",
                "metric.test_rmse": str(rmse), **tags}
    if staged:
        recorded[STAGES_TAG] = json.dumps(STAGES)
        client.set_registered_model_tag(NAME, MODEL_STAGES_TAG, '["staging", "production"]')
    if awaiting:
        recorded["dbspec.approval.production"] = json.dumps(
            {"state": "pending", "gates": [], "at": "2026-01-01T00:00:00Z", "run_id": "r"})
    return str(client.create_model_version(NAME, str(tmp_path / "model"), tags=recorded).version)


def cli(store, *args: str) -> tuple[int, str, str]:
    return run_main(*args, "--tracking-uri", store[0])


def holder(store, alias: str):
    from dbspec.registry import alias_holder

    found = alias_holder(store[1], NAME, alias)
    return None if found is None else str(found.version)


def described(store) -> dict:
    code, out, err = cli(store, "models", NAME, "--format", "json")
    assert code == 0, err
    return {v["version"]: v for v in json.loads(out)["versions"]}


@pytest.mark.parametrize("alias, message", [
    ("canary", "@canary is not a promotion stage of integrity_model v1 (its stages: @staging, "
               "@production)"),
    ("staging", "@staging of integrity_model needs no approval: a run moves it when its gates "
                "pass; use dbspec promote integrity_model 1 --alias staging"),
    ("production", "integrity_model v1 is not awaiting approval for @production (no pending "
                   "request and does not hold @staging, the stage before)"),
    ("latest", "--alias 'latest' is reserved by the MLflow registry"),
])
def test_approve_refuses_a_version_that_does_not_await_it(store, tmp_path, alias, message):
    make_version(store, tmp_path, 50.0)
    code, out, err = cli(store, "approve", NAME, "1", "--alias", alias)
    assert code == 1 and f"error: {message}" in err, err
    assert "Traceback" not in err and out == ""
    assert holder(store, "production") is None and holder(store, "staging") is None


def test_approve_needs_a_version_of_a_staged_spec(store, tmp_path):
    make_version(store, tmp_path, 50.0, staged=False)
    code, _, err = cli(store, "approve", NAME, "1", "--alias", "production")
    assert code == 1 and "@production is not a promotion stage of integrity_model v1 (its " \
                         "spec has no promotion stages)" in err
    code, _, err = cli(store, "approve", NAME, "7", "--alias", "production")
    assert code == 1 and "integrity_model has no version 7" in err


def test_approve_moves_production_records_who_and_archives_the_last_holder(
        store, tmp_path, monkeypatch):
    """A store without authentication vouches for nobody: the claimed name is recorded with
    the OS user beside it and marked unverified, in the output and the tag."""
    import getpass

    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "alice")
    os_user = getpass.getuser()
    who = f"alice (unverified: the store has no authentication; OS user {os_user})"
    first = make_version(store, tmp_path, 55.0, awaiting=True)
    code, out, err = cli(store, "approve", NAME, first, "--alias", "production")
    assert code == 0, err
    assert "@production: test_rmse=55 <= @production: pass (no version holds @production yet)" \
        in out and f"{NAME}@production -> v{first}, approved by {who}" in out
    second = make_version(store, tmp_path, 50.0, awaiting=True)
    code, out, err = cli(store, "approve", NAME, second, "--alias", "production")
    assert code == 0, err
    assert f"(@production has 55 (v{first}))" in out
    assert f"-> v{second} (was v{first}, now archived), approved by {who}" in out
    assert holder(store, "production") == second
    _, client, registry = store
    approval = json.loads(client.get_model_version(NAME, second).tags[
        "dbspec.approval.production"])
    assert approval["state"] == "approved" and approval["by"] == "alice"
    assert approval["verified"] is False and approval["os_user"] == os_user
    assert approval["requested_at"] == "2026-01-01T00:00:00Z" and approval["at"] > "2026"
    archived = json.loads(client.get_model_version(NAME, first).tags["dbspec.lifecycle"])
    assert archived["state"] == "archived" and archived["by"] == "alice"
    assert archived["why"] == f"left @production for v{second} (approved by {who})"
    last = registry.history(NAME, "production")[-1]
    assert (last["version"], last["by"], last["reason"]) == (second, "alice",
                                                             f"approved by {who}")


def test_a_failing_gate_at_approval_moves_nothing(store, tmp_path):
    better = make_version(store, tmp_path, 50.0, awaiting=True)
    assert cli(store, "approve", NAME, better, "--alias", "production")[0] == 0
    worse = make_version(store, tmp_path, 60.0, awaiting=True)
    code, out, err = cli(store, "approve", NAME, worse, "--alias", "production")
    assert code == 1 and out == ""
    assert f"error: integrity_model v{worse} fails its gates for @production: @production: " \
           f"test_rmse=60 <= @production: FAIL (@production has 50 (v{better})); nothing " \
           "moved" in err
    assert holder(store, "production") == better
    tags = store[1].get_model_version(NAME, worse).tags
    assert json.loads(tags["dbspec.approval.production"])["state"] == "pending"
    assert "dbspec.lifecycle" not in store[1].get_model_version(NAME, better).tags


def test_the_holder_of_the_stage_before_can_be_approved(store, tmp_path):
    version = make_version(store, tmp_path, 50.0)
    code, out, err = cli(store, "promote", NAME, version, "--alias", "staging")
    assert code == 0, err
    assert "gate @staging: test_rmse=50 <= 80: pass" in out
    code, out, err = cli(store, "approve", NAME, version, "--alias", "production")
    assert code == 0 and holder(store, "production") == version, err
    code, _, err = cli(store, "approve", NAME, version, "--alias", "production")
    assert code == 1 and f"integrity_model v{version} already holds @production" in err


def test_promote_to_a_stage_with_approval_needs_approve_or_force(store, tmp_path):
    version = make_version(store, tmp_path, 50.0, awaiting=True)
    code, _, err = cli(store, "promote", NAME, version, "--alias", "production")
    assert code == 1 and "@production of integrity_model requires approval: dbspec approve " \
                         f"integrity_model {version} --alias production" in err
    assert holder(store, "production") is None
    code, out, _ = cli(store, "promote", NAME, version, "--alias", "production", "--force")
    assert code == 0 and holder(store, "production") == version


def test_promote_rechecks_the_gates_of_the_stage_it_moves(store, tmp_path):
    """Promoting to @staging checks the staging stage's gates against @staging's holder, not
    the production stage's."""
    holding = make_version(store, tmp_path, 50.0)
    assert cli(store, "promote", NAME, holding, "--alias", "staging")[0] == 0
    worse = make_version(store, tmp_path, 90.0)
    code, _, err = cli(store, "promote", NAME, worse, "--alias", "staging")
    assert code == 1
    assert "@staging: test_rmse=90 <= 80: FAIL" in err
    assert f"@staging: test_rmse=90 <= @staging: FAIL (@staging has 50 (v{holding}))" in err
    assert holder(store, "staging") == holding


def test_promote_never_says_no_holder_when_the_candidate_holds_the_alias(store, tmp_path):
    """Issue 17: ``promote NAME 3 --alias staging`` said "no version holds @production yet"
    while v3 held @production (its recorded better_than gate names @production)."""
    from dbspec.registry import GATES_TAG

    _, client, _ = store
    gates = json.dumps([{"metric": "test_rmse", "better_than": "production", "tolerance": 0.0}])
    for rmse in (60.0, 58.0, 55.0):
        make_version(store, tmp_path, rmse, staged=False, **{GATES_TAG: gates})
    client.set_registered_model_alias(NAME, "production", "1")
    assert cli(store, "promote", NAME, "3", "--alias", "production")[0] == 0
    code, out, err = cli(store, "promote", NAME, "3", "--alias", "staging")
    assert code == 0, err
    assert "no version holds" not in out
    assert "test_rmse=55 <= @production: pass (@production has 55 (v3, v3 itself))" in out
    # the alias it moves and holds already: the version it replaced there, said so
    code, out, _ = cli(store, "promote", NAME, "3", "--alias", "production")
    assert code == 0 and "no version holds" not in out
    assert "(@production has 60 (v1, the version v3 replaced))" in out
    # a holder whose metric was never recorded is not "no holder" either: the gate fails
    client.delete_model_version_tag(NAME, "1", "metric.test_rmse")
    client.set_registered_model_alias(NAME, "production", "1")
    code, _, err = cli(store, "promote", NAME, "2", "--alias", "production")
    assert code == 1 and "@production (v1) has no test_rmse to compare with" in err


def test_models_shows_each_versions_lifecycle_state_and_history(store, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "bob")
    first = make_version(store, tmp_path, 55.0, awaiting=True)
    assert cli(store, "approve", NAME, first, "--alias", "production")[0] == 0
    second = make_version(store, tmp_path, 50.0)
    assert cli(store, "promote", NAME, second, "--alias", "staging")[0] == 0
    assert cli(store, "approve", NAME, second, "--alias", "production")[0] == 0
    waiting = make_version(store, tmp_path, 49.0, awaiting=True)
    store[2].move_alias(NAME, "staging", waiting, reason="gates passed")  # as its run does
    fresh = make_version(store, tmp_path, 70.0)
    states = {v: d["lifecycle"]["state"] for v, d in described(store).items()}
    assert states == {first: "Archived", second: "Production", waiting: "Staging",
                      fresh: "Development"}
    versions = described(store)
    assert versions[waiting]["lifecycle"]["awaiting"] == ["production"]
    events = [e["event"] for e in versions[first]["history"]]
    assert events[:2] == ["awaits approval for @production", "entered @production"]
    assert "approved for @production" in events and events[-1] == "archived"
    code, out, _ = cli(store, "models", NAME)
    assert code == 0 and "stages @staging -> @production" in out
    assert f"  v{waiting:<4} Staging/staging" in out  # it holds @staging, awaits production
    assert f"awaits approval for @production: dbspec approve {NAME} {waiting} --alias " \
           "production" in out
    assert f"  v{first:<4} Archived" in out and f"  v{second:<4} Production" in out
    assert "approved for @production by bob" in out
    # rollback of production brings the archived version back
    code, out, _ = cli(store, "rollback", NAME, "--alias", "production")
    assert code == 0 and f"-> v{first} (rolled back from v{second})" in out
    states = {v: d["lifecycle"]["state"] for v, d in described(store).items()}
    assert states[first] == "Production" and states[second] == "Archived"
    restored = json.loads(store[1].get_model_version(NAME, first).tags["dbspec.lifecycle"])
    assert restored["state"] == "restored" and "rollback" in restored["why"]
    left = json.loads(store[1].get_model_version(NAME, second).tags["dbspec.lifecycle"])
    assert left["state"] == "archived" and left["why"] == \
        f"left @production for v{first} (rollback)"


def test_approve_fails_closed_on_a_registry_answering_errors(flaky_proxy, mlflow_server):
    """Approving through a server whose alias lookups answer 503: the holder cannot be
    confirmed before the move, so nothing moves and the request stays pending."""
    import mlflow

    from dbspec.registry.lifecycle import STAGES_TAG

    real = mlflow.MlflowClient(mlflow_server.uri)
    name = f"fail_closed_approve_{time.time_ns()}"
    real.create_registered_model(name)
    run = real.create_run("0").info.run_id
    version = str(real.create_model_version(name, f"runs:/{run}/model", run_id=run, tags={
        STAGES_TAG: json.dumps(STAGES), "metric.test_rmse": "50",
        "dbspec.approval.production": json.dumps({"state": "pending"})}).version)
    flaky_proxy.failing.append(("GET", "/api/2.0/mlflow/registered-models/alias"))
    code, out, err = run_main("approve", name, version, "--alias", "production",
                              "--tracking-uri", flaky_proxy.uri)
    assert code == 1 and "the registry did not answer" in err and "Traceback" not in err
    assert flaky_proxy.failed
    tags = real.get_model_version(name, version).tags
    assert json.loads(tags["dbspec.approval.production"])["state"] == "pending"
    assert "production" not in (real.get_registered_model(name).aliases or {})
    from dbspec.registry import Registry

    registry = Registry(mlflow.MlflowClient(flaky_proxy.uri))
    registry.lock_wait_s = 0.0
    with registry.lock(name):  # the failed approve let the lock go: taken again at once
        pass


def test_records_refused_after_the_move_are_a_warning(flaky_proxy, mlflow_server):
    """The alias moved (its history entry names the approver), then the registry refused the
    version tags: exit 0 with a warning saying what was not recorded, no traceback."""
    import mlflow

    from dbspec.registry.lifecycle import STAGES_TAG

    real = mlflow.MlflowClient(mlflow_server.uri)
    name = f"approve_then_refused_{time.time_ns()}"
    real.create_registered_model(name)
    run = real.create_run("0").info.run_id
    version = str(real.create_model_version(name, f"runs:/{run}/model", run_id=run, tags={
        STAGES_TAG: json.dumps(STAGES), "metric.test_rmse": "50",
        "dbspec.approval.production": json.dumps({"state": "pending"})}).version)
    flaky_proxy.failing.append(("POST", "/api/2.0/mlflow/model-versions/set-tag"))
    code, out, err = run_main("approve", name, version, "--alias", "production",
                              "--tracking-uri", flaky_proxy.uri)
    assert code == 0 and f"{name}@production -> v{version}" in out, err
    assert f"warning: @production moved to v{version}, but the approval record could not be " \
           "written: the registry did not answer" in err and "Traceback" not in err
    assert str(real.get_model_version_by_alias(name, "production").version) == version


def test_a_request_superseded_at_the_stage_before_cannot_be_approved(store, tmp_path):
    """v1 awaited approval holding @staging; v2's run took @staging and asked too: v1's
    request no longer stands, and models no longer shows v1 awaiting."""
    _, _, registry = store
    first = make_version(store, tmp_path, 55.0, awaiting=True)
    registry.move_alias(NAME, "staging", first, reason="gates passed")
    second = make_version(store, tmp_path, 60.0, awaiting=True)
    registry.move_alias(NAME, "staging", second, reason="gates passed")
    code, _, err = cli(store, "approve", NAME, first, "--alias", "production")
    assert code == 1 and f"v{first}'s request for @production is superseded: v{second} holds " \
        "@staging now" in err
    assert holder(store, "production") is None
    states = {v: d["lifecycle"] for v, d in described(store).items()}
    assert states[first]["awaiting"] == [] and states[first]["state"] == "Development"
    assert states[second]["state"] == "Staging" and states[second]["awaiting"] == ["production"]


def four_eyes_version(store, tmp_path, *, trainer: str, requester: str) -> str:
    """A version of a spec whose production stage requires four eyes: trained in a run of
    ``trainer``, its approval requested by ``requester``."""
    from dbspec.registry.client import RUN_TAG
    from dbspec.registry.lifecycle import STAGES_TAG

    client = store[1]
    run = client.create_run("0", tags={"mlflow.user": trainer}).info.run_id
    stages = [STAGES[0], {**STAGES[1], "four_eyes": True}]
    version = make_version(store, tmp_path, 50.0, awaiting=True, **{RUN_TAG: run})
    client.set_model_version_tag(NAME, version, STAGES_TAG, json.dumps(stages))
    client.set_model_version_tag(NAME, version, "dbspec.approval.production", json.dumps(
        {"state": "pending", "gates": [], "at": "2026-01-01T00:00:00Z", "run_id": run,
         "by": requester, "verified": False, "os_user": requester}))
    return version


@pytest.mark.parametrize("approver, did", [("alice", "trained"), ("Bob", "requested the "
                                                                         "approval of")])
def test_four_eyes_refuses_the_trainer_and_the_requester(store, tmp_path, monkeypatch,
                                                         approver, did):
    version = four_eyes_version(store, tmp_path, trainer="alice", requester="bob")
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", approver)
    code, out, err = cli(store, "approve", NAME, version, "--alias", "production")
    assert code == 1 and out == "" and "Traceback" not in err
    assert f"error: @production of {NAME} requires four eyes (promotion four_eyes: true): " \
           f"{approver} (unverified: the store has no authentication" in err
    assert f"{did} v{version}; someone else approves it; nothing moved" in err
    assert holder(store, "production") is None
    tags = store[1].get_model_version(NAME, version).tags
    assert json.loads(tags["dbspec.approval.production"])["state"] == "pending"


def test_four_eyes_lets_a_third_person_approve(store, tmp_path, monkeypatch):
    version = four_eyes_version(store, tmp_path, trainer="alice", requester="bob")
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "carol")
    code, out, err = cli(store, "approve", NAME, version, "--alias", "production")
    assert code == 0 and f"{NAME}@production -> v{version}, approved by carol" in out, err
    assert holder(store, "production") == version


@pytest.mark.parametrize("run_id, message", [
    ("r", "but who trained v1 cannot be read (run r: Run with id=r not found)"),
    (None, "but v1 records no run user to tell its trainer by"),
])
def test_four_eyes_fails_closed_without_a_known_trainer(store, tmp_path, monkeypatch, run_id,
                                                        message):
    from dbspec.registry.lifecycle import STAGES_TAG

    stages = [STAGES[0], {**STAGES[1], "four_eyes": True}]
    version = make_version(store, tmp_path, 50.0)
    store[1].set_model_version_tag(NAME, version, STAGES_TAG, json.dumps(stages))
    store[1].set_model_version_tag(NAME, version, "dbspec.approval.production", json.dumps(
        {"state": "pending", "gates": [], "at": "2026-01-01T00:00:00Z", "run_id": run_id}))
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "carol")
    code, _, err = cli(store, "approve", NAME, version, "--alias", "production")
    assert code == 1 and f"{message}; nothing moved" in err and "Traceback" not in err
    assert holder(store, "production") is None


def test_four_eyes_counts_who_moved_it_to_the_stage_before_as_its_requester(
        store, tmp_path, monkeypatch):
    """Without a request (promoted by hand to @staging), whoever moved it there asked."""
    version = four_eyes_version(store, tmp_path, trainer="alice", requester="bob")
    store[1].delete_model_version_tag(NAME, version, "dbspec.approval.production")
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "dave")
    assert cli(store, "promote", NAME, version, "--alias", "staging")[0] == 0
    code, _, err = cli(store, "approve", NAME, version, "--alias", "production")
    assert code == 1 and f"requested the approval of v{version}; someone else approves it" \
        in err, err
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "erin")
    code, out, err = cli(store, "approve", NAME, version, "--alias", "production")
    assert code == 0 and "approved by erin" in out, err


def test_approve_of_a_unity_catalog_model_sets_the_deployment_jobs_approval_tag(
        store, tmp_path, monkeypatch):
    import sys

    uc = "main.ml_models.model"
    monkeypatch.setattr(sys.modules[__name__], "NAME", uc)  # make_version reads NAME
    _, client, _ = store
    client.create_registered_model(uc)
    version = make_version(store, tmp_path, 55.0, awaiting=True)
    check = ("approval", uc, version, "--alias", "production", "--tag", "approval_production")
    assert cli(store, *check)[0] == 1  # not approved yet: the deployment job's task fails
    code, out, err = cli(store, "approve", uc, version, "--alias", "production")
    assert code == 0, err
    assert client.get_model_version(uc, version).tags["approval_production"] == "approved"
    code, out, err = cli(store, *check)
    assert code == 0 and "approval_production=approved" in out, err
    # a workspace registry name gets no such tag
    monkeypatch.setattr(sys.modules[__name__], "NAME", "integrity_model")
    other = make_version(store, tmp_path, 50.0, awaiting=True)
    assert cli(store, "approve", "integrity_model", other, "--alias", "production")[0] == 0
    assert "approval_production" not in client.get_model_version("integrity_model", other).tags
