"""The network of a spec with typed features, as shapes: each feature's encoded input, its
encoder compiled to a layer list, the combiner and the head. Without torch and without data.

``dbspec validate`` checks these shapes; the torch builder (:mod:`dbspec.models.typed`)
builds exactly these layer lists, so what validates is what runs.

Encoded inputs per sample (what :mod:`dbspec.models.encoding` writes into the feature matrix):

- categorical: ``(1,)``, the value's index (0: unknown or missing);
- text, and sequences of tokens: ``(max_length,)`` token ids (0: padding);
- sequences of numbers: ``(max_length, 1)``, padding masked;
- image: ``(channels, height, width)``, normalised pixels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

from dbspec.spec.sections.features import (CategoricalFeature, ImageFeature, NumericFeature,
                                           SequenceFeature, TextFeature)
from dbspec.spec.sections.network import ENCODERS_FOR, ModelSpec, default_encoder
from dbspec.spec.shapes import Shape, ShapeError, format_shape, infer_shapes


@dataclass(frozen=True)
class EncodedInput:
    """One non-numeric feature as the network sees it.

    Attributes:
        shape: Its encoded input per sample.
        tokens: Whether the input holds indices (an embedding's input; 0 is padding).
        encoder: The encoder spec (the type's default when the spec gives none).
        layers: The encoder as a layer list.
    """

    name: str
    type: str
    shape: Shape
    tokens: bool
    encoder: Any
    layers: list

    @property
    def width(self) -> int:
        """Matrix columns it takes."""
        return math.prod(self.shape)


class LayoutError(Exception):
    """A part of the typed network cannot take its input; ``path`` locates it in the spec."""

    def __init__(self, path: tuple, message: str):
        super().__init__(message)
        self.path, self.message = path, message


def is_encoded(feature: Any) -> bool:
    """Whether a ``data.features`` entry is a typed, non-numeric feature."""
    return not isinstance(feature, (str, NumericFeature))


def has_typed_features(features: Optional[list]) -> bool:
    """Whether ``data.features`` holds a typed, non-numeric feature (text, images...)."""
    return any(is_encoded(f) for f in features or ())


def input_shape(feature: Any) -> Shape:
    """The encoded input of one sample of ``feature``."""
    if isinstance(feature, CategoricalFeature):
        return (1,)
    if isinstance(feature, TextFeature):
        return (feature.max_length,)
    if isinstance(feature, SequenceFeature):
        return (feature.max_length,) if feature.values == "tokens" else (feature.max_length, 1)
    if isinstance(feature, ImageFeature):
        return (feature.channels, feature.height, feature.width)
    raise TypeError(f"no encoded shape for {type(feature).__name__}")


def holds_tokens(feature: Any) -> bool:
    return feature.input_kind in ("index", "tokens")


def encoder_of(feature: Any, model: ModelSpec) -> Any:
    """The encoder the spec gives ``feature``, or its type's default."""
    given = model.encoders.get(feature.name)
    return given if given is not None else default_encoder(feature.type)


def encoded_inputs(features: list, model: ModelSpec) -> list[EncodedInput]:
    """The non-numeric features of ``features`` (``data.features`` entries), in order, with
    their encoders compiled.

    Raises:
        LayoutError: an encoder kind the feature's type does not take.
    """
    out = []
    for feature in filter(is_encoded, features):
        encoder = encoder_of(feature, model)
        if not encoder.fits(feature.type):
            raise LayoutError(("model", "encoders", feature.name, "kind"),
                              f"a {feature.type} feature takes the encoders "
                              f"{', '.join(ENCODERS_FOR[feature.type])}, not {encoder.kind}")
        tokens = holds_tokens(feature)
        out.append(EncodedInput(feature.name, feature.type, input_shape(feature), tokens,
                                encoder, encoder.layers_over(tokens)))
    return out


def encoder_width(encoded: EncodedInput) -> int:
    """The width of the vector ``encoded``'s encoder outputs.

    Raises:
        LayoutError: a layer of the encoder cannot take its input, or it does not end flat.
    """
    where = ("model", "encoders", encoded.name)
    own = encoded.encoder.own_layers
    for index, layer in enumerate(encoded.layers if own else ()):
        if layer.key == "embedding" and (index > 0 or not encoded.tokens):
            raise LayoutError(where + ("layers", index, "embedding"),
                              "an embedding takes indices: only as the first layer of a "
                              "categorical, text or token-sequence feature's encoder"
                              + ("" if encoded.tokens else f"; '{encoded.name}' holds numbers"
                                 " (use a linear layer to project them)"))
    try:
        shapes = infer_shapes(encoded.layers, encoded.shape)
    except ShapeError as exc:
        if own:
            raise LayoutError(where + ("layers", exc.index), exc.message) from None
        layer = encoded.layers[exc.index].key
        hint = encoded.encoder.empty_shape_hint if "empty shape" in exc.message else ""
        raise LayoutError(where + (("heads",) if "heads do not divide" in exc.message else ()),
                          f"the {encoded.encoder.kind} encoder of the {encoded.type} "
                          f"feature '{encoded.name}' (input {format_shape(encoded.shape)}) "
                          f"fails at its {layer} layer: {exc.message}{hint}") from None
    if len(shapes[-1]) != 1:
        raise LayoutError(where + (("layers", len(encoded.layers) - 1) if own else ()),
                          f"the encoder ends with shape {format_shape(shapes[-1])}; it must "
                          "end in a vector: add '- global_pool' or '- flatten'")
    return shapes[-1][0]


def combined_width(numeric: int, widths: list[int], combiner: Any) -> int:
    """Width of the combiner's output for ``numeric`` numeric features and encoder outputs of
    ``widths``."""
    return combiner.output_width(numeric, widths)


def head_input(features: list, model: ModelSpec, numeric: Optional[int]) -> Optional[int]:
    """The width the head (``model.layers``) takes, checking every encoder on the way; None
    when the numeric width is unknown and the combiner needs it.

    Raises:
        LayoutError: the first encoder or combiner setting that cannot work.
    """
    widths = [encoder_width(encoded) for encoded in encoded_inputs(features, model)]
    if numeric is None:
        return None
    if not widths and not numeric:
        raise LayoutError(("data", "features"), "no feature to train on")
    return combined_width(numeric, widths, model.combiner)


def describe_inputs(spec: Any) -> list[str]:
    """What ``dbspec plan`` says about the features of a spec with typed features: each one's
    type, encoding and encoder with its output width, and how the rest are typed. Empty for a
    spec whose features are all numeric."""
    data, model = spec.data, spec.model
    features = data.features or []
    if model.pretrained is not None:  # the checkpoint reads its own tokens: no encoders
        return [f"model: {model.pretrained.summary()}; it reads "
                + ", ".join(f"{f.name} ({_encoding(f)})" for f in features if is_encoded(f))]
    if not has_typed_features(features):
        return []
    rows = []
    numeric = 0
    for feature in features:
        if not is_encoded(feature):
            numeric += 1
            how = "numeric" if not isinstance(feature, str) else "numeric (a plain name: its " \
                "column must hold numbers)"
            rows.append((feature if isinstance(feature, str) else feature.name, how, "-",
                         "1, to the combiner as is"))
            continue
        encoded = next(e for e in encoded_inputs([feature], model))
        try:
            width = str(encoder_width(encoded))
        except LayoutError as exc:
            width = f"error: {exc.message}"
        rows.append((feature.name, _encoding(feature), encoded.encoder.summary()
                     + ("" if feature.name in model.encoders else " (default)"), width))
    try:
        head = head_input(features, model, numeric)
    except LayoutError:
        head = None
    lines = [f"inputs: {len(features)} feature{'s' * (len(features) != 1)}, combined by "
             f"{model.combiner.summary()}"
             + (f"; the head (model.layers) takes {head}" if head is not None else "")]
    header = ("feature", "type and encoding", "encoder", "output width")
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(3)]
    for row in [header] + rows:
        lines.append("  " + "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:3]))
                     + "  " + row[3])
    return lines


def _encoding(feature: Any) -> str:
    if isinstance(feature, CategoricalFeature):
        cut = f", min_frequency {feature.min_frequency}" if feature.min_frequency > 1 else ""
        return f"categorical (vocabulary from the training split{cut})"
    if isinstance(feature, TextFeature):
        return f"text ({feature.tokenizer} tokenizer, {feature.max_length} tokens)"
    if isinstance(feature, SequenceFeature):
        return f"sequence of {feature.values} ({feature.max_length} items)"
    norm = feature.normalize if isinstance(feature.normalize, str) else "mean/std"
    return (f"image {feature.channels}x{feature.height}x{feature.width} ({feature.format}, "
            f"{norm}" + (", augmented in training" if feature.augment else "") + ")")
