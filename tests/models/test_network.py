"""Networks built from specs, and the served model that carries preprocessing."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dbspec.models.network import ModelError, build_network
from dbspec.models.served import (
    ModelCard,
    ServedModel,
    load_served_model,
    save_served_model,
)
from dbspec.spec.sections.network import ModelSpec


def model(*layers, **custom):
    if custom:
        return ModelSpec.model_validate({"custom": custom})
    return ModelSpec.model_validate({"layers": list(layers)})


def test_cnn_sizes_are_inferred():
    spec = model({"reshape": {"shape": [1, 8, 8]}}, {"conv2d": {"out": 4, "kernel": 3}},
                 "batchnorm2d", "relu", {"maxpool2d": {"kernel": 2}}, "flatten",
                 {"linear": {"out": 10}})
    network = build_network(spec, 64, 10)
    assert network(torch.zeros(5, 64)).shape == (5, 10)
    assert network[1].in_channels == 1 and network[6].in_features == 36


def test_wrong_output_width_is_caught():
    with pytest.raises(ModelError, match=r"outputs \(3,\) per row; the task needs 1"):
        build_network(model({"linear": {"out": 3}}), 10, 1)


def test_layers_that_do_not_fit_the_data():
    with pytest.raises(ModelError, match=r"model.layers.0: reshape .*\(the data has 10 features\)"):
        build_network(model({"reshape": {"shape": [1, 8, 8]}}, "flatten",
                            {"linear": {"out": 1}}), 10, 1)


def test_sequence_layers_build_in_a_plain_list():
    spec = model({"reshape": {"shape": [4, 4]}},
                 {"transformer_encoder": {"heads": 2, "feedforward": 8}},
                 {"multihead_attention": {"heads": 4}}, "layer_norm",
                 {"gru": {"hidden": 3, "bidirectional": True}}, {"global_pool": {"op": "max"}},
                 {"linear": {"out": 2}})
    network = build_network(spec, 16, 2)
    assert network(torch.randn(5, 16)).shape == (5, 2)
    assert network[1].positions.shape == (1, 4, 4)
    assert network[1].encoder.layers[0].linear1.out_features == 8
    assert network[4].rnn.hidden_size == 3 and network[4].rnn.bidirectional


def test_global_pool_over_an_image():
    spec = model({"reshape": {"shape": [2, 4, 4]}}, {"global_pool": {"op": "sum"}},
                 {"linear": {"out": 1}})
    network = build_network(spec, 32, 1)
    x = torch.randn(3, 32)
    torch.testing.assert_close(network[1](network[0](x)), x.reshape(3, 2, 16).sum(2))


def test_numeric_inputs_keep_the_plain_network():
    inputs = [{"name": n, "type": "numeric", "spec": {"name": n, "type": "numeric"},
               "columns": [n]} for n in ("a", "b")]
    network = build_network(model({"linear": {"out": 1}}), 2, 1, inputs)
    assert isinstance(network, torch.nn.Sequential) and network[0].in_features == 2
    with pytest.raises(ModelError, match="the fitted inputs take 2 matrix columns"):
        build_network(model({"linear": {"out": 1}}), 3, 1, inputs)


def test_custom_class_gets_sizes_it_asks_for():
    network = build_network(model(**{"class": "torch.nn:Linear", "kwargs": {"bias": False}}),
                            7, 1)
    assert network.in_features == 7 and network.bias is None


def test_custom_class_errors():
    with pytest.raises(ModelError, match="cannot import 'nopkg_zz.mod:Net'"):
        build_network(model(**{"class": "nopkg_zz.mod:Net"}), 3, 1)
    with pytest.raises(ModelError, match="not a torch.nn.Module"):
        build_network(model(**{"class": "collections:OrderedDict"}), 3, 1)


def card(**overrides):
    base = dict(task="regression", loss="mse", feature_names=["a", "b"], out_features=1,
                model={"layers": [{"linear": {"out": 1}}]},
                preprocessing=[{"kind": "impute", "columns": [0], "params": {"fill": [9.0]}},
                               {"kind": "scale", "columns": [0, 1],
                                "params": {"center": [1.0, 2.0], "scale": [2.0, 4.0]}}],
                target_mean=100.0, target_std=10.0)
    return ModelCard(**{**base, **overrides})


def test_served_model_applies_preprocessing_and_unscales(tmp_path):
    served = ServedModel(card()).eval()
    with torch.no_grad():
        served.network[0].weight.copy_(torch.tensor([[1.0, 1.0]]))
        served.network[0].bias.zero_()
    raw = np.array([[3.0, 6.0], [np.nan, 2.0]], dtype=np.float32)
    # (3-1)/2 + (6-2)/4 = 2 -> 2 * 10 + 100; nan -> 9: (9-1)/2 + 0 = 4 -> 140
    assert served.predict_frame(raw)["prediction"].tolist() == pytest.approx([120.0, 140.0])
    loaded = load_served_model(save_served_model(served, tmp_path / "m"))
    assert loaded.predict_frame(raw)["prediction"].tolist() == pytest.approx([120.0, 140.0])


def test_classifier_outputs_labels_and_probabilities():
    served = ServedModel(card(task="multiclass", loss="cross_entropy", out_features=3,
                              model={"layers": [{"linear": {"out": 3}}]},
                              classes=["x", "y", "z"], preprocessing=[])).eval()
    frame = served.predict_frame(np.zeros((2, 2), dtype=np.float32))
    assert list(frame.columns) == ["prediction", "probability_x", "probability_y",
                                   "probability_z"]
    assert frame.iloc[:, 1:].sum(axis=1).tolist() == pytest.approx([1.0, 1.0])


def test_every_layer_of_the_vocabulary_has_a_torch_builder():
    from dbspec.models import network
    from dbspec.spec.sections.layers import LAYER_NAMES

    built = set(network._WITHOUT_ARGS) | set(network._FROM_SETTINGS) | {"embedding", "resnet"}
    assert built == set(LAYER_NAMES)
