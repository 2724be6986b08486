"""``model``: a closed layer vocabulary compiled to ``nn.Sequential``, or a custom class; typed
features' encoders and the combiner that joins them."""

from typing import Annotated, Any, ClassVar, Literal, Optional, Union

from pydantic import BeforeValidator, Field, create_model, model_validator


from dbspec.spec.sections.base import OneKeyModel, SpecModel, d, one_key_entry, section

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


LayerSpec = create_model(
    "LayerSpec", __base__=_LayerBase, __module__=__name__,
    __doc__="One layer: its name as the key, its settings as the value.",
    **{key: (Optional[args], Field(default=None, description=text))
       for key, (args, text, _) in _LAYERS.items()},
)
Layer = one_key_entry(LayerSpec, bare=[k for k, (_, _, opt) in _LAYERS.items() if opt])


class EmbeddingEncoder(SpecModel):
    """A learned vector per value (categorical features)."""

    kind: Literal["embedding"] = d("Encoder kind: an embedding table.")
    dim: int = d("Width of the embedding.", default=16, ge=1, le=65_536)
    dropout: float = d("Dropout on the embedding.", default=0.0, ge=0, lt=1)


class BagEncoder(SpecModel):
    """Token embeddings (or a projection of numeric items) pooled over the sequence,
    ignoring padding: order-blind, fast, a strong baseline."""

    kind: Literal["bag"] = d("Encoder kind: embed, then pool over the sequence.")
    dim: int = d("Width of the embedding.", default=64, ge=1, le=65_536)
    pool: Literal["mean", "max", "sum"] = d("Pooling over the non-padding positions.",
                                            default="mean")
    dropout: float = d("Dropout on the embeddings.", default=0.0, ge=0, lt=1)


class RecurrentEncoder(SpecModel):
    """An LSTM or GRU over the embedded sequence, reading the padding-free part of each row."""

    kind: Literal["lstm", "gru"] = d("Encoder kind: a recurrent network.")
    dim: int = d("Width of the token embedding (or numeric-item projection).", default=64,
                 ge=1, le=65_536)
    hidden: int = d("Hidden size of each direction.", default=64, ge=1, le=65_536)
    layers: int = d("Stacked recurrent layers.", default=1, ge=1, le=16)
    bidirectional: bool = d("Read the sequence both ways (output width 2 x hidden).",
                            default=False)
    dropout: float = d("Dropout between stacked layers and on the embeddings.", default=0.0,
                       ge=0, lt=1)
    pool: Literal["last", "mean", "max"] = d("last: the state after each row's last item; "
                                             "mean / max over the items.", default="last")


class TransformerEncoderSpec(SpecModel):
    """Self-attention layers over the embedded sequence with learned positions; padding is
    masked out."""

    kind: Literal["transformer"] = d("Encoder kind: a transformer encoder.")
    dim: int = d("Model width (the embedding width); heads must divide it.", default=64,
                 ge=1, le=65_536)
    heads: int = d("Attention heads.", default=4, ge=1, le=256)
    layers: int = d("Encoder layers.", default=2, ge=1, le=48)
    feedforward: Optional[int] = d("Width of each layer's feed-forward block; default 4 x dim.",
                                   default=None, ge=1)
    dropout: float = d("Dropout inside the layers.", default=0.1, ge=0, lt=1)
    pool: Literal["mean", "max", "first"] = d("Pooling of the outputs over the items.",
                                              default="mean")


class CnnEncoder(SpecModel):
    """Convolution blocks (conv, batch norm, ReLU, 2x2 max pool), then global pooling or a
    flatten: a small image network trained from scratch."""

    kind: Literal["cnn"] = d("Encoder kind: a small convolutional network.")
    channels: list[Annotated[int, Field(ge=1, le=8192)]] = d(
        "Output channels of each block.", default=[16, 32], min_length=1, max_length=12)
    kernel: int = d("Kernel size (odd; 'same' padding).", default=3, ge=1, le=15)
    pool: Literal["mean", "max", "flatten"] = d(
        "How the last block's feature maps become a vector: mean / max over positions "
        "(global pooling: any image size), or flatten (keeps where things are: small images "
        "such as digits).", default="mean")
    dropout: float = d("Dropout on the pooled output.", default=0.0, ge=0, lt=1)


class ResNetEncoder(SpecModel):
    """A ResNet (torchvision's layout) without its classifier; output width 512.

    Randomly initialised, or from a weights file you provide: a state dict saved from
    torchvision's resnet18/resnet34 (its 'fc.' entries are ignored). Nothing is downloaded.
    """

    kind: Literal["resnet18", "resnet34"] = d("Encoder kind: a ResNet.")
    weights: Optional[str] = d("Path of a .pt/.pth state dict to start from; default: random "
                               "initialisation.", default=None, min_length=1)
    freeze: bool = d("Keep the loaded weights fixed (train only the rest of the model).",
                     default=False)


class LayersEncoder(SpecModel):
    """Your own layer list over the feature's encoded input (its shape: (1,) index for a
    categorical, (max_length,) ids or values for text and sequences, (channels, height,
    width) for an image). It must end in a flat vector."""

    kind: Literal["layers"] = d("Encoder kind: a layer list.")
    layers: list[Layer] = d("Layers in order (the model.layers vocabulary).", min_length=1)


EncoderSpec = Annotated[
    Union[EmbeddingEncoder, BagEncoder, RecurrentEncoder, TransformerEncoderSpec, CnnEncoder,
          ResNetEncoder, LayersEncoder],
    Field(discriminator="kind"),
]

#: Encoder kinds each feature type accepts; the first is the default.
ENCODERS_FOR = {
    "categorical": ("embedding", "layers"),
    "text": ("bag", "lstm", "gru", "transformer", "layers"),
    "sequence": ("bag", "lstm", "gru", "transformer", "layers"),
    "image": ("cnn", "resnet18", "resnet34", "layers"),
}


class AttentionCombiner(SpecModel):
    """Each feature's vector (the numeric features together as one) projected to `width`,
    then self-attention across features; the outputs are flattened (features x width)."""

    kind: Literal["attention"] = d("Combiner kind: attention over features.")
    width: int = d("Width each feature is projected to; heads must divide it.", default=32,
                   ge=1, le=65_536)
    heads: int = d("Attention heads.", default=4, ge=1, le=256)
    layers: int = d("Attention layers.", default=1, ge=1, le=16)
    dropout: float = d("Dropout inside the attention layers.", default=0.0, ge=0, lt=1)


class ConcatCombiner(SpecModel):
    """The features' vectors side by side (numeric features first, in their order)."""

    kind: Literal["concat"] = d("Combiner kind: concatenation.")


def _combiner_shorthand(value):
    return {"kind": value} if isinstance(value, str) else value


CombinerSpec = Annotated[
    Union[ConcatCombiner, AttentionCombiner],
    Field(discriminator="kind"),
    BeforeValidator(_combiner_shorthand, json_schema_input_type=Union[
        ConcatCombiner, AttentionCombiner, Literal["concat", "attention"]]),
]


class CustomModel(SpecModel):
    """An ``nn.Module`` class of your own, imported by path when the run starts."""

    class_: str = d("Import path 'package.module:ClassName'.", alias="class",
                    pattern=r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")
    kwargs: dict[str, Any] = d("Keyword arguments for the constructor.", default={})


class ModelSpec(SpecModel):
    """The network: a list of layers, or a custom class. With typed features (text, images,
    categorical values...), each has an encoder, a combiner joins their vectors and the
    layers are the head over the combined vector."""

    encoders: dict[str, EncoderSpec] = d(
        "Encoder per non-numeric feature, by feature name; a feature left out gets its type's "
        "default (categorical: embedding, text and sequence: bag, image: cnn).", default={})
    combiner: CombinerSpec = section("How the features' vectors are joined: concat or "
                                     "attention.", kind="concat")
    layers: Optional[list[Layer]] = d(
        "Layers in order, compiled to nn.Sequential; each input size is inferred.",
        default=None, min_length=1)
    custom: Optional[CustomModel] = d("Use your own nn.Module class instead of layers.",
                                      default=None)

    @model_validator(mode="after")
    def _exactly_one(self) -> "ModelSpec":
        if (self.layers is None) == (self.custom is None):
            raise ValueError("give either 'layers' or 'custom', not both" if self.layers
                             else "give 'layers' (a list) or 'custom' ({class: 'pkg.mod:Net'})")
        return self
