"""Images as pixels: decode, convert, resize and normalise one column of an image feature.

Training and serving both encode through :func:`encode_images` (one decoder, one bilinear
resize, one normalisation). A value is encoded bytes (base64 text in JSON requests), a file
path, or an array of 0-255 pixels, as the feature's ``format`` says. Pillow is imported when the
first image is decoded.
"""

from __future__ import annotations

import base64
import binascii
import io
import os
from typing import Any

import numpy as np

from dbspec.models.inputs import InputError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
#: ITU-R 601-2 luma, the weights Pillow's convert("L") uses, for arrays given in colour
_LUMA = np.array([0.299, 0.587, 0.114], dtype=np.float32)


def _pillow() -> Any:
    try:
        from PIL import Image
    except ImportError:  # pragma: no cover - a dependency of every install that trains images
        raise InputError("image features need Pillow: pip install pillow") from None
    return Image


def encode_images(values: list, spec: dict, column: str) -> np.ndarray:
    """Encode one image column (``values`` in the feature's ``format``; ``spec``: the image
    feature as JSON): ``(rows, channels * height * width)`` float32, each row the image's
    channel-first pixels, normalised as ``spec["normalize"]`` says.

    Raises:
        InputError: a missing, undecodable or misshapen image, naming the column and row.
    """
    channels, height, width = spec["channels"], spec["height"], spec["width"]
    out = np.empty((len(values), channels, height * width), dtype=np.float32)
    read = {"bytes": _from_bytes, "path": _from_path, "array": _from_array}[spec["format"]]
    for row, value in enumerate(values):
        where = f"column '{column}', row {row}"
        if is_missing(value):
            raise InputError(f"{where}: no image (an image model cannot score a row "
                             "without one)")
        pixels = read(value, spec, where)  # (height, width, channels)
        out[row] = pixels.reshape(height * width, channels).T
    return _normalized(out, spec["normalize"]).reshape(len(values), -1)


def is_missing(value: Any) -> bool:
    """Whether one raw value is missing: None, NaN, pandas' NA or NaT."""
    return value is None or (isinstance(value, (float, np.floating)) and value != value) or \
        type(value).__name__ in ("NAType", "NaTType")


def _normalized(x: np.ndarray, normalize: Any) -> np.ndarray:
    """``x`` (rows, channels, pixels) of 0-255 values, normalised in place."""
    if normalize == "none":
        return x
    x /= 255.0
    if normalize == "unit":
        return x
    mean, std = ((IMAGENET_MEAN, IMAGENET_STD) if normalize == "imagenet"
                 else (normalize["mean"], normalize["std"]))
    x -= np.asarray(mean, dtype=np.float32)[:, None]
    x /= np.asarray(std, dtype=np.float32)[:, None]
    return x


def _from_bytes(value: Any, spec: dict, where: str) -> np.ndarray:
    if isinstance(value, str):  # JSON has no bytes: requests send base64 text
        if value.startswith("data:") and "," in value:  # a data URL, as browsers write them
            value = value.split(",", 1)[1]
        try:
            value = base64.b64decode("".join(value.split()), validate=True)
        except (binascii.Error, ValueError):
            raise InputError(f"{where}: not base64-encoded image bytes") from None
    elif isinstance(value, (bytearray, memoryview)):
        value = bytes(value)
    elif not isinstance(value, bytes):
        raise InputError(f"{where}: expected image bytes (or base64 text), got "
                         f"{describe(value)}")
    elif _base64_text(value):
        # MLflow's scoring server decodes base64 for a binary column in dataframe_split and
        # dataframe_records, but hands the text over as bytes for 'inputs' records
        value = base64.b64decode(value, validate=True)
    return _decoded(io.BytesIO(value), spec, where)


#: The first bytes of the image formats Pillow reads (a file is never base64 text with these)
_MAGIC = (b"\x89PNG", b"\xff\xd8", b"GIF8", b"BM", b"II*\x00", b"MM\x00*", b"RIFF")


def _base64_text(value: bytes) -> bool:
    """Whether ``value`` is base64 text rather than image bytes: strict base64 alphabet and
    length, and not the start of an image file."""
    if len(value) < 8 or len(value) % 4 or value.startswith(_MAGIC):
        return False
    try:
        base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return False
    return True


def _from_path(value: Any, spec: dict, where: str) -> np.ndarray:
    if not isinstance(value, (str, os.PathLike)):
        raise InputError(f"{where}: expected an image file path, got {describe(value)}")
    path = os.fspath(value)
    if spec.get("root") and not os.path.isabs(path):
        path = os.path.join(spec["root"], path)
    if not os.path.isfile(path):
        raise InputError(f"{where}: no image file at '{path}'")
    return _decoded(path, spec, where)


def _decoded(source: Any, spec: dict, where: str) -> np.ndarray:
    """The image in ``source`` (a file path or object) as (height, width, channels) float32."""
    image_module = _pillow()
    from PIL import UnidentifiedImageError

    try:
        with image_module.open(source) as image:
            image = image.convert("L" if spec["channels"] == 1 else "RGB")
            size = (spec["width"], spec["height"])
            if image.size != size:
                image = image.resize(size, image_module.Resampling.BILINEAR)
            pixels = np.asarray(image, dtype=np.float32)
    except UnidentifiedImageError:  # its message names a BytesIO object's address
        raise InputError(f"{where}: not a decodable image (cannot identify image file)") \
            from None
    except image_module.DecompressionBombError as exc:
        raise InputError(f"{where}: {exc}") from None
    except (OSError, ValueError, SyntaxError) as exc:  # truncated or corrupt data
        raise InputError(f"{where}: not a decodable image ({exc})") from None
    return pixels.reshape(spec["height"], spec["width"], spec["channels"])


def _from_array(value: Any, spec: dict, where: str) -> np.ndarray:
    """Pixels given as numbers: nested [h][w] or [h][w][c], or flat in (H, W, C) order."""
    channels, height, width = spec["channels"], spec["height"], spec["width"]
    try:
        pixels = _dense(value)
    except (TypeError, ValueError):
        raise InputError(f"{where}: expected an array of pixel values (0-255), nested "
                         "[height][width] or [height][width][channels], or flat") from None
    if pixels.ndim == 1:
        if pixels.size != channels * height * width:
            raise InputError(f"{where}: a flat array of {pixels.size} values; the model takes "
                             f"{channels * height * width} ({height} x {width} x {channels}), "
                             "or a nested [height][width][channels] array")
        return pixels.reshape(height, width, channels)
    if pixels.ndim == 2:
        pixels = pixels[:, :, None]
    if pixels.ndim != 3 or pixels.shape[2] not in (1, 2, 3, 4) or 0 in pixels.shape:
        raise InputError(f"{where}: an array of shape {pixels.shape} is not an image: send "
                         "[height][width] or [height][width][channels] with 1 to 4 channels")
    if not np.isfinite(pixels).all():
        raise InputError(f"{where}: the pixel array holds NaN or infinite values")
    pixels = _with_channels(pixels, channels)
    if pixels.shape[:2] != (height, width):
        pixels = _resized(pixels, height, width)
    return pixels


def _dense(value: Any) -> np.ndarray:
    """Nested pixels as one float32 array (pyarrow lists arrive as arrays of arrays)."""
    if isinstance(value, np.ndarray) and value.dtype == object:
        return np.stack([_dense(part) for part in value]) if len(value) else \
            np.zeros(0, dtype=np.float32)
    return np.asarray(value, dtype=np.float32)


def _with_channels(pixels: np.ndarray, channels: int) -> np.ndarray:
    """(h, w, c) pixels as (h, w, channels): alpha dropped, grey repeated or colour to luma."""
    colour = pixels[:, :, :3] if pixels.shape[2] >= 3 else pixels[:, :, :1]
    if channels == 3:
        return colour if colour.shape[2] == 3 else np.repeat(colour, 3, axis=2)
    return colour if colour.shape[2] == 1 else (colour @ _LUMA)[:, :, None]


def _resized(pixels: np.ndarray, height: int, width: int) -> np.ndarray:
    """Bilinear resize of float pixels, one channel at a time (Pillow's 32-bit float mode)."""
    image_module = _pillow()
    planes = [np.asarray(image_module.fromarray(np.ascontiguousarray(pixels[:, :, c]))
                         .resize((width, height), image_module.Resampling.BILINEAR))
              for c in range(pixels.shape[2])]
    return np.stack(planes, axis=2).astype(np.float32, copy=False)


def describe(value: Any) -> str:
    """A raw value for a message: its type and its (shortened) repr."""
    shown = repr(value)
    return f"{type(value).__name__} {shown if len(shown) <= 40 else shown[:37] + '...'}"
