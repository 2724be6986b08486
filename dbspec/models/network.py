"""Build the ``nn.Module`` a spec describes, with input sizes inferred."""

from __future__ import annotations

import importlib
import inspect
from typing import Any

import torch
from torch import nn

from dbspec.errors import DbspecError
from dbspec.spec.sections.network import ModelSpec
from dbspec.spec.shapes import ShapeError, format_shape, infer_shapes


class ModelError(DbspecError):
    """The network cannot be built for the data it is given."""


class Reshape(nn.Module):
    """Reshape each sample (the batch dimension is kept)."""

    def __init__(self, shape: list[int]):
        super().__init__()
        self.shape = tuple(shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(x.shape[0], *self.shape)

    def extra_repr(self) -> str:
        return f"shape={self.shape}"


def _pool_stride(args) -> Any:
    return args.stride if args.stride is not None else args.kernel


def _layer(name: str, args, shape: tuple[int, ...]) -> nn.Module:
    """One torch layer for a vocabulary entry whose input has ``shape`` (no batch dim)."""
    simple = {"relu": nn.ReLU, "gelu": nn.GELU, "selu": nn.SELU, "silu": nn.SiLU,
              "mish": nn.Mish, "softplus": nn.Softplus, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid,
              "identity": nn.Identity, "flatten": nn.Flatten}
    if name in simple:
        return simple[name]()
    if name == "linear":
        return nn.Linear(shape[-1], args.out, bias=args.bias)
    if name in ("conv1d", "conv2d"):
        cls = nn.Conv1d if name == "conv1d" else nn.Conv2d
        return cls(shape[0], args.out, args.kernel, stride=args.stride, padding=args.padding,
                   dilation=args.dilation, bias=args.bias)
    if name in ("maxpool1d", "maxpool2d", "avgpool1d", "avgpool2d"):
        cls = {"maxpool1d": nn.MaxPool1d, "maxpool2d": nn.MaxPool2d, "avgpool1d": nn.AvgPool1d,
               "avgpool2d": nn.AvgPool2d}[name]
        return cls(args.kernel, stride=_pool_stride(args), padding=args.padding)
    if name == "adaptive_avgpool1d":
        return nn.AdaptiveAvgPool1d(args.out)
    if name == "adaptive_avgpool2d":
        return nn.AdaptiveAvgPool2d(args.out)
    if name == "reshape":
        return Reshape(args.shape)
    if name == "dropout":
        return nn.Dropout(args.p)
    if name in ("batchnorm1d", "batchnorm2d"):
        cls = nn.BatchNorm1d if name == "batchnorm1d" else nn.BatchNorm2d
        return cls(shape[0], eps=args.eps, momentum=args.momentum, affine=args.affine)
    if name == "layernorm":
        return nn.LayerNorm(shape[-1], eps=args.eps, elementwise_affine=args.affine)
    if name == "leaky_relu":
        return nn.LeakyReLU(args.negative_slope)
    if name == "elu":
        return nn.ELU(args.alpha)
    if name == "softmax":
        return nn.Softmax(dim=args.dim)
    if name == "log_softmax":
        return nn.LogSoftmax(dim=args.dim)
    raise ModelError(f"no torch layer for '{name}'")  # a vocabulary entry without a builder


def build_network(model: ModelSpec, in_features: int, out_features: int) -> nn.Module:
    """The network for ``in_features`` inputs; its output width must be ``out_features``.

    Raises:
        ModelError: the layers do not fit the data, the custom class cannot be imported or
            built, or the output width is wrong.
    """
    if model.custom is not None:
        network = _custom(model.custom, in_features, out_features)
    else:
        try:
            shapes = infer_shapes(model.layers, (in_features,))
        except ShapeError as exc:
            raise ModelError(f"model.layers.{exc.index}: {exc.message} (the data has "
                             f"{in_features} features)") from None
        inputs = [(in_features,)] + shapes[:-1]
        network = nn.Sequential(*(_layer(layer.key, layer.args, shape)
                                  for layer, shape in zip(model.layers, inputs)))
    _check_output(network, in_features, out_features)
    return network


def _custom(custom, in_features: int, out_features: int) -> nn.Module:
    module_name, _, attr = custom.class_.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as exc:
        raise ModelError(f"model.custom.class: cannot import '{custom.class_}': {exc}") from None
    kwargs = dict(custom.kwargs)
    try:
        accepted = inspect.signature(target).parameters
    except (TypeError, ValueError):
        accepted = {}
    for name, value in (("in_features", in_features), ("out_features", out_features)):
        if name in accepted and name not in kwargs:
            kwargs[name] = value  # sizes the data decides, handed over when the class asks
    try:
        network = target(**kwargs)
    except TypeError as exc:
        raise ModelError(f"model.custom: {custom.class_}({', '.join(kwargs)}) failed: {exc}") \
            from None
    if not isinstance(network, nn.Module):
        raise ModelError(f"model.custom.class: {custom.class_} built a "
                         f"{type(network).__name__}, not a torch.nn.Module")
    return network


def _check_output(network: nn.Module, in_features: int, out_features: int) -> None:
    was_training = network.training
    network.eval()
    try:
        with torch.no_grad():
            out = network(torch.zeros(2, in_features))
    except RuntimeError as exc:
        raise ModelError(f"model: a forward pass on {in_features} features fails: {exc}") from None
    finally:
        network.train(was_training)
    if out.dim() != 2 or out.shape[1] != out_features:
        raise ModelError(f"model: the network outputs {format_shape(tuple(out.shape[1:]))} per "
                         f"row; the task needs {out_features}")
