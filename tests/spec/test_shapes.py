"""Shape inference agrees with PyTorch's layer arithmetic."""

from __future__ import annotations

import pytest

from dbspec.spec.sections.layers import LayerSpec
from dbspec.spec.shapes import ShapeError, infer_shapes


def layers(*entries):
    return [LayerSpec.model_validate(e if isinstance(e, dict) else {e: {}}) for e in entries]


def test_mlp_shapes():
    shapes = infer_shapes(layers({"linear": {"out": 8}}, "relu", {"linear": {"out": 1}}), (10,))
    assert shapes == [(8,), (8,), (1,)]


def test_cnn_shapes_match_torch_formulae():
    net = layers({"reshape": {"shape": [1, 8, 8]}},
                 {"conv2d": {"out": 16, "kernel": 3, "padding": 1}},
                 {"maxpool2d": {"kernel": 2}},
                 {"conv2d": {"out": 4, "kernel": [3, 1], "stride": 2}},
                 "flatten")
    assert infer_shapes(net, (64,)) == [(1, 8, 8), (16, 8, 8), (16, 4, 4), (4, 1, 2), (8,)]


def test_conv1d_same_padding_and_adaptive_pool():
    net = layers({"reshape": {"shape": [2, -1]}}, {"conv1d": {"out": 3, "kernel": 5,
                                                              "padding": "same"}},
                 {"adaptive_avgpool1d": {"out": 4}})
    assert infer_shapes(net, (20,)) == [(2, 10), (3, 10), (3, 4)]


def test_reshape_with_inferred_dimension_must_divide():
    with pytest.raises(ShapeError, match="do not divide"):
        infer_shapes(layers({"reshape": {"shape": [3, -1]}}), (10,))


def test_batchnorm2d_needs_images():
    with pytest.raises(ShapeError) as info:
        infer_shapes(layers({"linear": {"out": 4}}, "batchnorm2d"), (10,))
    assert info.value.index == 1


def test_inferred_shapes_equal_a_real_torch_forward_pass():
    # only this test needs torch (a core install has none); the module-level importorskip
    # this replaces skipped every shape test with it
    torch = pytest.importorskip("torch")
    nn = torch.nn

    net = layers({"reshape": {"shape": [1, 8, 8]}},
                 {"conv2d": {"out": 6, "kernel": 3, "stride": 2, "padding": 1}},
                 {"avgpool2d": {"kernel": 2, "stride": 1}},
                 "flatten", {"linear": {"out": 5}})
    shapes = infer_shapes(net, (64,))
    model = nn.Sequential(nn.Unflatten(1, (1, 8, 8)), nn.Conv2d(1, 6, 3, stride=2, padding=1),
                          nn.AvgPool2d(2, stride=1), nn.Flatten(), nn.Linear(6 * 3 * 3, 5))
    x = torch.zeros(2, 64)
    for module, shape in zip(model, shapes):
        x = module(x)
        assert tuple(x.shape[1:]) == shape
