"""The closed layer vocabulary: each entry of ``model.layers`` (and of an encoder's own layer
list) is one key, the layer's name, with its settings; input sizes are inferred
(:mod:`dbspec.spec.shapes`)."""

from typing import Annotated, Any, ClassVar, Literal, Optional, Union

from pydantic import Field, create_model

from dbspec.spec.sections.base import OneKeyModel, SpecModel, d, one_key_entry

Positive = Annotated[int, Field(ge=1)]
NonNegative = Annotated[int, Field(ge=0)]
Size = Union[Positive, tuple[Positive, Positive]]
Padding = Union[NonNegative, tuple[NonNegative, NonNegative]]


class Empty(SpecModel):
    """A layer without arguments."""


class LinearArgs(SpecModel):
    out: int = d("Output features; input features are inferred.", ge=1)
    bias: bool = d("Learn an additive bias.", default=True)


class ConvArgs(SpecModel):
    out: int = d("Output channels; input channels are inferred.", ge=1)
    kernel: Size = d("Kernel size (an int, or [h, w] for conv2d).")
    stride: Size = d("Stride.", default=1)
    padding: Union[Padding, Literal["same", "valid"]] = d("Padding.", default=0)
    dilation: Size = d("Dilation.", default=1)
    bias: bool = d("Learn an additive bias.", default=True)


class PoolArgs(SpecModel):
    kernel: Size = d("Window size.")
    stride: Optional[Size] = d("Stride; default: the window size.", default=None)
    padding: Padding = d("Implicit zero padding.", default=0)


class AdaptivePoolArgs(SpecModel):
    out: Size = d("Output size.")


class DropoutArgs(SpecModel):
    p: float = d("Probability of zeroing an element.", default=0.5, ge=0, lt=1)


class NormArgs(SpecModel):
    eps: float = d("Added to the variance for numerical stability.", default=1e-5, gt=0)
    momentum: float = d("Running-statistics momentum (batch norm only).", default=0.1, gt=0, le=1)
    affine: bool = d("Learn scale and shift.", default=True)


class LeakyReluArgs(SpecModel):
    negative_slope: float = d("Slope for negative inputs.", default=0.01)


class EluArgs(SpecModel):
    alpha: float = d("Scale of the negative part.", default=1.0)


class SoftmaxArgs(SpecModel):
    dim: int = d("Dimension to normalise (default: the last).", default=-1)


class EmbeddingArgs(SpecModel):
    dim: int = d("Width of each vector.", ge=1, le=65_536)
    vocabulary: Optional[int] = d("Number of indices (0 is padding); default: the size of the "
                                  "encoded feature's fitted vocabulary.", default=None, ge=2)


class RecurrentArgs(SpecModel):
    hidden: int = d("Hidden size of each direction.", ge=1, le=65_536)
    layers: int = d("Stacked layers.", default=1, ge=1, le=16)
    bidirectional: bool = d("Read both ways (output width 2 x hidden).", default=False)
    dropout: float = d("Dropout between stacked layers.", default=0.0, ge=0, lt=1)


class TransformerArgs(SpecModel):
    heads: int = d("Attention heads; they must divide the input width.", ge=1, le=256)
    layers: int = d("Encoder layers.", default=1, ge=1, le=48)
    feedforward: Optional[int] = d("Feed-forward width; default 4 x the input width.",
                                   default=None, ge=1)
    dropout: float = d("Dropout inside the layers.", default=0.1, ge=0, lt=1)
    positions: bool = d("Add a learned position embedding first (order matters).",
                        default=True)


class AttentionArgs(SpecModel):
    heads: int = d("Attention heads; they must divide the input width.", ge=1, le=256)
    dropout: float = d("Dropout on the attention weights.", default=0.0, ge=0, lt=1)


class GlobalPoolArgs(SpecModel):
    op: Literal["mean", "max", "sum", "first", "last"] = d(
        "mean / max / sum over the items of a sequence (length, width) -> (width,) or over "
        "the positions of an image (channels, h, w) -> (channels,); first / last item of a "
        "sequence. Padding is left out.", default="mean")


class ResNetArgs(SpecModel):
    depth: Literal[18, 34] = d("ResNet-18 or ResNet-34 (torchvision's layout).", default=18)
    weights: Optional[str] = d("A state dict (.pt/.pth) saved from torchvision's model of that "
                               "depth; default: random initialisation.", default=None,
                               min_length=1)
    freeze: bool = d("Keep the loaded weights fixed.", default=False)


class ReshapeArgs(SpecModel):
    shape: list[Annotated[int, Field(ge=-1)]] = d("Shape per sample, without the batch dimension; one entry may be -1.",
                         min_length=1)


_LAYERS: dict[str, tuple[type[SpecModel], str, bool]] = {
    "linear": (LinearArgs, "Fully connected layer.", False),
    "conv1d": (ConvArgs, "1-d convolution over (channels, length).", False),
    "conv2d": (ConvArgs, "2-d convolution over (channels, height, width).", False),
    "maxpool1d": (PoolArgs, "1-d max pooling.", False),
    "maxpool2d": (PoolArgs, "2-d max pooling.", False),
    "avgpool1d": (PoolArgs, "1-d average pooling.", False),
    "avgpool2d": (PoolArgs, "2-d average pooling.", False),
    "adaptive_avgpool1d": (AdaptivePoolArgs, "1-d average pooling to a fixed size.", False),
    "adaptive_avgpool2d": (AdaptivePoolArgs, "2-d average pooling to a fixed size.", False),
    "flatten": (Empty, "Flatten everything but the batch dimension.", True),
    "reshape": (ReshapeArgs, "Reshape each sample, e.g. 64 features to [1, 8, 8].", False),
    "dropout": (DropoutArgs, "Dropout.", True),
    "batchnorm1d": (NormArgs, "Batch norm over features or (channels, length).", True),
    "batchnorm2d": (NormArgs, "Batch norm over (channels, height, width).", True),
    "layernorm": (NormArgs, "Layer norm over the last dimension.", True),
    "layer_norm": (NormArgs, "Layer norm over the last dimension (same as layernorm).", True),
    "embedding": (EmbeddingArgs, "Index -> learned vector: (length,) ids -> (length, dim).",
                  False),
    "lstm": (RecurrentArgs, "LSTM over a sequence (length, width) -> (length, hidden).", False),
    "gru": (RecurrentArgs, "GRU over a sequence (length, width) -> (length, hidden).", False),
    "transformer_encoder": (TransformerArgs, "Transformer encoder layers over a sequence "
                            "(length, width), padding masked.", False),
    "multihead_attention": (AttentionArgs, "Self-attention over a sequence (length, width), "
                            "padding masked.", False),
    "global_pool": (GlobalPoolArgs, "Pool a sequence or an image to one vector.", True),
    "resnet": (ResNetArgs, "A ResNet body over an image (channels, h, w) -> (512,).", True),
    "relu": (Empty, "ReLU activation.", True),
    "leaky_relu": (LeakyReluArgs, "Leaky ReLU activation.", True),
    "gelu": (Empty, "GELU activation.", True),
    "elu": (EluArgs, "ELU activation.", True),
    "selu": (Empty, "SELU activation.", True),
    "silu": (Empty, "SiLU (swish) activation.", True),
    "mish": (Empty, "Mish activation.", True),
    "softplus": (Empty, "Softplus activation.", True),
    "tanh": (Empty, "Tanh activation.", True),
    "sigmoid": (Empty, "Sigmoid activation.", True),
    "softmax": (SoftmaxArgs, "Softmax (probabilities; losses expect raw logits).", True),
    "log_softmax": (SoftmaxArgs, "Log-softmax (pairs with the nll loss).", True),
    "identity": (Empty, "Pass the input through.", True),
}

LAYER_NAMES = tuple(_LAYERS)


class _LayerBase(OneKeyModel):
    entry_word: ClassVar[str] = "layer"
    model_config = OneKeyModel.model_config | {
        "json_schema_extra": {"minProperties": 1, "maxProperties": 1}}


#: One optional field per layer name, its settings model the field's type
_FIELDS: dict[str, Any] = {key: (Optional[args], Field(default=None, description=text))
                           for key, (args, text, _) in _LAYERS.items()}
LayerSpec = create_model(
    "LayerSpec", __base__=_LayerBase, __module__=__name__,
    __doc__="One layer: its name as the key, its settings as the value.", **_FIELDS)
Layer = one_key_entry(LayerSpec, bare=[k for k, (_, _, opt) in _LAYERS.items() if opt])
