"""Build the ``nn.Module`` a spec describes, with input sizes inferred: ``nn.Sequential`` over
the feature vector, or, with typed features (fitted ``inputs``), a
:class:`~dbspec.models.typed.TypedNetwork` whose encoders (compiled by :mod:`dbspec.spec.layout`
to layer lists) are built layer by layer as the head is.
"""

from __future__ import annotations

import importlib
import inspect
from functools import partial
from typing import Any, Callable, Optional

import torch
from torch import nn

from dbspec.errors import DbspecError
from dbspec.models.resnet import ResNetBody, WeightsError, freeze, load_weights as load_resnet
from dbspec.models.card import has_typed_inputs
from dbspec.models.typed import (COMBINERS, FeatureEncoder, GlobalPool, ImageAugment,
                                 MaskedSequential, Recurrent, SelfAttention,
                                 SequenceTransformer, TokenEmbedding, TypedNetwork)
from dbspec.spec.layout import LayoutError, combined_width, encoded_inputs, encoder_width
from dbspec.spec.sections.network import ModelSpec
from dbspec.spec.shapes import ShapeError, format_shape, infer_shapes

#: Layers whose output keeps the input's sequence axis item for item: the mask still holds
_KEEPS_MASK = {"embedding", "linear", "dropout", "layernorm", "layer_norm", "batchnorm1d",
               "lstm", "gru", "transformer_encoder", "multihead_attention", "identity", "relu",
               "leaky_relu", "gelu", "elu", "selu", "silu", "mish", "softplus", "tanh",
               "sigmoid", "softmax", "log_softmax"}


class ModelError(DbspecError):
    """The network cannot be built for the data it is given."""


class _Unbuildable(Exception):
    """A layer whose settings cannot be built; the caller adds where it is in the spec."""


class Reshape(nn.Module):
    """Reshape each sample (the batch dimension is kept)."""

    def __init__(self, shape: list[int]):
        super().__init__()
        self.shape = tuple(shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(x.shape[0], *self.shape)

    def extra_repr(self) -> str:
        return f"shape={self.shape}"


#: Layers built without settings
_WITHOUT_ARGS: dict[str, Callable[[], nn.Module]] = {
    "relu": nn.ReLU, "gelu": nn.GELU, "selu": nn.SELU, "silu": nn.SiLU, "mish": nn.Mish,
    "softplus": nn.Softplus, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid, "identity": nn.Identity,
    "flatten": nn.Flatten}


def _conv(cls: Any, args: Any, shape: tuple[int, ...]) -> nn.Module:
    return cls(shape[0], args.out, args.kernel, stride=args.stride, padding=args.padding,
               dilation=args.dilation, bias=args.bias)


def _pool(cls: Any, args: Any, shape: tuple[int, ...]) -> nn.Module:
    stride = args.stride if args.stride is not None else args.kernel
    return cls(args.kernel, stride=stride, padding=args.padding)


def _batchnorm(cls: Any, args: Any, shape: tuple[int, ...]) -> nn.Module:
    return cls(shape[0], eps=args.eps, momentum=args.momentum, affine=args.affine)


def _layernorm(args: Any, shape: tuple[int, ...]) -> nn.Module:
    return nn.LayerNorm(shape[-1], eps=args.eps, elementwise_affine=args.affine)


#: Layers built from their settings and their input's shape (no batch dim) alone
_FROM_SETTINGS: dict[str, Callable[[Any, tuple[int, ...]], nn.Module]] = {
    "linear": lambda args, shape: nn.Linear(shape[-1], args.out, bias=args.bias),
    "conv1d": partial(_conv, nn.Conv1d), "conv2d": partial(_conv, nn.Conv2d),
    "maxpool1d": partial(_pool, nn.MaxPool1d), "maxpool2d": partial(_pool, nn.MaxPool2d),
    "avgpool1d": partial(_pool, nn.AvgPool1d), "avgpool2d": partial(_pool, nn.AvgPool2d),
    "adaptive_avgpool1d": lambda args, shape: nn.AdaptiveAvgPool1d(args.out),
    "adaptive_avgpool2d": lambda args, shape: nn.AdaptiveAvgPool2d(args.out),
    "reshape": lambda args, shape: Reshape(args.shape),
    "dropout": lambda args, shape: nn.Dropout(args.p),
    "batchnorm1d": partial(_batchnorm, nn.BatchNorm1d),
    "batchnorm2d": partial(_batchnorm, nn.BatchNorm2d),
    "layernorm": _layernorm, "layer_norm": _layernorm,
    "leaky_relu": lambda args, shape: nn.LeakyReLU(args.negative_slope),
    "elu": lambda args, shape: nn.ELU(args.alpha),
    "softmax": lambda args, shape: nn.Softmax(dim=args.dim),
    "log_softmax": lambda args, shape: nn.LogSoftmax(dim=args.dim),
    "lstm": lambda args, shape: Recurrent("lstm", shape[-1], args),
    "gru": lambda args, shape: Recurrent("gru", shape[-1], args),
    "transformer_encoder": lambda args, shape: SequenceTransformer(shape[0], shape[1], args),
    "multihead_attention": lambda args, shape: SelfAttention(shape[1], args),
    "global_pool": lambda args, shape: GlobalPool(args.op),
}


def _layer(name: str, args, shape: tuple[int, ...], *, vocabulary: Optional[int] = None,
           load_weights: bool = False) -> nn.Module:
    """One torch layer for a vocabulary entry whose input has ``shape`` (no batch dim);
    ``vocabulary``: the fitted feature's indices, when known.

    Raises:
        _Unbuildable: settings that cannot be built (the caller locates them).
    """
    if name in _WITHOUT_ARGS:
        return _WITHOUT_ARGS[name]()
    if name in _FROM_SETTINGS:
        return _FROM_SETTINGS[name](args, shape)
    if name == "embedding":
        return TokenEmbedding(_vocabulary(args, vocabulary), args.dim, padding_idx=0)
    if name == "resnet":
        return _resnet(args, shape, load_weights)
    raise ModelError(f"no torch layer for '{name}'")  # a vocabulary entry without a builder


def _vocabulary(args, fitted: Optional[int]) -> int:
    if args.vocabulary is None and fitted is None:
        raise _Unbuildable(
            "embedding needs 'vocabulary' (the number of indices, 0 being padding), e.g. "
            "'- embedding: {dim: 16, vocabulary: 1000}'; only the encoder of a categorical, "
            "text or token sequence feature takes the size of its fitted vocabulary")
    if args.vocabulary is not None and fitted is not None and args.vocabulary < fitted:
        raise _Unbuildable(f"embedding: vocabulary {args.vocabulary} is smaller than the "
                           f"feature's {fitted} fitted indices; raise it or leave it out")
    return args.vocabulary if args.vocabulary is not None else fitted


def _resnet(args, shape: tuple[int, ...], load_weights: bool) -> ResNetBody:
    body = ResNetBody(args.depth, in_channels=shape[0])
    if load_weights and args.weights:
        try:
            load_resnet(body, args.weights)
        except WeightsError as exc:
            raise _Unbuildable(str(exc)) from None
    if args.freeze:
        freeze(body)  # batch norm stays in train mode: see resnet.freeze
    return body


def _build_layers(layers: list, shapes: list, where: Callable[[int], str], *, masked: bool,
                  vocabulary: Optional[int] = None, load_weights: bool = False) -> nn.Module:
    """``layers`` whose inputs have ``shapes``: MaskedSequential (an encoder) or
    nn.Sequential (a layer list over a vector, without masks)."""
    modules = []
    for index, (layer, shape) in enumerate(zip(layers, shapes)):
        try:
            modules.append(_layer(layer.key, layer.args, shape, vocabulary=vocabulary,
                                  load_weights=load_weights))
        except _Unbuildable as exc:
            raise ModelError(f"{where(index)}: {exc}") from None
    if not masked:
        return nn.Sequential(*modules)
    return MaskedSequential(*modules, keeps_mask=[layer.key in _KEEPS_MASK for layer in layers])


def build_network(model: ModelSpec, in_features: int, out_features: int,
                  inputs: Optional[list[dict]] = None, load_weights: bool = False,
                  check: bool = True) -> nn.Module:
    """The network for ``in_features`` matrix columns; its output width must be
    ``out_features``.

    Args:
        inputs: The model card's fitted inputs; with any non-numeric one, the network is a
            :class:`~dbspec.models.typed.TypedNetwork` (a custom class gets the matrix as is).
        load_weights: Read the weights files the spec names (resnet ``weights``): when a run
            trains; a served model is rebuilt without them and loads its own state dict.
        check: The output check, a forward pass on two rows; off where it cannot run (a ZeRO-3
            rank's partitioned parameters, outside the engine) and ran already (the launcher).

    Raises:
        ModelError: the layers do not fit the data, the custom class cannot be imported or
            built, a weights file cannot be loaded, or the output width is wrong.
    """
    if inputs is not None:
        taken = sum(len(entry["columns"]) for entry in inputs)
        if taken != in_features:
            raise ModelError(f"model: the fitted inputs take {taken} matrix columns, the data "
                             f"has {in_features}")
    if model.pretrained is not None:
        from dbspec.models.pretrained import build_pretrained

        network = build_pretrained(model.pretrained, out_features, inputs or [], load_weights)
    elif model.custom is not None:
        network = _custom(model.custom, in_features, out_features)
    elif has_typed_inputs(inputs):
        network = _typed(model, inputs, load_weights)
    else:
        network = _head(model, in_features, "the data has {} features", load_weights)
    if check:
        _check_output(network, in_features, out_features, finite=model.layers is not None)
    return network


def _fitted_features(inputs: list[dict]) -> tuple[list[int], list, dict[str, tuple]]:
    """The numeric features' matrix columns, the other features' specs, and each of those
    by name: ``(fitted input, first column, column after the last)``.

    Raises:
        ModelError: a fitted input whose feature spec is invalid or not of its type.
    """
    from pydantic import TypeAdapter, ValidationError

    from dbspec.spec.sections.features import TypedFeature

    adapter = TypeAdapter(TypedFeature)
    numeric: list[int] = []
    features, fitted, start = [], {}, 0
    for entry in inputs:
        stop = start + len(entry["columns"])
        if entry["type"] == "numeric":
            numeric += range(start, stop)
        else:
            try:
                features.append(adapter.validate_python(entry["spec"]))
            except ValidationError as exc:
                raise ModelError(f"model: the fitted input '{entry['name']}' has an invalid "
                                 f"feature spec: {exc.errors()[0]['msg']}") from None
            if features[-1].type != entry["type"]:
                raise ModelError(f"model: the fitted input '{entry['name']}' is a "
                                 f"{entry['type']} with a {features[-1].type} spec")
            fitted[entry["name"]] = (entry, start, stop)
        start = stop
    return numeric, features, fitted


def _typed(model: ModelSpec, inputs: list[dict], load_weights: bool) -> TypedNetwork:
    """The :class:`TypedNetwork` for the fitted ``inputs`` (see :func:`build_network`)."""
    numeric, features, fitted = _fitted_features(inputs)
    for name in model.encoders:
        if name not in fitted:
            raise ModelError(f"model.encoders.{name}: no non-numeric feature '{name}'; the "
                             f"encoded features are: {', '.join(fitted)}")
    try:
        encoded = encoded_inputs(features, model)
        widths = [encoder_width(item) for item in encoded]
        width = combined_width(len(numeric), widths, model.combiner)
    except LayoutError as exc:
        raise ModelError(f"{'.'.join(map(str, exc.path))}: {exc.message}") from None
    encoders, columns = [], []
    for item, feature in zip(encoded, features):
        entry, first, last = fitted[item.name]
        if last - first != item.width:
            raise ModelError(f"model: the fitted input '{item.name}' takes {last - first} "
                             f"columns; its shape {format_shape(item.shape)} needs {item.width}")
        own = item.encoder.own_layers
        place = f"model.encoders.{item.name}"
        layers = _build_layers(item.layers, [item.shape] + infer_shapes(item.layers,
                                                                         item.shape)[:-1],
                               (lambda i, p=place: f"{p}.layers.{i}") if own
                               else (lambda i, p=place: p),
                               masked=True, vocabulary=entry.get("indices"),
                               load_weights=load_weights)
        augment = (ImageAugment(feature.augment, feature)
                   if item.type == "image" and feature.augment is not None else None)
        encoders.append(FeatureEncoder(item.name, feature.input_kind, item.shape, layers,
                                       augment))
        columns.append((first, last))
    combiner = COMBINERS[model.combiner.kind].from_spec(
        model.combiner, ([len(numeric)] if numeric else []) + widths)
    head = _head(model, width, "the combined features have {} values", load_weights)
    return TypedNetwork(numeric, encoders, columns, combiner, head)


def _head(model: ModelSpec, width: int, about: str, load_weights: bool) -> nn.Module:
    """``model.layers`` over a vector of ``width`` values (``about`` says what they are)."""
    try:
        shapes = infer_shapes(model.layers, (width,))
    except ShapeError as exc:
        raise ModelError(f"model.layers.{exc.index}: {exc.message} ({about.format(width)})") \
            from None
    return _build_layers(model.layers, [(width,)] + shapes[:-1], lambda i: f"model.layers.{i}",
                         masked=False, load_weights=load_weights)


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


def _check_output(network: nn.Module, in_features: int, out_features: int,
                  finite: bool = False) -> None:
    """A forward pass on zeros (for typed features: unknown values, texts of padding alone)
    gives ``out_features`` per row, and, with ``finite``, no NaN or infinity."""
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
    if finite and not torch.isfinite(out).all():
        raise ModelError("model: the network outputs NaN or infinite values for rows of zeros "
                         "(for typed features: unknown values and empty texts)")
