"""Targets, default targets and --set overrides."""

from __future__ import annotations

import pytest

from dbspec.errors import SpecError, UsageError
from dbspec.spec import load_spec
from dbspec.spec.overrides import parse_assignment
from tests.conftest import MINIMAL

TARGETS = MINIMAL + """\
training: {epochs: 5, optimizer: {name: adam, lr: 0.01}}
targets:
  dev: {default: true, training: {epochs: 2}}
  prod:
    mode: production
    training: {optimizer: {lr: 0.001}}
    registry: {name: main.ml.model}
"""


def test_target_merges_mappings_key_by_key(write_spec):
    spec = load_spec(write_spec(TARGETS), target="prod").spec
    assert spec.training.optimizer.lr == 0.001
    assert spec.training.epochs == 5  # untouched keys stay
    assert spec.registry.name == "main.ml.model"
    assert spec.targets["prod"].mode == "production"


def test_a_target_that_changes_a_kind_replaces_the_section(write_spec):
    spec = write_spec(MINIMAL + """\
training: {optimizer: {name: sgd, lr: 0.1, momentum: 0.9}}
compute: {kind: torch_distributor, num_processes: 4, local_mode: false}
targets:
  ray: {compute: {kind: ray, num_workers: 3}, training: {optimizer: {name: adam}}}
  more: {compute: {num_processes: 8}}
""")
    ray = load_spec(spec, target="ray").spec
    assert ray.compute.kind == "ray" and ray.compute.num_workers == 3  # no num_processes left
    assert ray.training.optimizer.name == "adam" and ray.training.optimizer.lr == 0.001
    more = load_spec(spec, target="more").spec  # the same kind still merges key by key
    assert (more.compute.num_processes, more.compute.local_mode) == (8, False)


def test_a_registry_name_is_not_a_kind(write_spec):
    spec = write_spec(MINIMAL + """\
registry: {name: dev_model, promotion: {alias: champion}}
targets:
  prod: {registry: {name: main.ml.model}}
""")
    registry = load_spec(spec, target="prod").spec.registry
    assert registry.name == "main.ml.model" and registry.promotion.alias == "champion"


def test_default_target_applies_when_none_is_named(write_spec):
    loaded = load_spec(write_spec(TARGETS))
    assert loaded.target == "dev" and loaded.spec.training.epochs == 2


def test_unknown_target_suggests_a_name(write_spec):
    with pytest.raises(UsageError, match=r"unknown target 'prd' \(did you mean 'prod'\?\)"):
        load_spec(write_spec(TARGETS), target="prd")


def test_set_overrides_win_and_are_typed(write_spec):
    spec = load_spec(write_spec(TARGETS), target="prod",
                     assignments=["training.epochs=7", "model.layers.0.linear.out=16",
                                  "training.optimizer.name=sgd"]).spec
    assert spec.training.epochs == 7
    assert spec.model.layers[0].args.out == 16
    assert spec.training.optimizer.name == "sgd" and spec.training.optimizer.lr == 0.001


def test_set_errors_name_the_assignment(write_spec):
    with pytest.raises(SpecError) as info:
        load_spec(write_spec(MINIMAL), assignments=["training.epocs=3"])
    (diag,) = info.value.diagnostics
    assert diag.path == "training.epocs"
    assert "did you mean 'epochs'" in diag.message
    assert diag.origin == "--set training.epocs=3"
    assert diag.format().endswith("[from --set training.epocs=3]")


@pytest.mark.parametrize("text, message", [
    ("epochs", "expected dotted.path=value"),
    ("=3", "expected dotted.path=value"),
    ("a..b=1", "not a dotted path"),
    ("a=[1, 2", "not a valid YAML value"),
])
def test_malformed_assignments(text, message):
    with pytest.raises(UsageError, match=message):
        parse_assignment(text)


def test_set_through_a_scalar_is_a_usage_error(write_spec):
    with pytest.raises(UsageError, match="its parent holds the value"):
        load_spec(write_spec(MINIMAL), assignments=["name.first=x"])


def test_set_past_the_end_of_a_list_is_a_usage_error(write_spec):
    with pytest.raises(UsageError, match="not an index of a list of 3 items"):
        load_spec(write_spec(MINIMAL), assignments=["model.layers.7.linear.out=3"])


def test_unknown_key_in_a_target_is_reported(write_spec):
    text = MINIMAL + "targets:\n  prod: {trainig: {epochs: 1}}\n"
    with pytest.raises(SpecError) as info:
        load_spec(write_spec(text), target="prod")
    messages = " ".join(d.message for d in info.value.diagnostics)
    assert "unknown key 'trainig' (did you mean 'training'?)" in messages


def test_set_values_follow_the_file_rules(write_spec):
    base = MINIMAL.replace("{kind: sklearn, name: diabetes}",
                           "{kind: delta, path: t}").replace("- linear: {out: 8}\n    - relu\n", "")
    spec = load_spec(write_spec(base), assignments=["data.source.timestamp=2024-06-01"]).spec
    assert spec.data.source.timestamp == "2024-06-01"  # kept as written, like in a file
    with pytest.raises(UsageError, match="'abc' is not a valid tag"):
        load_spec(write_spec(MINIMAL), assignments=["training.epochs=!!int abc"])
