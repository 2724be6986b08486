"""Shape inference through the layer list, without torch.

Shapes exclude the batch dimension: tabular input is ``(features,)``, an image ``(C, H, W)``.
The same arithmetic as PyTorch's layers, so ``dbspec validate`` catches a conv on flat input or
a reshape that does not add up before a run starts.
"""

from __future__ import annotations

import math
from typing import Optional, Union


Shape = tuple[int, ...]
_SAME_SHAPE = {"dropout", "layernorm", "layer_norm", "relu", "leaky_relu", "gelu", "elu", "selu", "silu", "mish",
               "softplus", "tanh", "sigmoid", "softmax", "log_softmax", "identity"}


class ShapeError(Exception):
    """A layer cannot take the shape it is given."""

    def __init__(self, index: int, message: str):
        super().__init__(message)
        self.index, self.message = index, message


def infer_shapes(layers: list, input_shape: Shape) -> list[Shape]:
    """Output shape of each layer for one sample of ``input_shape``.

    Raises:
        ShapeError: with the index of the first layer that cannot work.
    """
    shapes: list[Shape] = []
    shape = input_shape
    for index, layer in enumerate(layers):
        try:
            shape = _output_shape(layer.key, layer.args, shape)
        except ValueError as exc:
            raise ShapeError(index, str(exc)) from None
        if any(s <= 0 for s in shape):
            raise ShapeError(index, f"{layer.key} would produce the empty shape "
                             f"{format_shape(shape)} from {format_shape(shapes[-1] if shapes else input_shape)}")
        shapes.append(shape)
    return shapes


def fixed_output_width(layers: list) -> Optional[int]:
    """The width a network ends with whatever its input: the last linear layer's ``out`` when
    only layers that keep the shape follow it; else None."""
    for layer in reversed(layers):
        if layer.key == "linear":
            return int(layer.args.out)
        if layer.key not in _SAME_SHAPE:
            return None
    return None


def format_shape(shape: Shape) -> str:
    """``(8, 8)`` -> ``(8, 8)``, ``(10,)`` -> ``(10,)``."""
    return "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"


def _pair(value: Union[int, tuple, list]) -> tuple[int, int]:
    return (value, value) if isinstance(value, int) else (int(value[0]), int(value[1]))


def _require(name: str, shape: Shape, dims: int, example: str) -> None:
    if len(shape) != dims:
        raise ValueError(f"{name} expects {example} per sample, got {format_shape(shape)}"
                         + ("; add a reshape first, e.g. '- reshape: {shape: [1, "
                            f"{shape[0]}]}}'" if len(shape) == 1 and dims == 2 else "")
                         + _image_hint(shape, dims))


def _image_hint(shape: Shape, dims: int) -> str:
    """A reshape to (1, side, side) when a flat input is a square image's pixels."""
    if len(shape) != 1 or dims != 3:
        return ""
    side = math.isqrt(shape[0])
    if side * side == shape[0] and side > 1:
        return f"; add a reshape first, e.g. '- reshape: {{shape: [1, {side}, {side}]}}'"
    return "; add a reshape to (channels, height, width) first"


def _window(size: int, kernel: int, stride: int, padding: int, dilation: int = 1) -> int:
    return (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


def _output_shape(name: str, args, shape: Shape) -> Shape:
    if name in _SAME_SHAPE:
        return shape
    if name == "linear":
        return shape[:-1] + (args.out,)
    if name == "flatten":
        return (math.prod(shape),)
    if name == "reshape":
        return _reshape(args.shape, shape)
    if name in ("conv1d", "conv2d"):
        return _conv(name, args, shape)
    if name in ("maxpool1d", "avgpool1d", "maxpool2d", "avgpool2d"):
        return _pool(name, args, shape)
    if name in ("adaptive_avgpool1d", "adaptive_avgpool2d"):
        dims = 2 if name.endswith("1d") else 3
        _require(name, shape, dims, "(channels, length)" if dims == 2 else "(channels, h, w)")
        return (shape[0], args.out) if dims == 2 else (shape[0], *_pair(args.out))
    if name == "batchnorm1d":
        if len(shape) not in (1, 2):
            raise ValueError(f"batchnorm1d expects (features,) or (channels, length), got "
                             f"{format_shape(shape)}")
        return shape
    if name == "batchnorm2d":
        _require(name, shape, 3, "(channels, height, width)")
        return shape
    if name in _SEQUENCE_RULES:
        return _SEQUENCE_RULES[name](name, args, shape)
    raise ValueError(f"no shape rule for layer '{name}'")  # a new layer without a rule is a bug


def _embedding(name: str, args, shape: Shape) -> Shape:
    if len(shape) != 1:
        raise ValueError(f"embedding expects a vector of indices (length,) per sample, got "
                         f"{format_shape(shape)}")
    return (shape[0], args.dim)


def _recurrent(name: str, args, shape: Shape) -> Shape:
    _require_sequence(name, shape)
    return (shape[0], args.hidden * (2 if args.bidirectional else 1))


def _attention(name: str, args, shape: Shape) -> Shape:
    _require_sequence(name, shape)
    if shape[1] % args.heads:
        raise ValueError(f"{name}: {args.heads} heads do not divide the width {shape[1]}; "
                         f"use a head count that divides it ({divisors(shape[1])})")
    return shape


def _global_pool(name: str, args, shape: Shape) -> Shape:
    if len(shape) == 2:
        return (shape[1],)
    if len(shape) == 3 and args.op in ("mean", "max", "sum"):
        return (shape[0],)
    if len(shape) == 3:
        raise ValueError(f"global_pool {args.op} takes a sequence (length, width); pool an "
                         "image with mean, max or sum")
    raise ValueError(f"global_pool expects a sequence (length, width) or an image (channels, "
                     f"h, w) per sample, got {format_shape(shape)}")


def _resnet(name: str, args, shape: Shape) -> Shape:
    _require(name, shape, 3, "an image (channels, height, width)")
    return (512,)


def _require_sequence(name: str, shape: Shape) -> None:
    if len(shape) != 2:
        raise ValueError(f"{name} expects a sequence (length, width) per sample, got "
                         f"{format_shape(shape)}"
                         + ("; embed indices first ('- embedding: {dim: 64}') or reshape"
                            if len(shape) == 1 else ""))


def divisors(width: int) -> str:
    """The head counts up to 64 that divide ``width``, for messages."""
    return ", ".join(str(h) for h in range(1, min(width, 64) + 1) if width % h == 0)


_SEQUENCE_RULES = {"embedding": _embedding, "lstm": _recurrent, "gru": _recurrent,
                   "transformer_encoder": _attention, "multihead_attention": _attention,
                   "global_pool": _global_pool, "resnet": _resnet}


def _reshape(target: list[int], shape: Shape) -> Shape:
    total = math.prod(shape)
    if target.count(-1) > 1:
        raise ValueError(f"reshape {target}: at most one -1")
    if any(t == 0 or t < -1 for t in target):
        raise ValueError(f"reshape {target}: sizes must be positive or -1")
    known = math.prod(t for t in target if t != -1)
    if -1 in target:
        if total % known:
            raise ValueError(f"reshape {target}: {total} values do not divide into {known}")
        return tuple(total // known if t == -1 else t for t in target)
    if known != total:
        raise ValueError(f"reshape {target} needs {known} values per sample, the input "
                         f"{format_shape(shape)} has {total}")
    return tuple(target)


def _conv(name: str, args, shape: Shape) -> Shape:
    dims = 2 if name == "conv1d" else 3
    _require(name, shape, dims, "(channels, length)" if dims == 2 else "(channels, height, width)")
    spatial = shape[1:]
    kernel, stride, dilation = (_pair(args.kernel), _pair(args.stride), _pair(args.dilation))
    if args.padding == "same":
        if any(s != 1 for s in stride[: len(spatial)]):
            raise ValueError(f"{name}: padding 'same' needs stride 1")
        return (args.out, *spatial)
    padding = (0, 0) if args.padding == "valid" else _pair(args.padding)
    out = tuple(_window(size, kernel[i], stride[i], padding[i], dilation[i])
                for i, size in enumerate(spatial))
    return (args.out, *out)


def _pool(name: str, args, shape: Shape) -> Shape:
    dims = 2 if name.endswith("1d") else 3
    _require(name, shape, dims, "(channels, length)" if dims == 2 else "(channels, height, width)")
    kernel = _pair(args.kernel)
    stride = _pair(args.stride) if args.stride is not None else kernel
    padding = _pair(args.padding)
    for i in range(dims - 1):
        if padding[i] * 2 > kernel[i]:
            raise ValueError(f"{name}: padding must be at most half the kernel size")
    spatial = shape[1:]
    return (shape[0], *(_window(size, kernel[i], stride[i], padding[i])
                        for i, size in enumerate(spatial)))
