"""``model``: a closed layer vocabulary compiled to ``nn.Sequential``, or a custom class."""

from typing import Annotated, Any, ClassVar, Literal, Optional, Union

from pydantic import Field, create_model, model_validator


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


class CustomModel(SpecModel):
    """An ``nn.Module`` class of your own, imported by path when the run starts."""

    class_: str = d("Import path 'package.module:ClassName'.", alias="class",
                    pattern=r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")
    kwargs: dict[str, Any] = d("Keyword arguments for the constructor.", default={})


class ModelSpec(SpecModel):
    """The network: a list of layers, or a custom class."""

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
