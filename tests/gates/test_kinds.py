"""The built-in gate kinds (threshold, champion, diagnosis): each satisfies the seam's
Protocol, recognises its own spec gates, and passes, fails or fails closed on a missing
input. Pure: no registry (the service's decisions on a real store are in tests/registry)."""

from __future__ import annotations

import pytest

from dbspec.registry.errors import RegistryError, RegistryUnavailable
from dbspec.seams.gates import GATES, INPUTS, Champion, GateInputs, GateKind
from dbspec.spec.sections.lifecycle import Gate

BUILTINS = tuple(GATES.builtins)


def _no_champion(alias: str, metric: str) -> Champion:
    raise AssertionError("no gate here compares with a champion")


def test_the_three_builtins_load():
    assert BUILTINS == ("threshold", "champion", "diagnosis")
    assert set(GATES.load_all()) >= set(BUILTINS)
    assert all(GATES.origin(name) == "built-in" for name in BUILTINS)


@pytest.mark.parametrize("name", BUILTINS)
def test_every_builtin_satisfies_the_protocol(name):
    kind = GATES.get(name)
    assert isinstance(kind, GateKind) and kind.name == name
    assert kind.needs and set(kind.needs) <= INPUTS


@pytest.mark.parametrize("gate, kinds", [
    ({"metric": "test_rmse", "max": 1}, ["threshold"]),
    ({"metric": "test_rmse", "min": 0, "max": 1}, ["threshold"]),
    ({"metric": "test_rmse", "better_than": "production"}, ["champion"]),
    ({"metric": "test_rmse", "max": 9, "better_than": "production"}, ["threshold", "champion"]),
    ({"diagnosis": "converged"}, ["diagnosis"]),
])
def test_each_spec_gate_is_evaluated_by_the_kinds_it_names(gate, kinds):
    spec_gate = Gate.model_validate(gate)
    assert [n for n in BUILTINS if GATES.get(n).applies(spec_gate)] == kinds


# -- threshold

@pytest.mark.parametrize("bounds, value, passed, condition", [
    ({"max": 65}, 54.2, True, "<= 65"),
    ({"max": 65}, 65.0, True, "<= 65"),
    ({"max": 65}, 65.1, False, "<= 65"),
    ({"min": 0.8}, 0.79, False, ">= 0.8"),
    ({"min": 0.5, "max": 0.9}, 0.7, True, ">= 0.5 and <= 0.9"),
    ({"min": 0.5, "max": 0.9}, 0.95, False, ">= 0.5 and <= 0.9"),
])
def test_threshold_pass_and_fail(bounds, value, passed, condition):
    kind = GATES.get("threshold")
    result = kind.evaluate(Gate(metric="test_x", **bounds), GateInputs({"test_x": value}))
    assert (result.passed, result.condition, result.value) == (passed, condition, value)


def test_threshold_on_a_metric_not_logged_fails():
    result = GATES.get("threshold").evaluate(Gate(metric="test_rmse", max=2),
                                             GateInputs({"test_mae": 1.0}, stage="staging"))
    assert not result.passed and result.value is None
    assert result.describe() == "@staging: test_rmse=missing <= 2: FAIL"


def test_gate_records_of_a_single_promotion_keep_their_keys():
    result = GATES.get("threshold").evaluate(Gate(metric="test_rmse", max=2),
                                             GateInputs({"test_rmse": 1.0}))
    assert set(result.to_tag()) == {"metric", "condition", "value", "reference", "passed", "note"}
    staged = GATES.get("diagnosis").evaluate(Gate(diagnosis="converged"),
                                             GateInputs(diagnosis="converged",
                                                        stage="production"))
    assert staged.to_tag()["stage"] == "production" and staged.to_tag()["label"] == "converged"


# -- champion: the direction of the metric decides

@pytest.mark.parametrize("metric, value, reference, tolerance, passed, sign", [
    ("test_rmse", 50.0, 55.0, 0.0, True, "<="),
    ("test_rmse", 56.0, 55.0, 0.0, False, "<="),
    ("test_rmse", 56.0, 55.0, 2.0, True, "<="),
    ("test_accuracy", 0.91, 0.9, 0.0, True, ">="),
    ("test_accuracy", 0.89, 0.9, 0.0, False, ">="),
    ("test_accuracy", 0.89, 0.9, 0.02, True, ">="),
    ("val_log_loss", 0.3, 0.4, 0.0, True, "<="),
])
def test_champion_pass_and_fail_in_the_metric_direction(metric, value, reference, tolerance,
                                                          passed, sign):
    gate = Gate(metric=metric, better_than="production", tolerance=tolerance)
    result = GATES.get("champion").evaluate(gate, GateInputs(
        {metric: value}, champion=lambda alias, m: Champion("3", reference)))
    assert result.passed is passed and result.reference == reference
    assert result.condition.startswith(f"{sign} @production")
    assert result.note == f"@production has {reference:.6g} (v3)"


def test_champion_with_no_holder_passes_and_a_missing_metric_fails():
    gate = Gate(metric="test_rmse", better_than="production")
    nobody = GateInputs({"test_rmse": 1.0}, champion=lambda alias, m: Champion(None))
    first = GATES.get("champion").evaluate(gate, nobody)
    assert first.passed and first.note == "no version holds @production yet"
    missing = GATES.get("champion").evaluate(
        gate, GateInputs({}, champion=lambda alias, m: Champion("3", 2.0)))
    assert not missing.passed and missing.value is None and missing.reference == 2.0


def test_a_champion_without_the_metric_fails_better_than():
    """A holder whose metric cannot be had is not 'no holder': the gate fails, naming it."""
    [result] = [GATES.get("champion").evaluate(
        Gate(metric="test_rmse", better_than="staging"),
        GateInputs({"test_rmse": 1.0}, champion=lambda alias, metric: Champion("4")))]
    assert not result.passed and result.note == "@staging (v4) has no test_rmse to compare with"
    assert "no version holds" not in result.describe()


def test_a_champion_that_cannot_be_read_fails_the_gate():
    def unreadable(alias: str, metric: str) -> Champion:
        raise RegistryUnavailable("the registry did not answer (503)")

    result = GATES.get("champion").evaluate(Gate(metric="test_rmse", better_than="production"),
                                            GateInputs({"test_rmse": 1.0}, champion=unreadable))
    assert not result.passed
    assert result.note == "cannot compare with @production: the registry did not answer (503)"
    assert isinstance(RegistryUnavailable("x"), RegistryError)


def test_a_champion_gate_without_a_lookup_fails_closed():
    result = GATES.get("champion").evaluate(Gate(metric="test_rmse", better_than="production"),
                                            GateInputs({"test_rmse": 1.0}))
    assert not result.passed and result.note == "no champion lookup for @production"


# -- diagnosis

@pytest.mark.parametrize("condition, label, passed", [
    ("not_overfitting", "converged", True),
    ("not_overfitting", "underfitting", True),
    ("not_overfitting", "overfitting", False),
    ("not_underfitting", "overfitting", True),
    ("not_underfitting", "underfitting", False),
    ("converged", "converged", True),
    ("converged", "overfitting", False),
    ("converged", "underfitting", False),
])
def test_a_diagnosis_gate_against_each_label(condition, label, passed):
    result = GATES.get("diagnosis").evaluate(Gate(diagnosis=condition),
                                             GateInputs(diagnosis=label))
    assert result.passed is passed
    assert result.describe() == (f"diagnosis={label} {condition.replace('_', ' ')}: "
                                 + ("pass" if passed else "FAIL"))


@pytest.mark.parametrize("condition", ["not_overfitting", "not_underfitting", "converged"])
@pytest.mark.parametrize("label, why", [(None, "no learning-curve diagnosis recorded"),
                                        ("undetermined", "the learning curves were undetermined")])
def test_an_unknown_diagnosis_fails_every_diagnosis_gate(condition, label, why):
    """Fail closed: nothing says the curves were fine, so the gate does not pass."""
    result = GATES.get("diagnosis").evaluate(Gate(diagnosis=condition),
                                             GateInputs(diagnosis=label, stage="production"))
    assert not result.passed
    assert result.describe().startswith(f"@production: diagnosis={label or 'unknown'} ")
    assert f"{why}; an unknown diagnosis fails the gate" in result.note
