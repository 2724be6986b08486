"""Typed features (issue 19) as a user meets them: located validate errors, shape rules of the
new layers, what ``dbspec plan`` says about the inputs, light imports, and the data-time
errors of a run.

Most validate-time errors have a fixture in ``tests/assets/invalid/typed_*.yaml`` (checked by
``test_invalid_specs.py``): unknown encoder keys, encoders for numeric features, encoder kinds
a type does not take, transformer and attention heads, a CNN too deep for its images, layer
encoders that do not end flat, misplaced embeddings, the head on the combined width,
data.streaming and model.custom with typed features, duplicate features. The rest are here,
with the errors pydantic reports (their wording and paths come from ``spec/translate.py``).
"""

from __future__ import annotations

import math
import re
import subprocess
import sys

import pytest

from dbspec.spec.sections.layers import LayerSpec
from dbspec.spec.shapes import ShapeError, infer_shapes
from tests.conftest import ROOT, run_cli, run_in_process


def line_of(text: str, needle: str) -> int:
    """The 1-based line of ``text`` that holds ``needle`` (its first one)."""
    return next(n for n, line in enumerate(text.splitlines(), 1) if needle in line)


def validated(write_spec, text: str) -> tuple[str, list[str]]:
    """``dbspec validate`` on ``text``: the file and its diagnostic lines; it must fail
    (exit 1) without a traceback."""
    path = write_spec(text)
    result = run_in_process("validate", path)
    printed = result.stdout + result.stderr
    assert result.returncode == 1, printed
    assert "Traceback" not in printed
    return path, [line for line in result.stdout.splitlines() if line.startswith(path + ":")]


# --- validate: errors pydantic reports ------------------------------------------------------

IMAGES = """\
name: images
data:
  source: {kind: parquet, path: rows.parquet}
  task: binary
  target: label
  features:
    - {name: gray, type: image, height: 8, width: 8, channels: 1, normalize: {mean: [0.5, 0.5, 0.5], std: [0.2, 0.2, 0.2]}}
    - {name: rgb, type: image, height: 8, width: 8, normalize: {mean: [0.5], std: [0.2]}}
    - {name: scan, type: image, height: 8, width: 8, channels: 1, normalize: imagenet}
model:
  layers:
    - linear: {out: 1}
"""


def test_image_normalization_must_fit_the_channels(write_spec):
    path, lines = validated(write_spec, IMAGES)
    expected = {"gray": "mean and std need 1 value(s), one per channel",
                "rgb": "mean and std need 3 value(s), one per channel",
                "scan": "imagenet statistics are for 3 channels"}
    for index, (name, message) in enumerate(expected.items()):
        line = line_of(IMAGES, f"name: {name},")
        assert any(re.match(rf"{re.escape(path)}:{line}:\d+: data\.features\.{index}\.normalize: "
                            + re.escape(message), text) for text in lines), (name, lines)
    assert len(lines) == 3, lines


def test_image_normalization_errors_point_at_normalize(write_spec):
    path, lines = validated(write_spec, IMAGES)
    for index, name in enumerate(("gray", "rgb", "scan")):
        line = line_of(IMAGES, f"name: {name},")
        column = IMAGES.splitlines()[line - 1].index("normalize: ") + len("normalize: ") + 1
        assert any(text.startswith(f"{path}:{line}:{column}: data.features.{index}.normalize: ")
                   for text in lines), (name, lines)


UNKNOWN_TYPE = """\
name: types
data:
  source: {kind: parquet, path: rows.parquet}
  task: binary
  features:
    - x
    - {name: review, type: txt}
model:
  layers:
    - linear: {out: 1}
"""


def test_an_unknown_feature_type_is_located_and_lists_the_types(write_spec):
    path, (line,) = validated(write_spec, UNKNOWN_TYPE)
    row = line_of(UNKNOWN_TYPE, "type: txt")
    column = UNKNOWN_TYPE.splitlines()[row - 1].index("txt") + 1
    assert line.startswith(f"{path}:{row}:{column}: data.features.1.type: ")
    assert "'txt'" in line and "(did you mean 'text'?)" in line
    assert "'numeric', 'categorical', 'text', 'sequence' or 'image'" in line


def test_an_unknown_feature_type_is_worded_for_people(write_spec):
    _, (line,) = validated(write_spec, UNKNOWN_TYPE)
    message = line.split("data.features.1.type: ", 1)[1]
    assert not re.match(r"unknown \d", message), message
    assert re.match(r"unknown (feature )?type 'txt'", message), message


def test_a_feature_without_a_type_gets_one_error(write_spec):
    text = UNKNOWN_TYPE.replace("{name: review, type: txt}", "{name: city}")
    path, lines = validated(write_spec, text)
    row = line_of(text, "{name: city}")
    assert [line for line in lines if line.startswith(f"{path}:{row}:")] == [
        next(line for line in lines if "required key 'type' is missing" in line)]


def test_a_feature_without_a_type_says_type_is_missing(write_spec):
    text = UNKNOWN_TYPE.replace("{name: review, type: txt}", "{name: city}")
    path, lines = validated(write_spec, text)
    row = line_of(text, "{name: city}")
    assert any(line.startswith(f"{path}:{row}:7: data.features.1: required key 'type' is "
                               "missing") for line in lines), lines


def test_an_image_needs_its_size(write_spec):
    text = UNKNOWN_TYPE.replace("type: txt", "type: image")
    path, lines = validated(write_spec, text)
    row = line_of(text, "type: image")
    assert lines and all(line.startswith(f"{path}:{row}:7: data.features.1.") for line in lines)
    assert any("data.features.1.height: required key 'height' is missing" in x for x in lines)
    assert any("data.features.1.width: required key 'width' is missing" in x for x in lines)


def test_the_target_listed_as_a_typed_feature(write_spec):
    text = """\
name: target-feature
data:
  source: {kind: parquet, path: rows.parquet}
  task: multiclass
  target: label
  features:
    - {name: city, type: categorical}
    - {name: label, type: categorical}
model:
  layers:
    - linear: {out: 3}
"""
    path, lines = validated(write_spec, text)
    message = ": the target 'label' is also a feature"
    entry = line_of(text, "name: label")
    # the features list, or (better) its entry 1
    assert any(line in (f"{path}:6:3: data.features{message}",
                        f"{path}:7:5: data.features{message}",
                        f"{path}:{entry}:7: data.features.1{message}") for line in lines), lines


def test_every_typed_fixture_fails_in_a_real_process():
    fixtures = sorted(str(p) for p in (ROOT / "tests" / "assets" / "invalid").glob("typed_*.yaml"))
    assert len(fixtures) >= 12
    result = run_cli("validate", *fixtures)
    assert result.returncode == 1
    assert "Traceback" not in result.stdout + result.stderr
    assert f"{len(fixtures)} files checked: {len(fixtures)} invalid" in result.stdout


# --- shape rules of the new layers ------------------------------------------------------------

def layers(*entries):
    return [LayerSpec.model_validate(e if isinstance(e, dict) else {e: {}}) for e in entries]


def shape_error(entries, shape) -> ShapeError:
    with pytest.raises(ShapeError) as info:
        infer_shapes(layers(*entries), shape)
    return info.value


def test_embedding_turns_ids_into_vectors_and_refuses_a_matrix():
    assert infer_shapes(layers({"embedding": {"dim": 8}}), (12,)) == [(12, 8)]
    error = shape_error([{"embedding": {"dim": 8}}], (12, 3))
    assert error.index == 0
    assert error.message == "embedding expects a vector of indices (length,) per sample, got " \
                            "(12, 3)"


@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("bidirectional, width", [(False, 6), (True, 12)])
def test_recurrent_width_is_hidden_per_direction(kind, bidirectional, width):
    net = layers({"embedding": {"dim": 4}},
                 {kind: {"hidden": 6, "layers": 2, "bidirectional": bidirectional}},
                 {"global_pool": {"op": "last"}})
    assert infer_shapes(net, (10,)) == [(10, 4), (10, width), (width,)]


@pytest.mark.parametrize("kind", ["lstm", "gru", "transformer_encoder", "multihead_attention"])
def test_sequence_layers_refuse_flat_input_and_say_to_embed_first(kind):
    args = {"hidden": 4} if kind in ("lstm", "gru") else {"heads": 1}
    error = shape_error([{kind: args}], (10,))
    assert error.message.startswith(f"{kind} expects a sequence (length, width) per sample, "
                                    "got (10,); embed indices first")


@pytest.mark.parametrize("kind", ["transformer_encoder", "multihead_attention"])
def test_attention_keeps_the_shape_and_needs_heads_that_divide_the_width(kind):
    assert infer_shapes(layers({kind: {"heads": 3}}), (5, 12)) == [(5, 12)]
    error = shape_error([{kind: {"heads": 5}}], (5, 12))
    assert error.message == (f"{kind}: 5 heads do not divide the width 12; use a head count "
                             "that divides it (1, 2, 3, 4, 6, 12)")


def test_layer_norm_keeps_the_shape():
    assert infer_shapes(layers("layer_norm", "layernorm"), (5, 12)) == [(5, 12), (5, 12)]


@pytest.mark.parametrize("op", ["mean", "max", "sum", "first", "last"])
def test_global_pool_of_a_sequence_is_one_vector(op):
    assert infer_shapes(layers({"global_pool": {"op": op}}), (7, 9)) == [(9,)]


@pytest.mark.parametrize("op", ["mean", "max", "sum"])
def test_global_pool_of_an_image_keeps_the_channels(op):
    assert infer_shapes(layers({"global_pool": {"op": op}}), (16, 4, 4)) == [(16,)]


@pytest.mark.parametrize("op", ["first", "last"])
def test_global_pool_first_or_last_of_an_image_is_refused(op):
    error = shape_error([{"global_pool": {"op": op}}], (16, 4, 4))
    assert error.message == (f"global_pool {op} takes a sequence (length, width); pool an "
                             "image with mean, max or sum")


def test_global_pool_of_a_vector_is_refused():
    error = shape_error([{"linear": {"out": 4}}, "global_pool"], (10,))
    assert error.index == 1
    assert error.message == ("global_pool expects a sequence (length, width) or an image "
                             "(channels, h, w) per sample, got (4,)")


def test_resnet_takes_an_image_and_gives_512_values():
    assert infer_shapes(layers({"resnet": {"depth": 34}}), (3, 32, 32)) == [(512,)]
    assert infer_shapes(layers("resnet"), (1, 8, 8)) == [(512,)]


@pytest.mark.parametrize("shape", [(64,), (3, 32)])
def test_resnet_refuses_anything_but_an_image(shape):
    error = shape_error(["resnet"], shape)
    assert error.message.startswith("resnet expects an image (channels, height, width) per "
                                    f"sample, got {shape}")


@pytest.mark.parametrize("layer", [{"conv2d": {"out": 4, "kernel": 1}}, "resnet"])
def test_a_suggested_reshape_fits_the_input(layer):
    error = shape_error([layer], (8,))
    suggested = re.search(r"reshape: \{shape: \[([\d, ]+)\]\}", error.message)
    assert suggested is None or math.prod(map(int, suggested.group(1).split(", "))) == 8, \
        error.message


def test_a_typed_network_validates_to_the_widths_torch_builds():
    """What validate computes (each encoder's width, the head's input) is what runs."""
    torch = pytest.importorskip("torch")
    from dbspec.models.network import build_network
    from dbspec.spec.layout import encoded_inputs, encoder_width, head_input, is_encoded
    from dbspec.spec.sections import Spec
    import yaml

    spec = Spec.model_validate(yaml.safe_load(PLAN))
    features, model = spec.data.features, spec.model
    inputs = []  # what preprocess would fit: each feature's matrix columns, 30 ids a vocabulary
    for feature in features:
        if not is_encoded(feature):
            name = feature if isinstance(feature, str) else feature.name
            inputs.append({"name": name, "type": "numeric", "columns": [name],
                           "spec": {"name": name, "type": "numeric"}})
            continue
        (encoded,) = encoded_inputs([feature], model)
        inputs.append({"name": feature.name, "type": feature.type,
                       "spec": feature.model_dump(mode="json"),
                       "columns": [f"{feature.name}[{i}]" for i in range(encoded.width)],
                       **({"indices": 30} if encoded.tokens else {})})
    width = sum(len(e["columns"]) for e in inputs)
    network = build_network(model, width, 1, inputs)
    network.eval()
    x = torch.zeros(4, width)
    start = 0
    for entry in inputs:  # ids in range, pixels anything
        stop = start + len(entry["columns"])
        if "indices" in entry:
            x[:, start:stop] = torch.randint(1, 30, (4, stop - start)).float()
        start = stop
    with torch.no_grad():
        encoded = network.encoded(x)
        out = network(x)
    expected = {e.name: encoder_width(e) for e in encoded_inputs(features, model)}
    assert {name: tuple(v.shape) for name, v in encoded.items()} == {
        name: (4, w) for name, w in expected.items()}
    assert expected == {"city": 16, "review": 12, "items": 15, "photo": 12}
    numeric = sum(1 for f in features if not is_encoded(f))
    assert head_input(features, model, numeric) == 2 + 16 + 12 + 15 + 12
    assert tuple(out.shape) == (4, 1)


ONE_OF_EACH_TYPE = {
    "categorical": {"name": "f", "type": "categorical"},
    "text": {"name": "f", "type": "text"},
    "sequence": {"name": "f", "type": "sequence", "values": "tokens"},
    "image": {"name": "f", "type": "image", "height": 32, "width": 32},
}


def _every_encoder_kind():
    from dbspec.spec.sections.network import ENCODERS_FOR

    return [(t, k) for t, kinds in ENCODERS_FOR.items() for k in kinds if k != "layers"]


@pytest.mark.parametrize("feature_type, kind", _every_encoder_kind())
def test_every_encoder_kind_compiles_to_layers_that_end_in_a_vector(feature_type, kind):
    """Layout asks the encoder for its layers; every kind a type takes answers with a list
    that validates on that type's input."""
    from pydantic import TypeAdapter

    from dbspec.spec.layout import encoded_inputs, encoder_width
    from dbspec.spec.sections.features import TypedFeature
    from dbspec.spec.sections.network import ModelSpec

    feature = TypeAdapter(TypedFeature).validate_python(ONE_OF_EACH_TYPE[feature_type])
    model = ModelSpec.model_validate({"encoders": {"f": {"kind": kind}},
                                      "layers": [{"linear": {"out": 1}}]})
    (encoded,) = encoded_inputs([feature], model)
    assert encoded.encoder.fits(feature_type) and not encoded.encoder.own_layers
    assert encoder_width(encoded) >= 1
    assert encoded.encoder.summary().startswith(kind)


@pytest.mark.parametrize("feature_type", sorted(ONE_OF_EACH_TYPE))
def test_a_left_out_encoder_is_the_first_kind_its_type_takes(feature_type):
    from dbspec.spec.sections.network import ENCODERS_FOR, default_encoder

    assert default_encoder(feature_type).kind == ENCODERS_FOR[feature_type][0]


# --- dbspec plan ------------------------------------------------------------------------------

PLAN = """\
name: typed-plan
data:
  source: {kind: parquet, path: rows.parquet}
  task: binary
  target: label
  features:
    - x
    - {name: y, type: numeric}
    - {name: city, type: categorical, min_frequency: 2}
    - {name: review, type: text, tokenizer: char, max_length: 20}
    - {name: items, type: sequence, values: tokens, max_length: 5}
    - {name: photo, type: image, height: 16, width: 16, channels: 1, augment: {flip: true}}
model:
  encoders:
    review: {kind: gru, dim: 8, hidden: 6, bidirectional: true}
    photo: {kind: cnn, channels: [4, 12]}
    items: {kind: layers, layers: [{embedding: {dim: 3}}, flatten]}
  layers:
    - linear: {out: 1}
"""


def inputs_table(stdout: str) -> tuple[str, dict[str, list[str]]]:
    """The plan's inputs summary line and its table rows by feature (cells split on runs of
    two or more spaces)."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("inputs: "))
    header = re.split(r"\s{2,}", lines[start + 1].strip())
    assert header == ["feature", "type and encoding", "encoder", "output width"]
    rows = {}
    for line in lines[start + 2:]:
        if not line.startswith("  "):
            break
        cells = re.split(r"\s{2,}", line.strip())
        rows[cells[0]] = cells[1:]
    return lines[start], rows


def test_plan_lists_each_input_with_its_encoder_and_width(write_spec):
    result = run_in_process("plan", write_spec(PLAN))
    assert result.returncode == 0, result.stderr
    summary, rows = inputs_table(result.stdout)
    assert summary == "inputs: 6 features, combined by concat; the head (model.layers) takes 57"
    assert list(rows) == ["x", "y", "city", "review", "items", "photo"]
    assert rows["x"] == ["numeric (a plain name: its column must hold numbers)", "-",
                         "1, to the combiner as is"]
    assert rows["y"] == ["numeric", "-", "1, to the combiner as is"]
    assert rows["city"] == ["categorical (vocabulary from the training split, min_frequency 2)",
                            "embedding (dim 16) (default)", "16"]
    assert rows["review"] == ["text (char tokenizer, 20 tokens)", "gru (dim 8)", "12"]
    assert rows["items"] == ["sequence of tokens (5 items)", "layers (2)", "15"]
    assert rows["photo"][0] == "image 1x16x16 (bytes, unit, augmented in training)"
    assert rows["photo"][1].startswith("cnn [4, 12]") and rows["photo"][2] == "12"


def test_plan_with_the_attention_combiner_gives_its_width(write_spec):
    text = PLAN.replace("  layers:\n    - linear: {out: 1}",
                        "  combiner: {kind: attention, width: 8, heads: 2}\n"
                        "  layers:\n    - linear: {out: 1}")
    result = run_in_process("plan", write_spec(text))
    assert result.returncode == 0, result.stderr
    summary, rows = inputs_table(result.stdout)
    # one token for the numeric features together, one per encoded feature, 8 wide each
    assert summary == ("inputs: 6 features, combined by attention (width 8, 2 heads); the "
                       "head (model.layers) takes 40")
    assert rows["review"][2] == "12"


def test_plan_of_an_all_numeric_spec_has_no_inputs_table():
    result = run_in_process("plan", "specs/diabetes.yaml")
    assert result.returncode == 0 and "inputs: " not in result.stdout


#: What a light command must not import (as tests/cli/test_cli.py checks for the example
#: specs), and the packages typed features need only when data is encoded.
HEAVY = ("torch", "mlflow", "pyspark", "optuna", "deepspeed", "sklearn", "pandas", "PIL",
         "tokenizers", "pyarrow")
PROBE = """
import sys, contextlib, io
from dbspec.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    code = main(sys.argv[1:])
print(code, *[m for m in {heavy!r} if m in sys.modules])
"""


@pytest.mark.parametrize("command", ["validate", "plan", "schema"])
def test_light_commands_on_a_typed_spec_import_no_heavy_library(command, tmp_path):
    for name in ("torch", "mlflow"):
        pytest.importorskip(name)  # the check only means something where they are installed
    spec = tmp_path / "typed.yaml"
    spec.write_text(PLAN)
    args = [command] + ([str(spec)] if command != "schema" else [])
    result = subprocess.run([sys.executable, "-c", PROBE.format(heavy=HEAVY), *args], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    code, *heavy = result.stdout.split()
    assert code == "0", result.stderr
    assert heavy == [], f"{command} imported {heavy}"


# --- data-time errors -------------------------------------------------------------------------

ROWS = 60


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    """A project dir with a Parquet file holding a column of each kind a typed feature reads.

    One per module: each run's MLflow store (a new SQLite file takes seconds to migrate) is
    shared by the runs here, which all fail before training."""
    import pandas as pd

    project = tmp_path_factory.mktemp("typed-data")
    frame = pd.DataFrame({
        "review": [f"word{i % 5} other{i % 3}" for i in range(ROWS)],
        "city": [("paris", "rome", "oslo")[i % 3] for i in range(ROWS)],
        "blob": [bytes([i % 7, 1, 2]) for i in range(ROWS)],
        "readings": [[float(i), float(i + 1)] for i in range(ROWS)],
        "amount": [float(i) for i in range(ROWS)],
        "x": [float(i % 7) for i in range(ROWS)],
        "label": [i % 2 for i in range(ROWS)],
    })
    frame.to_parquet(project / "rows.parquet")
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("MLFLOW_TRACKING_URI", raising=False)  # the project's own store
        yield project


def data_spec(features: str, extra: str = "") -> str:
    return ("name: typed-data\ndata:\n  source: {kind: parquet, path: rows.parquet}\n"
            "  task: binary\n  target: label\n" + (f"  features:\n{features}" if features
                                                   else "") + extra +
            "model:\n  layers:\n    - linear: {out: 1}\ntraining: {epochs: 1}\n")


def run_fails(project, text: str, stage: str) -> str:
    """``dbspec run --smoke`` of ``text``: it must fail in ``stage`` without a traceback; the
    error message after the stage."""
    name = f"spec-{len(list(project.glob('spec-*.yaml')))}.yaml"
    (project / name).write_text(text)
    result = run_in_process("run", name, "--smoke", "-q", cwd=project)
    printed = result.stdout + result.stderr
    assert result.returncode == 1, printed
    assert "Traceback" not in printed
    found = re.search(rf"error: stage '{stage}' failed: (.*)", result.stderr)
    assert found, printed
    return found.group(1)


@pytest.mark.parametrize("features, message", [
    ("    - {name: review, type: text}\n    - city\n",
     "data.features: column 'city' holds strings: declare its type, '- {name: city, type: "
     "text}' or '- {name: city, type: categorical}'"),
    ("    - {name: review, type: text}\n    - blob\n",
     "data.features: column 'blob' holds bytes: declare it an image with the size to resize "
     "to, '- {name: blob, type: image, height: 64, width: 64}'"),
    ("    - {name: review, type: text}\n    - readings\n",
     "data.features: column 'readings' holds lists: declare a sequence, '- {name: readings, "
     "type: sequence, values: numeric}'"),
    ("    - {name: reviews, type: text}\n",
     "data.features: no column 'reviews' (did you mean 'review'?); the data has: review, "
     "city, blob, readings, amount, x, label"),
    ("    - {name: review, type: text}\n    - amont\n",
     "data.features: no column 'amont' (did you mean 'amount'?)"),
], ids=["strings", "bytes", "lists", "missing-typed", "missing-plain"])
def test_undeclared_or_missing_columns_fail_loading_with_what_to_write(rows, features,
                                                                       message):
    assert run_fails(rows, data_spec(features), "load_data").startswith(message)


def test_strings_without_any_declared_feature_say_to_declare_a_type(rows):
    error = run_fails(rows, data_spec("    - x\n    - city\n"), "load_data")
    assert error.startswith("data.features: non-numeric columns city ")
    assert "declare their type in data.features (e.g. '- {name: city, type: categorical}', " \
           "or text, sequence, image)" in error


@pytest.mark.parametrize("step", ["{standard_scale: [review]}", "{impute: {columns: [x, review]}}"])
def test_a_preprocessing_step_naming_a_text_feature_is_refused(rows, step):
    text = data_spec("    - {name: review, type: text}\n    - x\n",
                     f"  preprocessing: [{step}]\n")
    (rows / "steps.yaml").write_text(text)
    result = run_in_process("validate", "steps.yaml", cwd=rows)
    assert result.returncode == 1 and "Traceback" not in result.stdout + result.stderr
    key = step[1:].split(":")[0]
    position = 0 if key == "standard_scale" else 1
    assert re.search(rf"steps\.yaml:\d+:\d+: data\.preprocessing\.0\.{key}\.columns\."
                     rf"{position}: 'review' is a text feature; preprocessing steps apply to "
                     r"numeric features \(typed features are encoded by their type\)",
                     result.stdout), result.stdout


def test_preprocessing_without_a_numeric_feature_is_refused(rows):
    text = data_spec("    - {name: review, type: text}\n", "  preprocessing: [standard_scale]\n")
    assert run_fails(rows, text, "preprocess") == \
        "data.preprocessing: there is no numeric feature to preprocess"


def test_a_text_feature_holding_numbers_names_the_feature_and_the_value(rows):
    error = run_fails(rows, data_spec("    - {name: amount, type: text}\n"), "preprocess")
    assert re.fullmatch(r"data\.features\.amount: column 'amount', row \d+: expected text \(a "
                        r"string\), got float \d+\.0 \(in the training rows\)", error), error


def test_a_data_error_in_a_real_process_has_no_traceback(rows):
    (rows / "real.yaml").write_text(data_spec("    - {name: review, type: text}\n    - city\n"))
    result = run_cli("run", "real.yaml", "--smoke", "-q", cwd=rows)
    assert result.returncode == 1
    assert "Traceback" not in result.stdout + result.stderr
    assert "column 'city' holds strings" in result.stderr


# resolve_features directly: how a plain name is typed by its column

def resolve(frame, features=None):
    from dbspec.models.feature_types import resolve_features
    from dbspec.spec.sections.data import DataSpec

    data = DataSpec.model_validate({"source": {"kind": "parquet", "path": "x.parquet"},
                                    "task": "binary", "target": "label",
                                    **({"features": features} if features else {})})
    return resolve_features(data, frame)


def test_plain_names_are_typed_by_their_column():
    import pandas as pd

    frame = pd.DataFrame({"n": [1, 2, None], "flag": [True, False, True],
                          "kind": pd.Categorical(["a", "b", "a"]), "label": [0, 1, 0]})
    typed = resolve(frame)
    assert [(f.name, f.type) for f in typed] == [("n", "numeric"), ("flag", "numeric"),
                                                 ("kind", "categorical")]
    declared = resolve(frame, [{"name": "kind", "type": "text"}, "n"])
    assert [(f.name, f.type) for f in declared] == [("kind", "text"), ("n", "numeric")]


@pytest.mark.parametrize("values, message", [
    (["a", "b", None], "holds strings: declare its type, '- {name: c, type: text}' or "
                       "'- {name: c, type: categorical}'"),
    ([b"\x89PNG", b"\x00", None], "holds bytes: declare it an image"),
    ([["a", "b"], ["c"], None], "holds lists: declare a sequence, '- {name: c, type: "
                                "sequence, values: tokens}'"),
    ([[1.0, 2.0], [3.0], None], "values: numeric}'"),
    ([None, None, None], "has no values to tell its type by: declare it"),
])
def test_a_column_of_open_type_must_be_declared(values, message):
    import pandas as pd

    from dbspec.data.sources import DataError

    frame = pd.DataFrame({"c": pd.Series(values, dtype=object), "label": [0, 1, 0]})
    with pytest.raises(DataError) as info:
        resolve(frame)
    assert str(info.value).startswith("data.features: column 'c' ")
    assert message in str(info.value)


def test_an_undecodable_image_outside_the_training_rows_names_its_source_row(rows):
    # images have no fitted state: every row is decoded when preprocess encodes the table, and
    # a corrupt one is named by its row in the source, whichever split it fell in
    import io

    import pandas as pd
    from PIL import Image

    def png(shade: int) -> bytes:
        buffer = io.BytesIO()
        Image.new("L", (4, 4), shade).save(buffer, "PNG")
        return buffer.getvalue()

    photos = [png(i * 4) for i in range(ROWS)]
    photos[37] = b"\x89PNG but not really"
    pd.DataFrame({"photo": photos, "label": [i % 2 for i in range(ROWS)]}).to_parquet(
        rows / "photos.parquet")
    text = data_spec("    - {name: photo, type: image, height: 4, width: 4, channels: 1}\n")
    error = run_fails(rows, text.replace("rows.parquet", "photos.parquet"), "preprocess")
    assert error.startswith("data.features: column 'photo', row 37: not a decodable image"), \
        error


def test_feature_columns_arrow_cannot_store_are_a_data_error(tmp_path):
    import pandas as pd

    from dbspec.data.sources import DataError
    from dbspec.data.store import write_raw_features

    with pytest.raises(DataError, match=r"^data\.features: the feature columns cannot be "
                                        r"stored: .*column text"):
        write_raw_features(tmp_path, pd.DataFrame({"text": ["a", 5, b"x"]}))
    assert not (tmp_path / "raw.parquet").exists()
