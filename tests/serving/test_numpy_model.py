"""The torch-free served model of ``dbspec serve`` against the torch module it stands in for."""

from __future__ import annotations

import io
import pickle
import subprocess
import sys
import zipfile

import numpy as np
import pytest
import torch

from dbspec.models.served import ModelCard, ServedModel, save_served_model
from dbspec.serving.numpy_model import (LAYERS, Unsupported, load_numpy_model,
                                        read_state_dict)

FEATURES = ["a", "b", "c", "d"]
PREPROCESSING = [
    {"kind": "impute", "columns": [0, 2], "params": {"fill": [0.5, -1.0]}},
    {"kind": "clip", "columns": [0, 1, 2, 3], "params": {"low": [-3.0] * 4, "high": [3.0] * 4}},
    {"kind": "scale", "columns": [1, 3], "params": {"center": [0.2, -0.4], "scale": [1.5, 0.7]}},
]


def served(tmp_path, layers, *, task="regression", loss="mse", out=1, classes=None,
           preprocessing=PREPROCESSING, seed=0):
    """A ServedModel with random weights, saved; (torch module, its directory)."""
    torch.manual_seed(seed)
    card = ModelCard(task=task, loss=loss, feature_names=FEATURES, out_features=out,
                     model={"layers": layers}, preprocessing=preprocessing, classes=classes,
                     target_mean=151.3, target_std=77.1)
    model = ServedModel(card).eval()
    return model, save_served_model(model, tmp_path / "served")


def rows(count=500, seed=1):
    x = np.random.default_rng(seed).normal(scale=2.0, size=(count, len(FEATURES)))
    x = x.astype(np.float32)
    x[::7, 0] = np.nan  # imputed
    x[::11, 2] = np.nan
    return x


def assert_same(model, directory, x):
    ours = load_numpy_model(directory)
    assert ours is not None
    with torch.inference_mode():
        theirs = model(torch.from_numpy(x)).numpy()
    got = ours(x)
    assert got.dtype == theirs.dtype == np.float32 and got.shape == theirs.shape
    # float32 rounding: numpy and torch sum a matrix product in their own order (torch
    # differs as much from itself between batch sizes)
    np.testing.assert_allclose(got, theirs, rtol=1e-5, atol=1e-5 * float(np.abs(theirs).max()))
    return got, theirs


@pytest.mark.parametrize("activation", ["relu", "tanh", "sigmoid", "identity",
                                        {"leaky_relu": {"negative_slope": 0.2}}])
def test_every_layer_scores_as_torch_does(tmp_path, activation):
    layers = [{"linear": {"out": 16}}, activation, {"dropout": {"p": 0.5}}, "flatten",
              {"linear": {"out": 8, "bias": False}}, activation, {"linear": {"out": 1}}]
    model, directory = served(tmp_path, layers)
    assert_same(model, directory, rows())


def test_the_weights_are_read_bit_for_bit(tmp_path):
    model, directory = served(tmp_path, [{"linear": {"out": 3}}, "relu", {"linear": {"out": 1}}])
    state = read_state_dict(directory / "weights.pt")
    expected = model.state_dict()
    assert set(state) == set(expected)
    for key, tensor in expected.items():
        assert state[key].dtype == tensor.numpy().dtype and state[key].shape == tensor.shape
        assert np.array_equal(state[key], tensor.numpy()), key


def test_elementwise_models_give_the_same_bits(tmp_path):
    """Preprocessing, ReLU and the regression head are IEEE float32 operations in both."""
    # a network without a matrix product: its output width is the input's
    model, directory = served(tmp_path, ["relu"], out=4)
    got, theirs = assert_same(model, directory, rows())
    assert np.array_equal(got, theirs)


@pytest.mark.parametrize("task,loss,out,classes", [
    ("binary", "bce", 1, ["no", "yes"]),
    ("binary", "ce", 2, [0, 1]),
    ("multiclass", "ce", 3, ["a", "b", "c"]),
    ("multiclass", "nll", 3, ["a", "b", "c"]),
])
def test_every_head_scores_as_torch_does(tmp_path, task, loss, out, classes):
    layers = [{"linear": {"out": 8}}, "tanh", {"linear": {"out": out}}]
    model, directory = served(tmp_path, layers, task=task, loss=loss, out=out, classes=classes)
    assert_same(model, directory, rows())


def test_overflowing_rows_are_infinite_or_saturated_as_in_torch(tmp_path):
    model, directory = served(tmp_path, [{"linear": {"out": 4}}, "sigmoid",
                                         {"linear": {"out": 1}}], task="binary", loss="bce",
                              classes=[0, 1], preprocessing=[])
    x = np.full((3, len(FEATURES)), 3e38, dtype=np.float32)
    x[1] *= -1
    with torch.inference_mode():
        theirs = model(torch.from_numpy(x)).numpy()
    np.testing.assert_array_equal(load_numpy_model(directory)(x), theirs)


@pytest.mark.parametrize("layers", [
    [{"linear": {"out": 4}}, "batchnorm1d", {"linear": {"out": 1}}],
    [{"linear": {"out": 4}}, "gelu", {"linear": {"out": 1}}],
    [{"linear": {"out": 1}}, {"log_softmax": {"dim": 1}}],
    [{"reshape": {"shape": [1, 4]}}, {"conv1d": {"out": 2, "kernel": 2}}, "flatten",
     {"linear": {"out": 1}}],
])
def test_other_layers_stay_with_torch(tmp_path, layers):
    _, directory = served(tmp_path, layers)
    assert load_numpy_model(directory) is None
    assert not {next(iter(e)) if isinstance(e, dict) else e for e in layers} <= set(LAYERS)


def test_a_custom_network_stays_with_torch(tmp_path):
    torch.manual_seed(0)
    card = ModelCard(task="regression", loss="mse", feature_names=FEATURES, out_features=1,
                     model={"custom": {"class": "torch.nn:Linear", "kwargs": {}}},
                     preprocessing=[])
    directory = save_served_model(ServedModel(card).eval(), tmp_path / "served")
    assert load_numpy_model(directory) is None


def _rewrite_pickle(path, payload: bytes) -> None:
    with zipfile.ZipFile(path) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    pickled = next(name for name in members if name.endswith("/data.pkl"))
    members[pickled] = payload
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)


def test_a_weights_file_it_does_not_follow_stays_with_torch(tmp_path):
    _, directory = served(tmp_path, [{"linear": {"out": 1}}])
    weights = directory / "weights.pt"
    # a pickle that would run code when loaded is refused, not run
    _rewrite_pickle(weights, pickle.dumps(subprocess.Popen, protocol=2))
    with pytest.raises(Unsupported, match="Popen is not part of a state dict"):
        read_state_dict(weights)
    assert load_numpy_model(directory) is None
    weights.write_bytes(b"not a zip")
    assert load_numpy_model(directory) is None
    buffer = io.BytesIO()
    torch.save({"network.0.weight": torch.zeros(1, 4)}, buffer,
               _use_new_zipfile_serialization=False)
    weights.write_bytes(buffer.getvalue())  # torch's legacy format
    assert load_numpy_model(directory) is None


def test_weights_missing_a_layer_stay_with_torch(tmp_path):
    model, directory = served(tmp_path, [{"linear": {"out": 2}}, "relu", {"linear": {"out": 1}}])
    state = {k: v for k, v in model.state_dict().items() if k != "network.2.weight"}
    torch.save(state, directory / "weights.pt")
    assert load_numpy_model(directory) is None


def test_weights_of_another_shape_stay_with_torch(tmp_path):
    # found at load: numpy scoring them would fail on every request
    model, directory = served(tmp_path, [{"linear": {"out": 2}}, "relu", {"linear": {"out": 1}}])
    state = dict(model.state_dict())
    state["network.2.weight"] = torch.zeros(1, 5)  # the layer before gives 2 columns, not 5
    torch.save(state, directory / "weights.pt")
    assert load_numpy_model(directory) is None


def test_weights_without_the_target_scale_stay_with_torch(tmp_path):
    model, directory = served(tmp_path, [{"linear": {"out": 1}}])
    state = {k: v for k, v in model.state_dict().items() if k != "target_mean"}
    torch.save(state, directory / "weights.pt")
    assert load_numpy_model(directory) is None


def test_loading_imports_no_torch(tmp_path):
    model, directory = served(tmp_path, [{"linear": {"out": 3}}, "relu", {"linear": {"out": 1}}])
    x = rows(5)
    with torch.inference_mode():
        expected = model(torch.from_numpy(x)).numpy()
    np.save(tmp_path / "x.npy", x)
    code = ("import sys, numpy as np\n"
            "from dbspec.serving.numpy_model import load_numpy_model\n"
            f"model = load_numpy_model({str(directory)!r})\n"
            f"print(model(np.load({str(tmp_path / 'x.npy')!r})).tolist())\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    np.testing.assert_allclose(eval(result.stdout), expected, rtol=1e-5)
