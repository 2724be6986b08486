"""Spec -> plan: stage lists, edges, fingerprints and their invalidation."""

from __future__ import annotations

import json

import pytest

from dbspec.plan import compile_plan
from dbspec.plan.render import render_json, render_mermaid, render_text
from dbspec.spec import apply_values, load_spec
from tests.conftest import MINIMAL, ROOT, SPECS


def plan_for(path, **kwargs):
    return compile_plan(load_spec(str(path), **kwargs).spec)


def test_minimal_plan_has_the_core_stages(write_spec):
    plan = plan_for(write_spec(MINIMAL))
    assert plan.names == ("load_data", "split", "preprocess", "train", "evaluate")


def test_full_plan_order_and_edges():
    plan = plan_for(ROOT / "specs" / "breast_cancer_search.yaml")
    assert plan.names == ("load_data", "split", "preprocess", "tune", "train", "evaluate",
                          "register", "promote")
    assert plan["train"].depends_on == ("preprocess", "tune")
    assert plan["promote"].depends_on == ("register", "evaluate")
    for stage in plan:  # every dependency comes earlier
        assert all(plan.names.index(dep) < plan.names.index(stage.name)
                   for dep in stage.depends_on)


def test_serving_mode_adds_the_last_stage():
    assert plan_for(ROOT / "specs" / "diabetes_batch.yaml").names[-1] == "batch_predict"


def test_realtime_serving_stage(write_spec):
    plan = plan_for(write_spec(MINIMAL + "registry: {name: m}\nserving: {mode: realtime}\n"))
    assert plan.names[-2:] == ("register", "serve")
    assert plan["serve"].depends_on == ("register",)


def test_fingerprints_are_deterministic(write_spec):
    path = write_spec(MINIMAL)
    assert plan_for(path).to_dict() == plan_for(path).to_dict()


def changed_stages(before, after):
    return {s.name for s in after if s.fingerprint != before[s.name].fingerprint}


@pytest.mark.parametrize("values, expected", [
    ({"training.epochs": 3}, {"train", "evaluate", "register", "promote", "serve"}),
    ({"evaluation.plots": ["loss_curve"]}, {"evaluate", "register", "promote", "serve"}),
    ({"evaluation.threshold": 0.3}, {"train", "evaluate", "register", "promote", "serve"}),
    # the logged model applies it (load_model(...).predict, spark_udf, Model Serving)
    ({"serving.out_of_range.action": "reject"}, {"train", "evaluate", "register", "promote",
                                                 "serve"}),
    ({"data.split.seed": 7}, {"split", "preprocess", "train", "evaluate", "register",
                              "promote", "serve"}),
    ({"registry.promotion.1.approval": "none"}, {"promote", "serve"}),
    ({"description": "changed"}, set()),
])
def test_a_change_reruns_exactly_its_dependents(values, expected):
    loaded = load_spec(str(ROOT / "specs" / "diabetes.yaml"))
    before = compile_plan(loaded.spec)
    after = compile_plan(apply_values(loaded, values).spec)
    assert changed_stages(before, after) == expected
    if expected:  # what changed is exactly the first changed stage and its downstream
        first = next(name for name in before.names if name in expected)
        assert set(before.downstream(first)) == expected


def test_data_version_enters_every_fingerprint(write_spec):
    spec = load_spec(write_spec(MINIMAL)).spec
    v1, v2 = compile_plan(spec, data_version="3"), compile_plan(spec, data_version="4")
    assert all(a.fingerprint != b.fingerprint for a, b in zip(v1, v2))


def test_the_executor_enters_only_the_data_stages_own_fingerprints():
    # fails on the old code: --executor spark after a local run skipped every stage (the
    # executor was in no fingerprint); with it in the chain, the model would retrain instead
    spec = load_spec(str(ROOT / "specs" / "diabetes.yaml")).spec
    local, spark = compile_plan(spec), compile_plan(spec, executor="spark")
    assert changed_stages(local, spark) == {"load_data", "split", "preprocess"}
    assert compile_plan(spec, executor="local").to_dict() == local.to_dict()  # as before


def test_renderers(write_spec):
    plan = plan_for(write_spec(MINIMAL))
    data = json.loads(render_json(plan))
    assert [s["name"] for s in data["stages"]] == list(plan.names)
    assert set(data["stages"][0]) == {"name", "depends_on", "reads", "fingerprint"}
    assert "preprocess --> train" in render_mermaid(plan)
    assert render_text(plan).splitlines()[0] == "plan for minimal: 5 stages"


@pytest.mark.parametrize("path", SPECS, ids=[p.stem for p in SPECS])
def test_every_example_spec_plans(path):
    plan = plan_for(path)
    assert plan.names[:3] == ("load_data", "split", "preprocess")
