"""``dbspec serve``'s torch-free model: the served model exported to ONNX when it is logged
(:mod:`dbspec.models.onnx_export`) and scored by a real ONNX Runtime session
(:mod:`dbspec.serving.onnx_model`), against the torch module, for every network kind."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from dbspec.models.card import ONNX_FILE
from dbspec.models.served import ModelCard, ServedModel, save_served_model
from dbspec.registry.errors import RegistryError
from dbspec.serving.onnx_model import load_onnx_model
from tests.conftest import checkout_env
from tests.helpers.threads import one_thread  # noqa: F401  (a fixture)

PREPROCESSING = [
    {"kind": "impute", "columns": [0, 2], "params": {"fill": [0.5, -1.0]}},
    {"kind": "clip", "columns": [0, 1, 2, 3], "params": {"low": [-3.0] * 4, "high": [3.0] * 4}},
    {"kind": "scale", "columns": [1, 3], "params": {"center": [0.2, -0.4], "scale": [1.5, 0.7]}},
]
MLP = [{"linear": {"out": 16}}, "relu", {"dropout": {"p": 0.5}}, "flatten",
       {"linear": {"out": 12, "bias": False}}, "tanh", {"linear": {"out": 8}}, "sigmoid",
       {"linear": {"out": 8}}, {"leaky_relu": {"negative_slope": 0.2}}, "identity",
       "batchnorm1d", "gelu", "elu", "layernorm", "selu", "silu", "mish", "softplus"]


pytestmark = pytest.mark.usefixtures("one_thread")


def card(layers, width=4, *, preprocessing=(), inputs=None, task="regression", loss="mse",
         out=1, classes=None, **model):
    return ModelCard(task=task, loss=loss, feature_names=[f"f{i}" for i in range(width)],
                     out_features=out, model={"layers": layers, **model},
                     preprocessing=list(preprocessing), classes=classes, target_mean=151.3,
                     target_std=77.1, inputs=inputs)


def saved(tmp_path, model_card, seed=0):
    """The torch served model (random weights) and its directory, saved as the train stage
    logs it."""
    torch.manual_seed(seed)
    model = ServedModel(model_card).eval()
    return model, save_served_model(model, tmp_path / "served", onnx=True)


def assert_scores_as_torch(model, directory, rows):
    """ONNX Runtime's predictions are torch's, batch by batch (one row alone too)."""
    ours = load_onnx_model(directory)
    assert ours is not None, "the network was not exported"
    assert ours.runtime.startswith("onnxruntime ")
    for x in (rows, rows[:1], rows[:7]):
        with torch.inference_mode():
            theirs = model(torch.from_numpy(x)).numpy()
        got = ours(x)
        assert got.dtype == theirs.dtype == np.float32 and got.shape == theirs.shape
        # float32 rounding: the runtimes sum a matrix product in their own order
        np.testing.assert_allclose(got, theirs, rtol=1e-5,
                                   atol=1e-5 * max(1.0, float(np.abs(theirs).max())))


def numeric_rows(width=4, count=64, seed=1, *, missing=False):
    x = np.random.default_rng(seed).normal(scale=2.0, size=(count, width)).astype(np.float32)
    if missing:  # values the preprocessing imputes
        x[::7, 0] = np.nan
        x[::11, 2] = np.nan
    return x


@pytest.mark.parametrize("task,loss,out,classes", [
    ("regression", "mse", 1, None),
    ("binary", "bce", 1, [0, 1]),
    ("binary", "cross_entropy", 2, ["no", "yes"]),
    ("multiclass", "cross_entropy", 3, [0, 1, 2]),
    ("multiclass", "nll", 3, [0, 1, 2]),
])
def test_dense_layers_preprocessing_and_every_head(tmp_path, task, loss, out, classes):
    layers = MLP + [{"linear": {"out": out}}] + (["log_softmax"] if loss == "nll" else [])
    model, directory = saved(tmp_path, card(layers, preprocessing=PREPROCESSING, task=task,
                                            loss=loss, out=out, classes=classes))
    assert_scores_as_torch(model, directory, numeric_rows(missing=True))


@pytest.mark.parametrize("layers", [
    [{"reshape": {"shape": [1, 8, 8]}}, {"conv2d": {"out": 4, "kernel": 3}}, "batchnorm2d",
     "relu", {"maxpool2d": {"kernel": 2}}, {"avgpool2d": {"kernel": 1}},
     {"adaptive_avgpool2d": {"out": 2}}, "flatten", {"linear": {"out": 1}}],
    [{"reshape": {"shape": [2, 32]}}, {"conv1d": {"out": 4, "kernel": 3}}, "relu",
     {"maxpool1d": {"kernel": 2}}, {"avgpool1d": {"kernel": 2}},
     {"adaptive_avgpool1d": {"out": 3}}, "flatten", {"linear": {"out": 1}}],
], ids=["2d", "1d"])
def test_convolutions_pools_and_batch_norm(tmp_path, layers):
    model, directory = saved(tmp_path, card(layers, 64))
    assert_scores_as_torch(model, directory, numeric_rows(64))


def test_sequence_layers(tmp_path):
    layers = [{"reshape": {"shape": [4, 4]}},
              {"transformer_encoder": {"heads": 2, "feedforward": 8}},
              {"multihead_attention": {"heads": 4}}, "layer_norm",
              {"gru": {"hidden": 3, "bidirectional": True}}, {"global_pool": {"op": "max"}},
              {"linear": {"out": 1}}]
    model, directory = saved(tmp_path, card(layers, 16))
    assert_scores_as_torch(model, directory, numeric_rows(16))


def fitted(name, type_, n_columns, indices=None, **spec):
    entry = {"name": name, "type": type_, "spec": {"name": name, "type": type_, **spec},
             "columns": [f"{name}.{i}" for i in range(n_columns)]}
    if indices is not None:
        entry["indices"] = indices
    return entry


TYPED = [fitted("x", "numeric", 1), fitted("city", "categorical", 1, indices=5),
         fitted("text", "text", 10, indices=30, max_length=10),
         fitted("series", "sequence", 6, max_length=6),
         fitted("photo", "image", 3 * 12 * 12, height=12, width=12)]


def typed_rows(count=64, seed=2):
    """Encoded rows: token rows of every length (none: padding alone), unknown categories
    (index 0), numeric sequences padded with NaN."""
    rng = np.random.default_rng(seed)
    tokens = np.zeros((count, 10))
    series = np.full((count, 6), np.nan)
    for i in range(count):
        tokens[i, :i % 11] = rng.integers(1, 30, i % 11)
        series[i, :i % 7] = rng.normal(size=i % 7)
    return np.concatenate([rng.normal(size=(count, 1)), rng.integers(0, 5, (count, 1)), tokens,
                           series, rng.uniform(size=(count, 432))], axis=1).astype(np.float32)


@pytest.mark.parametrize("encoders,combiner", [
    ({"text": {"kind": "gru", "dim": 8, "hidden": 6, "pool": "max"},
      "series": {"kind": "lstm", "dim": 4, "hidden": 5, "bidirectional": True, "layers": 2}},
     "concat"),
    ({"text": {"kind": "transformer", "dim": 8, "heads": 2, "layers": 2},
      "series": {"kind": "bag", "dim": 4}}, "attention"),
    ({"text": {"kind": "lstm", "dim": 8, "hidden": 6, "pool": "last"},
      "series": {"kind": "gru", "hidden": 5}}, "attention"),
], ids=["recurrent-concat", "transformer-attention", "lstm-last-attention"])
def test_typed_features(tmp_path, encoders, combiner):
    encoders = {**encoders, "city": {"kind": "embedding", "dim": 3},
                "photo": {"kind": "cnn", "channels": [4, 8]}}
    model_card = card([{"linear": {"out": 1}}], 450, inputs=TYPED, encoders=encoders,
                      combiner=combiner)
    model, directory = saved(tmp_path, model_card)
    assert_scores_as_torch(model, directory, typed_rows())


@pytest.mark.slow
def test_resnet_encoder(tmp_path):
    inputs = [fitted("photo", "image", 3 * 16 * 16, height=16, width=16)]
    model_card = card([{"linear": {"out": 1}}], 768, inputs=inputs,
                      encoders={"photo": {"kind": "resnet18"}})
    model, directory = saved(tmp_path, model_card)
    rows = np.random.default_rng(3).uniform(size=(8, 768)).astype(np.float32)
    assert_scores_as_torch(model, directory, rows)


class BranchesOnItsInput(torch.nn.Module):
    """A custom network whose control flow depends on the values: not traceable to a graph."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if bool(x.sum() > 0):
            return x[:, :1] * 2
        return x[:, :1]


def test_a_network_that_does_not_export_is_served_with_torch(tmp_path, caplog):
    torch.manual_seed(0)
    model_card = card([{"linear": {"out": 1}}])
    exported = ServedModel(model_card).eval()
    directory = save_served_model(exported, tmp_path / "served", onnx=True)
    assert (directory / ONNX_FILE).is_file()
    # the same directory saved again with a network that cannot export: no stale graph stays
    model = ServedModel(model_card, network=BranchesOnItsInput()).eval()
    with caplog.at_level("INFO", logger="dbspec.model"):
        save_served_model(model, directory, onnx=True)
    assert not (directory / ONNX_FILE).exists()
    assert "not exported to ONNX" in caplog.text and "served with torch" in caplog.text
    assert load_onnx_model(directory) is None


class NoisyAtInference(torch.nn.Module):
    """Exports (to ONNX's RandomUniformLike), but never scores the same twice."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, :1] + torch.rand_like(x[:, :1])


def test_a_graph_that_disagrees_with_torch_is_not_kept(tmp_path, caplog):
    model = ServedModel(card([{"linear": {"out": 1}}]), network=NoisyAtInference()).eval()
    with caplog.at_level("WARNING", logger="dbspec.model"):
        directory = save_served_model(model, tmp_path / "served", onnx=True)
    assert "the ONNX export differs from the torch module" in caplog.text
    assert not (directory / ONNX_FILE).exists()


def test_saved_without_onnx_unless_logged(tmp_path):
    """Tuning trials and checkpoints are saved without the export (it costs seconds)."""
    directory = save_served_model(ServedModel(card([{"linear": {"out": 1}}])), tmp_path / "s")
    assert not (directory / ONNX_FILE).exists() and load_onnx_model(directory) is None


def test_a_damaged_graph_is_a_registry_error(tmp_path):
    _, directory = saved(tmp_path, card([{"linear": {"out": 1}}]))
    graph = directory / ONNX_FILE
    graph.write_bytes(graph.read_bytes()[:100])
    with pytest.raises(RegistryError, match=r"model.onnx: ONNX Runtime cannot load this model"):
        load_onnx_model(directory)


def run_python(code: str) -> str:
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=checkout_env(), timeout=300)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_scoring_imports_no_torch(tmp_path):
    model, directory = saved(tmp_path, card(MLP + [{"linear": {"out": 1}}]))
    out = run_python(
        "import sys, numpy as np\n"
        "from dbspec.serving.onnx_model import load_onnx_model\n"
        f"model = load_onnx_model({str(directory)!r})\n"
        "model(np.zeros((3, 4), dtype=np.float32))\n"
        "print('torch' in sys.modules, 'onnx' in sys.modules)\n")
    assert out == "False False"


def test_without_the_runtimes_torch_serves(tmp_path):
    """No onnxruntime where the model is served, no exporter where it is logged."""
    _, directory = saved(tmp_path, card([{"linear": {"out": 1}}]))
    assert run_python("import sys\nsys.modules['onnxruntime'] = None  # not installed\n"
                      "from dbspec.serving.onnx_model import load_onnx_model\n"
                      f"print(load_onnx_model({str(directory)!r}))") == "None"
    out = run_python(
        "import sys\nsys.modules['onnxscript'] = None  # not installed\n"
        "from pathlib import Path\n"
        "from dbspec.models.served import ModelCard, ServedModel, save_served_model\n"
        f"card = ModelCard(**{card([{'linear': {'out': 1}}]).__dict__!r})\n"
        f"d = save_served_model(ServedModel(card), Path({str(tmp_path / 'other')!r}), onnx=True)\n"
        "print(sorted(p.name for p in d.iterdir()))")
    assert out == "['model.json', 'weights.pt']"
