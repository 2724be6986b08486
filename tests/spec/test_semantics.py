"""Cross-field checks on otherwise well-typed specs."""

from __future__ import annotations

import pytest

from dbspec.errors import SpecError
from dbspec.spec import load_spec
from tests.conftest import MINIMAL


def diagnostics_for(write_spec, text, **kwargs):
    try:
        return list(load_spec(write_spec(text), **kwargs).warnings)
    except SpecError as exc:
        return list(exc.diagnostics)


def test_minimal_spec_is_clean(write_spec):
    loaded = load_spec(write_spec(MINIMAL))
    assert loaded.warnings == ()
    assert loaded.spec.training.loss_for("regression") == "mse"


def test_final_softmax_with_cross_entropy_warns(write_spec):
    text = ("name: w\ndata: {source: {kind: sklearn, name: iris}, task: multiclass}\n"
            "model: {layers: [{linear: {out: 3}}, softmax]}\n")
    (diag,) = diagnostics_for(write_spec, text)
    assert diag.severity == "warning" and "remove the final softmax" in diag.message


def test_binary_with_two_outputs_needs_cross_entropy(write_spec):
    text = ("name: b\ndata: {source: {kind: sklearn, name: breast_cancer}, task: binary}\n"
            "model: {layers: [{linear: {out: 2}}]}\n")
    (diag,) = diagnostics_for(write_spec, text)
    assert "binary with loss 'bce' needs 1" in diag.message
    assert diagnostics_for(write_spec, text + "training: {loss: cross_entropy}\n") == []


def test_unknown_feature_count_skips_shape_checks(write_spec):
    text = ("name: c\ndata: {source: {kind: csv, path: rows.csv}, task: regression}\n"
            "model: {layers: [{linear: {out: 1}}]}\n")
    assert diagnostics_for(write_spec, text) == []


def test_synthetic_source_gives_the_width(write_spec):
    text = ("name: s\ndata: {source: {kind: synthetic, features: 12, classes: 4}, "
            "task: multiclass}\nmodel: {layers: [{reshape: {shape: [3, 4]}}, "
            "{conv1d: {out: 2, kernel: 2}}, flatten, {linear: {out: 4}}]}\n")
    assert diagnostics_for(write_spec, text) == []


def test_delta_version_and_timestamp_are_exclusive(write_spec):
    text = ("name: d\ndata: {source: {kind: delta, path: t, version: 3, "
            "timestamp: '2024-01-01'}, task: regression}\nmodel: {layers: [{linear: {out: 1}}]}\n")
    (diag,) = diagnostics_for(write_spec, text)
    assert diag.path == "data.source.timestamp" and "not both" in diag.message


def test_deepspeed_on_gpus_warns_when_validating(write_spec):
    text = MINIMAL + "compute: {kind: deepspeed, num_gpus: 4}\n"
    (diag,) = diagnostics_for(write_spec, text)
    assert diag.severity == "warning" and "needs 4 GPU(s)" in diag.message


def test_deepspeed_auto_values_are_refused(write_spec):
    text = MINIMAL + ("compute: {kind: deepspeed, use_gpu: false, "
                      "config: {zero_optimization: {reduce_bucket_size: auto}}}\n")
    (diag,) = diagnostics_for(write_spec, text)
    assert "'auto'" in diag.message


def test_nccl_without_gpus(write_spec):
    text = MINIMAL + "compute: {kind: torch_distributor, use_gpu: false, backend: nccl}\n"
    (diag,) = diagnostics_for(write_spec, text)
    assert diag.path == "compute.backend"


def test_batch_serving_needs_its_section(write_spec):
    text = MINIMAL + "registry: {name: m}\nserving: {mode: batch}\n"
    (diag,) = diagnostics_for(write_spec, text)
    assert "mode batch needs a 'batch' section" in diag.message


def test_realtime_on_a_public_address_needs_a_token(write_spec):
    text = MINIMAL + ("registry: {name: m}\nserving: {mode: realtime, realtime: "
                      "{host: 0.0.0.0, auth: {token_env: null}}}\n")
    (diag,) = diagnostics_for(write_spec, text)
    assert "expose the model" in diag.message


def test_search_direction_against_metric_warns(write_spec):
    text = MINIMAL + ("search:\n  metric: val_rmse\n  direction: maximize\n  space:\n"
                      "    training.optimizer.lr: {float: [0.001, 0.1]}\n")
    (diag,) = diagnostics_for(write_spec, text)
    assert diag.severity == "warning" and "usually minimized" in diag.message


def test_custom_model_path_is_checked(write_spec):
    base = "name: c\ndata: {source: {kind: sklearn, name: diabetes}, task: regression}\n"
    ok = diagnostics_for(write_spec, base + "model: {custom: {class: 'collections:OrderedDict'}}\n")
    assert ok == []
    (missing,) = diagnostics_for(write_spec, base + "model: {custom: {class: 'nopkg_x.nets:Net'}}\n")
    assert missing.severity == "warning" and "not importable" in missing.message
    (bad,) = diagnostics_for(write_spec, base + "model: {custom: {class: 'no colon'}}\n")
    assert bad.path == "model.custom.class" and "write 'package.module:ClassName'" in bad.message


def test_model_needs_layers_or_custom(write_spec):
    base = "name: c\ndata: {source: {kind: sklearn, name: diabetes}, task: regression}\n"
    (diag,) = diagnostics_for(write_spec, base + "model: {}\n")
    assert "give 'layers'" in diag.message


@pytest.mark.parametrize("field, value, message", [
    ("training.optimizer.name", "sgd", None),
    ("training.epochs", "0", "greater than or equal to 1"),
    ("data.split.validation", "1.5", "less than 1"),
])
def test_bounds_through_set(write_spec, field, value, message):
    found = diagnostics_for(write_spec, MINIMAL, assignments=[f"{field}={value}"])
    if message is None:
        assert found == []
    else:
        assert message in found[0].message


def test_search_over_vars_and_selectors(write_spec):
    text = ("name: s\nvars: {dropout: 0}\ndata: {source: {kind: sklearn, name: diabetes}, "
            "task: regression}\nmodel: {layers: [{linear: {out: 8}}, {dropout: {p: "
            "'{{ dropout }}'}}, {linear: {out: 1}}]}\nsearch:\n  space:\n"
            "    vars.dropout: {float: [0.0, 0.5]}\n"
            "    training.optimizer.name: {categorical: [adam, sgd]}\n")
    assert diagnostics_for(write_spec, text) == []


CSV_SPEC = """\
name: c
data:
  source: {kind: csv, path: rows.csv}
  target: Y
  task: regression
  features: [a, bb, c]
  streaming: {key: id}
model: {layers: [{linear: {out: 1}}]}
"""


def test_a_local_csv_header_names_the_columns_it_lacks(workdir):
    (workdir / "rows.csv").write_text("a,b,c,y\n1,2,x,3\n")
    found = {(d.line, d.column, d.path): d.message
             for d in diagnostics_for(lambda text: _write(workdir, text), CSV_SPEC)}
    assert found[(4, 11, "data.target")] == ("no column 'Y' in rows.csv (did you mean 'y'?); "
                                             "its header has: a, b, c, y")
    assert found[(6, 17, "data.features.1")].startswith("no column 'bb' in rows.csv (did you "
                                                        "mean 'b'?)")
    assert found[(7, 20, "data.streaming.key")].startswith("no column 'id' in rows.csv;")
    assert not any(path.startswith("data.features.") and path != "data.features.1"
                   for _, _, path in found)


def test_a_local_csv_header_with_a_repeated_name_is_refused_at_validate(workdir):
    (workdir / "rows.csv").write_text("a,b,a,Y\n1,2,3,4\n")
    (diag,) = [d for d in diagnostics_for(lambda text: _write(workdir, text), CSV_SPEC)
               if d.severity == "error"]
    assert (diag.line, diag.path) == (3, "data.source.path")
    assert diag.message == "rows.csv:1: repeated column name(s) 'a': give every column its own name"


def test_a_csv_source_that_is_not_a_local_file_is_left_to_the_run(workdir):
    (workdir / "rows.csv").mkdir()  # a directory of CSV files: each file is checked when read
    assert [d for d in diagnostics_for(lambda text: _write(workdir, text), CSV_SPEC)
            if d.severity == "error"] == []


def _write(directory, text: str) -> str:
    (directory / "spec.yaml").write_text(text)
    return "spec.yaml"


@pytest.mark.parametrize("layers, message", [
    ("[{linear: {out: 3}}, relu, {dropout: {p: 0.1}}]", "the network outputs 3 values per row; "
                                                        "binary with loss 'bce' needs 1"),
    ("[{linear: {out: 3}}, flatten]", None),  # the width after flatten needs the input's shape
    ("[{linear: {out: 1}}]", None),
])
def test_without_the_input_width_a_final_linear_layer_is_checked(write_spec, layers, message):
    text = ("name: c\ndata: {source: {kind: csv, path: not-here.csv}, task: binary}\n"
            f"model: {{layers: {layers}}}\n")
    found = [(d.path, d.message) for d in diagnostics_for(write_spec, text)]
    assert found == ([("model.layers.2", message)] if message else [])
