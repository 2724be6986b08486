"""``model``: a closed layer vocabulary (:mod:`.layers`) compiled to ``nn.Sequential``, or a
custom class; typed features' encoders and the combiner that joins them."""

from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, Optional, Union, get_args

from pydantic import Field, ValidationInfo, field_validator, model_validator

from dbspec.spec.sections.base import SpecModel, d, section, shorthand
from dbspec.spec.sections.layers import Layer, LayerSpec
from dbspec.spec.sections.pretrained import PretrainedSpec
from dbspec.spec.shapes import divisors


def _layer_list(entries: list) -> list:
    """Layer entries (a name alone, or ``{name: settings}``) as :class:`LayerSpec` values."""
    return [LayerSpec.model_validate({entry: {}} if isinstance(entry, str) else entry)
            for entry in entries]


def _dropout(p: float) -> list:
    return [{"dropout": {"p": p}}] if p else []


class _Encoder(SpecModel):
    """What every encoder of a typed feature answers, so that :mod:`dbspec.spec.layout` and
    the torch builder ask the encoder and never switch on its kind."""

    if TYPE_CHECKING:
        kind: str

    #: The spec lists the layers itself: errors point into that list, not at the encoder.
    own_layers: ClassVar[bool] = False
    #: Advice added to a shape error when the layers shrink the input to nothing.
    empty_shape_hint: ClassVar[str] = ""

    def fits(self, feature_type: str) -> bool:
        """Whether a feature of ``feature_type`` takes this encoder (:data:`ENCODERS_FOR`)."""
        return self.kind in ENCODERS_FOR[feature_type]

    def layers_over(self, tokens: bool) -> list:
        """The encoder as :class:`LayerSpec` entries over the feature's encoded input, which
        holds indices when ``tokens`` (an embedding takes them) and numbers otherwise."""
        raise NotImplementedError(type(self).__name__)

    def summary(self) -> str:
        """The encoder in a few words, for ``dbspec plan``."""
        return self.kind


class _SequenceEncoder(_Encoder):
    """Embed the tokens (or project numeric items), a core of its own, pool over the items."""

    if TYPE_CHECKING:
        dim: int
        dropout: float
        pool: str

    def _core(self) -> list:
        return _dropout(self.dropout)

    def layers_over(self, tokens: bool) -> list:
        first = {"embedding": {"dim": self.dim}} if tokens else {"linear": {"out": self.dim}}
        return _layer_list([first, *self._core(), {"global_pool": {"op": self.pool}}])

    def summary(self) -> str:
        return f"{self.kind} (dim {self.dim})"


class EmbeddingEncoder(_Encoder):
    """A learned vector per value (categorical features)."""

    kind: Literal["embedding"] = d("Encoder kind: an embedding table.")
    dim: int = d("Width of the embedding.", default=16, ge=1, le=65_536)
    dropout: float = d("Dropout on the embedding.", default=0.0, ge=0, lt=1)

    def layers_over(self, tokens: bool) -> list:
        return _layer_list([{"embedding": {"dim": self.dim}}, *_dropout(self.dropout),
                            "flatten"])

    def summary(self) -> str:
        return f"embedding (dim {self.dim})"


class BagEncoder(_SequenceEncoder):
    """Token embeddings (or a projection of numeric items) pooled over the sequence,
    ignoring padding: order-blind, fast, a strong baseline."""

    kind: Literal["bag"] = d("Encoder kind: embed, then pool over the sequence.")
    dim: int = d("Width of the embedding.", default=64, ge=1, le=65_536)
    pool: Literal["mean", "max", "sum"] = d("Pooling over the non-padding positions.",
                                            default="mean")
    dropout: float = d("Dropout on the embeddings.", default=0.0, ge=0, lt=1)


class RecurrentEncoder(_SequenceEncoder):
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

    def _core(self) -> list:
        return [*_dropout(self.dropout), {self.kind: {
            "hidden": self.hidden, "layers": self.layers, "bidirectional": self.bidirectional,
            "dropout": self.dropout}}]


class TransformerEncoderSpec(_SequenceEncoder):
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

    def _core(self) -> list:  # dropout is inside the transformer's layers
        return [{"transformer_encoder": {"heads": self.heads, "layers": self.layers,
                                         "feedforward": self.feedforward,
                                         "dropout": self.dropout}}]


class CnnEncoder(_Encoder):
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

    empty_shape_hint: ClassVar[str] = "; use fewer blocks in channels or a larger height and width"

    def layers_over(self, tokens: bool) -> list:
        entries: list[Any] = []
        for channels in self.channels:
            entries += [{"conv2d": {"out": channels, "kernel": self.kernel,
                                    "padding": self.kernel // 2}},
                        "batchnorm2d", "relu", {"maxpool2d": {"kernel": 2}}]
        entries.append("flatten" if self.pool == "flatten" else {"global_pool": {"op": self.pool}})
        return _layer_list(entries + _dropout(self.dropout))

    def summary(self) -> str:
        return f"cnn {list(self.channels)}, {self.pool}"


class ResNetEncoder(_Encoder):
    """A ResNet (torchvision's layout) without its classifier; output width 512.

    Randomly initialised, or from a weights file you provide: a state dict saved from
    torchvision's resnet18/resnet34 (its 'fc.' entries are ignored). Nothing is downloaded.
    """

    kind: Literal["resnet18", "resnet34"] = d("Encoder kind: a ResNet.")
    weights: Optional[str] = d("Path of a .pt/.pth state dict to start from; default: random "
                               "initialisation.", default=None, min_length=1)
    freeze: bool = d("Keep the loaded weights fixed (train only the rest of the model).",
                     default=False)

    def layers_over(self, tokens: bool) -> list:
        return _layer_list([{"resnet": {"depth": int(self.kind[len("resnet"):]),
                                        "weights": self.weights, "freeze": self.freeze}}])

    def summary(self) -> str:
        return self.kind + (" from " + self.weights if self.weights else "")


class LayersEncoder(_Encoder):
    """Your own layer list over the feature's encoded input (its shape: (1,) index for a
    categorical, (max_length,) ids or values for text and sequences, (channels, height,
    width) for an image). It must end in a flat vector."""

    kind: Literal["layers"] = d("Encoder kind: a layer list.")
    layers: list[Layer] = d("Layers in order (the model.layers vocabulary).", min_length=1)

    own_layers: ClassVar[bool] = True

    def layers_over(self, tokens: bool) -> list:
        return list(self.layers)

    def summary(self) -> str:
        return f"layers ({len(self.layers)})"


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


def default_encoder(feature_type: str) -> Any:
    """The encoder of a feature of ``feature_type`` that ``model.encoders`` leaves out: the
    first kind :data:`ENCODERS_FOR` lists, with its defaults."""
    kind = ENCODERS_FOR[feature_type][0]
    return next(cls(kind=kind) for cls in get_args(get_args(EncoderSpec)[0])
                if kind in get_args(cls.model_fields["kind"].annotation))


class AttentionCombiner(SpecModel):
    """Each feature's vector (the numeric features together as one) projected to `width`,
    then self-attention across features; the outputs are flattened (features x width)."""

    kind: Literal["attention"] = d("Combiner kind: attention over features.")
    width: int = d("Width each feature is projected to; heads must divide it.", default=32,
                   ge=1, le=65_536)
    heads: int = d("Attention heads.", default=4, ge=1, le=256)
    layers: int = d("Attention layers.", default=1, ge=1, le=16)
    dropout: float = d("Dropout inside the attention layers.", default=0.0, ge=0, lt=1)

    @field_validator("heads")
    @classmethod
    def _divides_width(cls, heads: int, info: ValidationInfo) -> int:
        width = info.data.get("width")
        if width is not None and width % heads:
            raise ValueError(f"{heads} heads do not divide the width {width}; use a head count "
                             f"that divides it ({divisors(width)})")
        return heads

    def output_width(self, numeric: int, widths: list[int]) -> int:
        """Width of the joined vector for ``numeric`` numeric features (one token together)
        and encoder outputs of ``widths``."""
        return (len(widths) + (1 if numeric else 0)) * self.width

    def summary(self) -> str:
        """The combiner in a few words, for ``dbspec plan``."""
        return f"attention (width {self.width}, {self.heads} heads)"


class ConcatCombiner(SpecModel):
    """The features' vectors side by side (numeric features first, in their order)."""

    kind: Literal["concat"] = d("Combiner kind: concatenation.")

    def output_width(self, numeric: int, widths: list[int]) -> int:
        """Width of the joined vector: ``numeric`` numeric features and ``widths``."""
        return numeric + sum(widths)

    def summary(self) -> str:
        """The combiner in a few words, for ``dbspec plan``."""
        return "concat"


_Combiners = Union[ConcatCombiner, AttentionCombiner]
CombinerSpec = Annotated[_Combiners, Field(discriminator="kind"),
                         shorthand(_Combiners, "kind", Literal["concat", "attention"])]


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
    pretrained: Optional[PretrainedSpec] = d(
        "Fine-tune a pretrained Transformers checkpoint instead of layers.", default=None)

    @model_validator(mode="after")
    def _exactly_one(self) -> "ModelSpec":
        given = [name for name in ("layers", "custom", "pretrained")
                 if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(f"give one of 'layers', 'custom' or 'pretrained', not "
                             f"{' and '.join(given)}" if given else
                             "give 'layers' (a list), 'custom' ({class: 'pkg.mod:Net'}) or "
                             "'pretrained' ({checkpoint: path or hub id})")
        return self
