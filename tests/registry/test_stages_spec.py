"""``registry.promotion`` as a list of stages, and diagnosis gates: what the spec accepts, the
located errors it gives, and what a diagnosis gate decides (pure functions, no registry)."""

from __future__ import annotations

import pytest

from dbspec.cli import main
from dbspec.spec.loader import load_spec
from tests.conftest import run_main

HEAD = """\
name: staged
data: {source: {kind: sklearn, name: diabetes}, task: regression}
model: {layers: [{linear: {out: 1}}]}
registry:
  name: staged_model
  promotion:
"""
STAGES = HEAD + """\
    - alias: staging
      gates:
        - {metric: test_rmse, max: 80}
        - {metric: test_rmse, better_than: staging}
    - alias: production
      gates: [{diagnosis: not_overfitting}]
      approval: required
"""


def test_stages_and_the_single_form_give_one_list(write_spec):
    registry = load_spec(write_spec(STAGES)).spec.registry
    assert [s.alias for s in registry.promotion_stages()] == ["staging", "production"]
    assert registry.staged() and registry.final_alias() == "production"
    assert [s.approval for s in registry.promotion_stages()] == ["none", "required"]
    single = load_spec(write_spec(HEAD + "    alias: production\n"
                                  "    gates: [{metric: test_rmse, max: 80}]\n")).spec.registry
    [stage] = single.promotion_stages()
    assert not single.staged() and stage.alias == "production" and stage.approval == "none"
    assert load_spec(write_spec(HEAD.replace("  promotion:\n", ""))).spec.registry \
        .promotion_stages() == []


@pytest.mark.parametrize("stages, where, message", [
    ("    - {alias: staging}\n    - {alias: staging}\n", "7:5: registry.promotion",
     "stage 1 repeats the alias 'staging' of stage 0; each stage moves its own alias"),
    ("    - {alias: staging, approval: required}\n    - {alias: production}\n",
     "7:5: registry.promotion", "stage 0 ('staging') requires approval but is not the last "
                                "stage"),
    ("    - alias: staging\n      gates: [{metric: test_rmse, better_than: production}]\n",
     "7:5: registry.promotion", "stage 0 ('staging'), gate 0: better_than 'production' is "
                                "not this stage's alias; a stage's gates compare with its own "
                                "holder: write better_than: staging"),
    ("    []\n", "7:5: registry.promotion", "a list of promotion stages needs at least one"),
    ("    - {gates: []}\n", "7:7: registry.promotion.0.alias",
     "required key 'alias' is missing"),
    ("    - {alias: latest}\n", "7:15: registry.promotion.0.alias", "'latest' is reserved"),
    ("    - {alias: staging, approval: yes}\n", "7:34: registry.promotion.0.approval",
     "unknown value true; expected 'none' or 'required'"),
    ("    - alias: staging\n      gates: [{diagnosis: not_overfitting, metric: test_rmse}]\n",
     "8:15: registry.promotion.0.gates.0", "a diagnosis gate takes no metric, min, max or "
                                           "better_than"),
    ("    - alias: staging\n      gates: [{diagnosis: overfit}]\n",
     "8:27: registry.promotion.0.gates.0.diagnosis", "unknown value 'overfit' (did you mean "
                                                     "'not_overfitting'?)"),
    ("    - alias: staging\n      gates: [{tolerance: 1}]\n", "8:15: registry.promotion.0."
     "gates.0", "a gate needs a metric (with min, max or better_than) or a diagnosis"),
    ("    - alias: staging\n      gates: [{metric: test_rsme, max: 1}]\n",
     "8:24: registry.promotion.0.gates.0.metric", "gate on 'test_rsme' (did you mean "
                                                  "'test_rmse'?)"),
])
def test_stage_mistakes_are_located_errors(write_spec, capsys, stages, where, message):
    path = write_spec(HEAD + stages)
    assert main(["validate", path]) == 1
    printed = capsys.readouterr().out
    assert f"{path}:{where}: {message}" in printed, printed
    assert "Traceback" not in printed


def test_the_single_form_keeps_its_error_locations(write_spec, capsys):
    path = write_spec(HEAD + "    gates: [{metric: test_rmse}]\n")
    assert main(["validate", path]) == 1
    assert f"{path}:7:13: registry.promotion.gates.0: a gate needs min, max or better_than" \
        in capsys.readouterr().out


def test_a_spec_with_stages_validates_and_plans(write_spec):
    path = write_spec(STAGES)
    code, out, _ = run_main("validate", path)
    assert code == 0 and "ok" in out
    code, out, _ = run_main("plan", path)
    assert code == 0 and "promote" in out


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
    from dbspec.registry import check_gates
    from dbspec.spec.sections.lifecycle import Gate

    [result] = check_gates([Gate(diagnosis=condition)], {}, _no_champion, diagnosis=label)
    assert result.passed is passed
    assert result.describe() == (f"diagnosis={label} {condition.replace('_', ' ')}: "
                                 + ("pass" if passed else "FAIL"))


@pytest.mark.parametrize("condition", ["not_overfitting", "not_underfitting", "converged"])
@pytest.mark.parametrize("label, why", [(None, "no learning-curve diagnosis recorded"),
                                        ("undetermined", "the learning curves were undetermined")])
def test_an_unknown_diagnosis_fails_every_diagnosis_gate(condition, label, why):
    """Fail closed: nothing says the curves were fine, so the gate does not pass."""
    from dbspec.registry import check_gates
    from dbspec.spec.sections.lifecycle import Gate

    [result] = check_gates([Gate(diagnosis=condition)], {}, _no_champion, diagnosis=label,
                           stage="production")
    assert not result.passed
    assert result.describe().startswith(f"@production: diagnosis={label or 'unknown'} ")
    assert f"{why}; an unknown diagnosis fails the gate" in result.note


def test_a_champion_without_the_metric_fails_better_than():
    """A holder whose metric cannot be had is not 'no holder': the gate fails, naming it."""
    from dbspec.registry import check_gates
    from dbspec.registry.gates import Champion
    from dbspec.spec.sections.lifecycle import Gate

    [result] = check_gates([Gate(metric="test_rmse", better_than="staging")], {"test_rmse": 1.0},
                           lambda alias, metric: Champion("4"))
    assert not result.passed and result.note == "@staging (v4) has no test_rmse to compare with"
    assert "no version holds" not in result.describe()


def test_gate_records_of_a_single_promotion_keep_their_keys():
    from dbspec.registry import check_gates
    from dbspec.spec.sections.lifecycle import Gate

    [result] = check_gates([Gate(metric="test_rmse", max=2)], {"test_rmse": 1.0}, _no_champion)
    assert set(result.to_tag()) == {"metric", "condition", "value", "reference", "passed", "note"}
    [staged] = check_gates([Gate(diagnosis="converged")], {}, _no_champion,
                           diagnosis="converged", stage="production")
    assert staged.to_tag()["stage"] == "production" and staged.to_tag()["label"] == "converged"


def _no_champion(alias: str, metric: str):
    raise AssertionError("no gate here compares with a champion")
