"""Typed input features (``data.features``); their encoders are in ``model.encoders``.

A ``numeric`` feature is one number per row. The other types are fitted on the training split
and encoded into fixed-width numeric columns (an index, token ids, pixels); the fitted
vocabularies travel inside the logged model, which therefore takes raw rows. Each is read by an
encoder whose output a combiner joins before the head; every shape follows from the spec, so
``dbspec validate`` checks them without torch or data.
"""

from typing import Annotated, Any, ClassVar, Literal, Optional, Union

from pydantic import Field, ValidationInfo, field_validator

from dbspec.spec.sections.base import SpecModel, d

FeatureName = Annotated[str, Field(min_length=1)]


class NumericFeature(SpecModel):
    """A number per row (a missing value is NaN; impute it in data.preprocessing)."""

    name: FeatureName = d("Column name.")
    type: Literal["numeric"] = d("Feature type: a number.")


class CategoricalFeature(SpecModel):
    """A value from a set (a city, a product ID, a code), learned as an embedding.

    The vocabulary is the training split's values, most frequent first; values seen in
    training fewer than min_frequency times, values beyond max_vocabulary, missing values and
    values never seen in training all map to one reserved 'unknown' index.
    """

    name: FeatureName = d("Column name (strings, integers or booleans).")
    type: Literal["categorical"] = d("Feature type: one value from a vocabulary.")
    min_frequency: int = d("Training rows a value needs to get its own index.", default=1, ge=1)
    max_vocabulary: Optional[int] = d("Keep at most this many values (the most frequent); "
                                      "default: every value that passes min_frequency.",
                                      default=None, ge=1, le=10_000_000)

    #: What the network's encoder reads (:class:`dbspec.models.typed.FeatureEncoder`)
    input_kind: ClassVar[str] = "index"


class TextFeature(SpecModel):
    """A string split into tokens by a tokenizer fitted on the training split (nothing is
    downloaded), padded or truncated to max_length token ids."""

    name: FeatureName = d("Column name (strings).")
    type: Literal["text"] = d("Feature type: free text.")
    tokenizer: Literal["word", "char", "bpe", "wordpiece", "checkpoint"] = d(
        "word: words and punctuation; char: characters; bpe / wordpiece: a subword model "
        "trained on the training split with the tokenizers package; checkpoint: the "
        "tokenizer of model.pretrained's checkpoint (vocabulary_size, min_frequency and "
        "lowercase are its own).", default="word")
    vocabulary_size: int = d("Largest vocabulary (the most frequent tokens; subword models "
                             "learn up to this many).", default=20_000, ge=10, le=1_000_000)
    min_frequency: int = d("Training occurrences a token needs to enter the vocabulary.",
                           default=1, ge=1)
    max_length: int = d("Tokens per text: longer texts are cut, shorter ones padded.",
                        default=64, ge=1, le=8192)
    lowercase: bool = d("Lowercase before tokenizing.", default=True)

    input_kind: ClassVar[str] = "tokens"


class SequenceFeature(SpecModel):
    """A list per row: numbers (a series of readings) or tokens (a basket of item IDs, a
    click path), padded or truncated to max_length; padding is masked out by the encoder."""

    name: FeatureName = d("Column name (a list column, or a string of space-separated items).")
    type: Literal["sequence"] = d("Feature type: a list of numbers or tokens.")
    values: Literal["numeric", "tokens"] = d("What the list holds.", default="numeric")
    max_length: int = d("Items per row: longer lists keep their first max_length items.",
                        default=32, ge=1, le=8192)
    vocabulary_size: int = d("Largest token vocabulary (values: tokens).", default=20_000,
                             ge=10, le=10_000_000)
    min_frequency: int = d("Training occurrences a token needs (values: tokens).", default=1,
                           ge=1)

    @property
    def input_kind(self) -> str:
        """What the network's encoder reads: token ids, or numbers."""
        return "tokens" if self.values == "tokens" else "values"


class NormalizeArgs(SpecModel):
    """Per-channel mean and standard deviation, on pixels scaled to [0, 1]."""

    mean: list[float] = d("Mean per channel.", min_length=1, max_length=4)
    std: list[Annotated[float, Field(gt=0)]] = d("Standard deviation per channel.",
                                                  min_length=1, max_length=4)


class AugmentSpec(SpecModel):
    """Random changes to training images (never at evaluation or serving), drawn per image
    per epoch."""

    flip: bool = d("Mirror left-right with probability 1/2.", default=False)
    rotate: float = d("Rotate by up to this many degrees either way.", default=0.0, ge=0,
                      le=180)
    translate: float = d("Shift by up to this fraction of the size either way.", default=0.0,
                         ge=0, lt=1)
    scale: float = d("Zoom in or out by up to this fraction.", default=0.0, ge=0, lt=1)
    brightness: float = d("Scale intensities by up to this fraction either way.", default=0.0,
                          ge=0, lt=1)


class ImageFeature(SpecModel):
    """An image per row: encoded bytes (PNG, JPEG...), a file path, or an array of pixels;
    decoded, converted to `channels`, resized to height x width and normalised."""

    name: FeatureName = d("Column name.")
    type: Literal["image"] = d("Feature type: an image.")
    format: Literal["bytes", "path", "array"] = d(
        "bytes: encoded image bytes (a binary column; base64 strings in JSON requests); "
        "path: a file path per row; array: pixel values, nested [h][w] or [h][w][c], or flat.",
        default="bytes")
    root: Optional[str] = d("Directory relative paths are resolved against (format: path); "
                            "default: the working directory.", default=None, min_length=1)
    height: int = d("Height the image is resized to.", ge=1, le=4096)
    width: int = d("Width the image is resized to.", ge=1, le=4096)
    channels: Literal[1, 3] = d("1: grayscale, 3: RGB.", default=3)
    normalize: Union[Literal["unit", "imagenet", "none"], NormalizeArgs] = d(
        "unit: pixels / 255; imagenet: ImageNet's channel mean and deviation (for pretrained "
        "weights); none: raw 0-255 values; or {mean: [...], std: [...]} on [0, 1] pixels.",
        default="unit")
    augment: Optional[AugmentSpec] = d("Training-only random augmentation.", default=None)

    input_kind: ClassVar[str] = "image"

    @field_validator("normalize")
    @classmethod
    def _normalize_fits(cls, norm: Any, info: ValidationInfo) -> Any:
        channels = info.data.get("channels", 3)
        if isinstance(norm, NormalizeArgs):
            if len(norm.mean) != channels or len(norm.std) != channels:
                raise ValueError(f"mean and std need {channels} value(s), one per channel "
                                 f"(channels: {channels})")
        elif norm == "imagenet" and channels != 3:
            raise ValueError("imagenet statistics are for 3 channels; this image has "
                             f"{channels}: use unit or your own mean and std")
        return norm


TypedFeature = Annotated[
    Union[NumericFeature, CategoricalFeature, TextFeature, SequenceFeature, ImageFeature],
    Field(discriminator="type"),
]


#: One entry of data.features: a column name (its type read from the column when the data
#: loads) or a typed feature.
FeatureEntry = Union[FeatureName, TypedFeature]
