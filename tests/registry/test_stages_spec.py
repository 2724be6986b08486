"""``registry.promotion`` as a list of stages, and diagnosis gates: what the spec accepts and
the located errors it gives (what each gate kind decides is in tests/gates)."""

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
    ("    - {alias: production, four_eyes: true}\n", "7:7: registry.promotion.0",
     "four_eyes: true needs approval: required (it is a rule on who approves)"),
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
