"""The promotion service on typed candidates, against a real MLflow registry (SQLite in the
test's directory): the run's walk through its stages, ``promote``, ``approve``, ``rollback``,
what they record, the errors they give, and a gate kind registered at run time taking part.
No training: a candidate's champions are scored by a plain function of (holder, metric)."""

from __future__ import annotations

import json

import pytest

from dbspec.registry.candidate import Candidate, StageRecord, recorded_candidate
from dbspec.registry.errors import RegistryError
from dbspec.registry.promotion import (GatesFailed, approve, promote, promote_stages,
                                       rollback)
from dbspec.seams.gates import GATES, METRICS, GateInputs, GateResult
from dbspec.spec.sections.lifecycle import Gate
from tests.conftest import run_main
from tests.registry.conftest import NAME

BOUND = Gate(metric="test_rmse", max=80)
BEAT = Gate(metric="test_rmse", better_than="champion")


def _version(store, tmp_path, rmse: float, **tags: str) -> str:
    _, client, _ = store
    recorded = {"metric.test_rmse": str(rmse), "dbspec.decision": "pending", **tags}
    return str(client.create_model_version(NAME, str(tmp_path / "model"),
                                           tags=recorded).version)


def _candidate(version: str, rmse: float, *stages: StageRecord, **more) -> Candidate:
    """A run's candidate whose champions score what their metric.test_rmse tag says."""
    figures = {"1": 60.0, "2": 50.0, "3": 70.0}
    return Candidate(NAME, version, {"test_rmse": rmse},
                     lambda holder, metric: figures.get(holder), stages=stages, **more)


def test_a_run_promotes_a_first_version_then_rejects_a_worse_one(store, tmp_path):
    _, client, registry = store
    stage = StageRecord("champion", (BOUND, BEAT))
    first = promote_stages(registry, _candidate(_version(store, tmp_path, 60), 60.0, stage),
                           staged=False)
    assert first.outcome == "promoted" and first.passed
    [decision] = first.decisions
    assert (decision.alias, decision.version, decision.moved, decision.previous) == \
        ("champion", "1", True, None)
    assert [type(r) for r in decision.results] == [GateResult, GateResult]
    assert decision.gates == ["test_rmse=60 <= 80: pass",
                              "test_rmse=60 <= @champion: pass (no version holds @champion yet)"]

    worse = promote_stages(registry, _candidate(_version(store, tmp_path, 70), 70.0, stage),
                           staged=False)
    assert worse.outcome == "rejected" and not worse.decisions[0].moved
    assert worse.decisions[0].results[1].reference == 60.0
    assert str(client.get_model_version_by_alias(NAME, "champion").version) == "1"
    tags = client.get_model_version(NAME, "2").tags
    assert tags["dbspec.decision"] == "rejected"
    assert json.loads(tags["dbspec.gate.1"])["passed"] is False
    assert json.loads(tags["dbspec.gates"]) == [{"metric": "test_rmse", "max": 80.0,
                                                 "tolerance": 0.0},
                                                {"metric": "test_rmse", "better_than": "champion",
                                                 "tolerance": 0.0}]


def test_a_staged_run_stops_at_approval_and_approve_moves_it(store, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "dana")
    _, client, registry = store
    stages = (StageRecord("staging", (BOUND,)),
              StageRecord("production", (Gate(metric="test_rmse", better_than="production"),),
                          "required"))
    version = _version(store, tmp_path, 50)
    walked = promote_stages(registry, _candidate(version, 50.0, *stages, run_id="r1"),
                            staged=True)
    assert [(d.alias, d.outcome) for d in walked.decisions] == [
        ("staging", "promoted"), ("production", "awaiting_approval")]
    assert [r.stage for r in walked.results] == ["staging", "production"]
    assert recorded_candidate(registry, NAME, version).approvals["production"]["state"] == \
        "pending"

    approved = approve(registry, NAME, version, "production")
    assert (approved.outcome, approved.moved) == ("promoted", True)
    assert approved.by.startswith("dana (unverified: the store has no authentication")
    assert approved.results[0].stage == "production" and approved.passed
    assert str(client.get_model_version_by_alias(NAME, "production").version) == version


def test_the_recorded_candidate_reads_what_the_run_recorded(store, tmp_path):
    _, _, registry = store
    stages = [StageRecord("staging", (BOUND,)).to_json()]
    version = _version(store, tmp_path, 42, **{
        "dbspec.diagnosis": "converged", "dbspec.stages": json.dumps(stages),
        "dbspec.gates": json.dumps(stages[0]["gates"]), "metric.test_r2": "0.5",
        "metric.broken": "not a number", "dbspec.run_id": "r9"})
    candidate = recorded_candidate(registry, NAME, version)
    assert candidate.metrics == {"test_rmse": 42.0, "test_r2": 0.5}
    assert (candidate.diagnosis, candidate.decision, candidate.run_id) == \
        ("converged", "pending", "r9")
    assert candidate.stages == (StageRecord("staging", (BOUND,)),)
    assert candidate.gates == (BOUND,) and candidate.final_alias == "staging"


def test_promote_returns_a_decision_and_raises_one_when_gates_fail(store, tmp_path):
    _, client, registry = store
    gated = {"dbspec.gates": json.dumps([{"metric": "test_rmse", "better_than": "prod"}])}
    good = _version(store, tmp_path, 60, **gated)
    decision = promote(registry, NAME, good, "prod")
    assert (decision.outcome, decision.moved, decision.forced) == ("promoted", True, False)
    worse = _version(store, tmp_path, 61, **gated)
    with pytest.raises(GatesFailed, match="fails its gates: test_rmse=61 <= @prod") as failed:
        promote(registry, NAME, worse, "prod")
    assert failed.value.decision.outcome == "rejected" and not failed.value.decision.moved
    assert failed.value.decision.results[0].reference == 60.0
    assert client.get_model_version(NAME, worse).tags["dbspec.decision"] == "rejected"
    forced = promote(registry, NAME, worse, "prod", force=True)
    assert forced.forced and forced.results == () and forced.previous == good


def test_rollback_is_a_decision_of_the_service(store, tmp_path):
    _, _, registry = store
    one, two = (_version(store, tmp_path, 60), _version(store, tmp_path, 50))
    for version in (one, two):
        promote(registry, NAME, version, "prod", force=True)
    back = rollback(registry, NAME, "prod")
    assert (back.outcome, back.version, back.previous, back.moved) == \
        ("rolled_back", one, two, True)
    kept = rollback(registry, NAME, "prod", expected=two)  # monitor's: v2 no longer holds it
    assert (kept.outcome, kept.version, kept.moved) == ("unchanged", None, False)


@pytest.mark.parametrize("recorded, message", [
    ('{"metric": "test_rmse"}', "dbspec.gates: recorded gates are not a list"),
    ('[{"metric": "test_rmse", "mx": 3}]', "dbspec.gates: a recorded gate is not a gate: "
                                           "Extra inputs are not permitted"),
    ('[{"metric": "test_rmse"}]', "dbspec.gates: a recorded gate is not a gate: Value error, "
                                  "a gate needs min, max or better_than"),
])
def test_gates_recorded_in_a_form_that_is_not_one_are_a_located_error(store, tmp_path,
                                                                        recorded, message):
    uri, _, _ = store
    version = _version(store, tmp_path, 50, **{"dbspec.gates": recorded})
    code, out, err = run_main("promote", NAME, version, "--alias", "prod", "--tracking-uri", uri)
    assert code == 1 and out == "" and "Traceback" not in err
    assert f"error: {NAME} v{version} {message}" in err, err
    assert "rerun the spec to record them again (dbspec promote --force moves it" in err
    code, out, err = run_main("promote", NAME, version, "--alias", "prod", "--force",
                              "--tracking-uri", uri)  # checks no gate: moves it all the same
    assert code == 0 and f"{NAME}@prod -> v{version}" in out, err


def test_a_recorded_stage_with_broken_gates_names_its_stage(store, tmp_path):
    _, _, registry = store
    stages = json.dumps([{"alias": "staging", "gates": [{"max": 1}]}])
    version = _version(store, tmp_path, 50, **{"dbspec.stages": stages})
    with pytest.raises(RegistryError, match=r"v1 dbspec.stages @staging: a recorded gate is "
                                            r"not a gate: .*a gate needs a metric"):
        recorded_candidate(registry, NAME, version)


class _Margin:
    """A gate kind of a test: a ``max`` bound must be met with half of it to spare."""

    name = "margin"
    needs = frozenset({METRICS})

    def applies(self, gate) -> bool:
        return gate.metric is not None and gate.max is not None

    def evaluate(self, gate, inputs: GateInputs) -> GateResult:
        value = inputs.metrics.get(gate.metric)
        limit = gate.max / 2
        return GateResult(gate.metric, f"<= {limit:g} (margin)", value, None,
                          value is not None and value <= limit, stage=inputs.stage)


@pytest.fixture
def registered():
    """Register gate kinds for one test, and remove them after it."""
    names = []

    def register(name: str, kind) -> None:
        GATES.register(name, kind)
        names.append(name)

    yield register
    for name in names:
        GATES.unregister(name)


def test_a_gate_kind_registered_at_run_time_is_asked_by_the_service(store, tmp_path,
                                                                    registered):
    _, client, registry = store
    registered("margin", _Margin())
    stage = StageRecord("champion", (BOUND,))
    walked = promote_stages(registry, _candidate(_version(store, tmp_path, 50), 50.0, stage),
                            staged=False)
    assert walked.decisions[0].gates == ["test_rmse=50 <= 80: pass",
                                         "test_rmse=50 <= 40 (margin): FAIL"]
    assert walked.outcome == "rejected" and not walked.decisions[0].moved
    assert json.loads(client.get_model_version(NAME, "1").tags["dbspec.gate.1"])[
        "condition"] == "<= 40 (margin)"
    good = promote_stages(registry, _candidate(_version(store, tmp_path, 30), 30.0, stage),
                          staged=False)
    assert good.outcome == "promoted" and len(good.results) == 2


class _Broken(_Margin):
    def evaluate(self, gate, inputs):
        raise ZeroDivisionError("division by zero")


class _Untyped(_Margin):
    def evaluate(self, gate, inputs):
        return {"passed": True}


class _Greedy(_Margin):
    needs = frozenset({METRICS, "latency"})


@pytest.mark.parametrize("kind, message", [
    (_Broken(), r"promotion gate kind 'margin' \(registered at run time\) failed: "
                r"ZeroDivisionError: division by zero"),
    (_Untyped(), r"promotion gate kind 'margin' \(registered at run time\) returned dict, "
                 r"not a GateResult"),
    (_Greedy(), r"promotion gate kind 'margin' \(registered at run time\) needs latency, which "
                r"the promotion service does not gather \(it gathers champion, diagnosis, "
                r"metrics\)"),
])
def test_a_gate_kind_that_misbehaves_is_named_and_nothing_moves(store, tmp_path, registered,
                                                                 kind, message):
    _, client, registry = store
    registered("margin", kind)
    candidate = _candidate(_version(store, tmp_path, 50), 50.0,
                           StageRecord("champion", (BOUND,)))
    with pytest.raises(RegistryError, match=message):
        promote_stages(registry, candidate, staged=False)
    assert "champion" not in (client.get_registered_model(NAME).aliases or {})


def test_a_gate_no_kind_evaluates_fails_closed():
    from dbspec.plugins import KindRegistry
    from dbspec.registry.gating import evaluate_gates

    nothing = KindRegistry("dbspec.test_gates", "promotion gate kind", {})
    [result] = evaluate_gates([BOUND], GateInputs({"test_rmse": 1.0}), nothing)
    assert not result.passed
    assert result.note == "no promotion gate kind evaluates {'metric': 'test_rmse', 'max': " \
                          "80.0, 'tolerance': 0.0}"


def test_only_run_time_kinds_can_be_unregistered():
    with pytest.raises(ValueError, match="'threshold' was not registered at run time "
                                         r"\(built-in\)"):
        GATES.unregister("threshold")
    replaced = _Margin()
    GATES.register("threshold", replaced, replace=True)
    assert GATES.get("threshold") is replaced
    GATES.unregister("threshold")  # the built-in comes back
    assert GATES.origin("threshold") == "built-in" and GATES.get("threshold") is not replaced


def test_the_generated_jobs_promote_task_runs_the_promote_stage(tmp_path):
    """The Databricks job's ``promote`` task runs ``dbspec run --only promote``: the run's
    promote stage, i.e. :func:`promote_stages` (nothing in ``jobs/`` decides a promotion)."""
    from tests.conftest import ROOT
    from tests.jobs.test_jobs import payload

    body = payload(tmp_path, ROOT / "specs" / "diabetes.yaml", "--target", "prod")
    [task] = [t for t in body["tasks"] if t["task_key"] == "promote"]
    parameters = task["python_wheel_task"]["parameters"]
    assert parameters[0] == "run" and parameters[parameters.index("--only") + 1] == "promote"
    assert parameters.count("--only") == 1
