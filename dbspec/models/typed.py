"""The torch modules of typed features: masked sequence layers, feature encoders, combiners and
:class:`TypedNetwork`, the network over one feature matrix.

One float32 matrix carries every feature (:mod:`dbspec.models.encoding` writes it), so serving,
training and the loaders handle one tensor. Sequence layers take ``(x, mask)``, ``mask`` (B, L)
True at real items (none: every item is read); :class:`MaskedSequential` hands it on until a
layer changes the sequence axis. Padding is trailing: recurrent layers read each row up to its
last real item. :func:`dbspec.models.network.build_network` builds these from the spec.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from dbspec.models.images import IMAGENET_MEAN, IMAGENET_STD
from dbspec.models.unpacked_rnn import exporting, run_unpacked
from dbspec.spec.sections.features import AugmentSpec, ImageFeature


class TokenEmbedding(nn.Embedding):
    """``nn.Embedding`` over indices stored as floats (the feature matrix is float32); index 0
    (padding, or a categorical's unknown value) is a fixed zero vector."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.long())


def _lengths(mask: torch.Tensor) -> torch.Tensor:
    """Items up to and including each row's last real one; at least 1, so a row of padding
    alone still has one (padding) item to read."""
    positions = torch.arange(1, mask.shape[1] + 1, device=mask.device)
    return (mask.long() * positions).amax(dim=1).clamp(min=1)


def _key_padding(mask: torch.Tensor) -> torch.Tensor:
    """Attention's key padding mask (True: ignore). A row of padding alone would attend to
    nothing and give NaN: its first item is left visible."""
    ignore = ~mask
    first = torch.arange(mask.shape[1], device=mask.device) == 0  # no branch on the data: the
    return ignore & ~(ignore.all(dim=1, keepdim=True) & first)  # ONNX export traces this


class Recurrent(nn.Module):
    """LSTM or GRU over (B, L, E) -> (B, L, hidden x directions); with a mask, each row is
    read up to its last real item (packed), the rest of the output is zeros."""

    takes_mask = True

    def __init__(self, kind: str, width: int, args):
        super().__init__()
        cls = nn.LSTM if kind == "lstm" else nn.GRU
        self.rnn = cls(width, args.hidden, num_layers=args.layers, batch_first=True,
                       bidirectional=args.bidirectional,
                       dropout=args.dropout if args.layers > 1 else 0.0)

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        if mask is None:
            return self.rnn(x)[0]
        if exporting():  # packed shapes depend on the data: not traceable
            return run_unpacked(self.rnn, x, _lengths(mask))
        packed = pack_padded_sequence(x, _lengths(mask).cpu(), batch_first=True,
                                      enforce_sorted=False)
        return pad_packed_sequence(self.rnn(packed)[0], batch_first=True,
                                   total_length=x.shape[1])[0]


class SequenceTransformer(nn.Module):
    """Learned positions (optional), then transformer encoder layers over (B, L, E)."""

    takes_mask = True

    def __init__(self, length: int, width: int, args):
        super().__init__()
        self.positions = None
        if args.positions:
            self.positions = nn.Parameter(torch.empty(1, length, width))
            nn.init.normal_(self.positions, std=0.02)
        layer = nn.TransformerEncoderLayer(width, args.heads,
                                           dim_feedforward=args.feedforward or 4 * width,
                                           dropout=args.dropout, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, args.layers, enable_nested_tensor=False)

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        if self.positions is not None:
            x = x + self.positions[:, : x.shape[1]]
        return self.encoder(x, src_key_padding_mask=None if mask is None else _key_padding(mask))


class SelfAttention(nn.Module):
    """Multi-head self-attention over (B, L, E), padding keys ignored."""

    takes_mask = True

    def __init__(self, width: int, args):
        super().__init__()
        self.attention = nn.MultiheadAttention(width, args.heads, dropout=args.dropout,
                                               batch_first=True)

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        padding = None if mask is None else _key_padding(mask)
        return self.attention(x, x, x, key_padding_mask=padding, need_weights=False)[0]


class GlobalPool(nn.Module):
    """(B, L, E) -> (B, E) over the real items (mean, max, sum, first, last), or (B, C, H, W)
    -> (B, C) over the positions. A row of padding alone pools to zeros."""

    takes_mask = True

    def __init__(self, op: str):
        super().__init__()
        self.op = op

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        if x.dim() == 4:
            x, mask = x.flatten(2).transpose(1, 2), None
        if mask is None:
            mask = torch.ones(x.shape[:2], dtype=torch.bool, device=x.device)
        if self.op in ("first", "last"):
            index = (mask.long().argmax(dim=1) if self.op == "first"
                     else _lengths(mask) - 1)
            return x[torch.arange(x.shape[0], device=x.device), index]
        keep = mask.unsqueeze(-1)
        if self.op == "max":
            pooled = x.masked_fill(~keep, float("-inf")).amax(dim=1)
            return pooled.masked_fill(~keep.any(dim=1), 0.0)
        total = x.masked_fill(~keep, 0).sum(dim=1)
        if self.op == "sum":
            return total
        return total / keep.sum(dim=1).clamp(min=1).to(x.dtype)

    def extra_repr(self) -> str:
        return f"op={self.op}"


class MaskedSequential(nn.Sequential):
    """Layers in order, called as ``(x, mask)``: the mask goes to the layers that take it and
    is dropped after the first layer that changes the sequence axis."""

    def __init__(self, *layers: nn.Module, keeps_mask: Optional[list[bool]] = None):
        super().__init__(*layers)
        self.keeps_mask = list(keeps_mask) if keeps_mask is not None else [True] * len(self)
        # decided once: a per-step getattr on every layer cost measurable time in small models
        self._steps = [(layer, bool(getattr(layer, "takes_mask", False)), keeps)
                       for layer, keeps in zip(self, self.keeps_mask)]

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        for layer, takes, keeps in self._steps:
            x = layer(x, mask) if takes else layer(x)
            if not keeps:
                mask = None
        return x


class ImageAugment(nn.Module):
    """Random flips, rotations, shifts, zooms and brightness changes, drawn per image; only in
    training mode (identity in eval mode, so evaluation and serving see the images as given).

    The geometry is one affine resampling per image (bilinear; what comes in from outside the
    image is 0, the mean colour of normalised pixels). Brightness scales the raw intensities,
    so the normalisation is undone and redone around it.
    """

    def __init__(self, augment: AugmentSpec, image: ImageFeature):
        super().__init__()
        self.augment = augment
        mean, std = _normalization(image)
        self.register_buffer("mean", torch.tensor(mean).view(1, -1, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std).view(1, -1, 1, 1), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return x
        a = self.augment
        if a.flip or a.rotate or a.translate or a.scale:
            grid = F.affine_grid(self._affine(x), list(x.shape), align_corners=False)
            x = F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros",
                              align_corners=False)
        if a.brightness:
            factor = _uniform(x.shape[0], a.brightness, x).view(-1, 1, 1, 1) + 1
            # raw = x * std + mean; (raw * factor - mean) / std, in normalised units
            x = x * factor + self.mean * (factor - 1) / self.std
        return x

    def _affine(self, x: torch.Tensor) -> torch.Tensor:
        """Per image, the map from output to input positions in affine_grid's [-1, 1] units."""
        a, batch = self.augment, x.shape[0]
        height, width = x.shape[-2:]
        angle = _uniform(batch, math.radians(a.rotate), x)
        zoom = 1 + _uniform(batch, a.scale, x)
        mirror = torch.ones(batch, dtype=x.dtype, device=x.device)
        if a.flip:
            mirror = torch.where(torch.rand(batch, device=x.device) < 0.5, -mirror, mirror)
        cos, sin = torch.cos(angle) / zoom, torch.sin(angle) / zoom
        # a rotation in pixels is not one in [-1, 1] units unless the image is square
        return torch.stack([
            torch.stack([cos * mirror, -sin * height / width,
                         2 * _uniform(batch, a.translate, x)], dim=1),
            torch.stack([sin * mirror * width / height, cos,
                         2 * _uniform(batch, a.translate, x)], dim=1)], dim=1)

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.augment.model_dump().items() if v)


def _uniform(n: int, bound: float, like: torch.Tensor) -> torch.Tensor:
    """``n`` values drawn uniformly from [-bound, bound]."""
    return (torch.rand(n, dtype=like.dtype, device=like.device) * 2 - 1) * bound


def _normalization(image: ImageFeature) -> tuple[list[float], list[float]]:
    """Per-channel (mean, std) that map raw pixel values to the encoded ones."""
    channels, norm = image.channels, image.normalize
    if norm == "none":
        return [0.0] * channels, [1.0] * channels
    if norm == "unit":
        return [0.0] * channels, [255.0] * channels
    mean, std = ((IMAGENET_MEAN, IMAGENET_STD) if norm == "imagenet" else (norm.mean, norm.std))
    return [m * 255.0 for m in mean], [s * 255.0 for s in std]


def _encoder_input(kind: str, part: torch.Tensor,
                   shape: tuple[int, ...]) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """A feature's columns as its encoder's input and padding mask: ``index`` (a categorical's
    (B, 1) indices; 0, unknown, is a value), ``image`` (B, C, H, W), ``tokens`` ((B, L) ids, mask
    ``ids != 0``) or ``values`` ((B, L, 1) numbers, mask ``~isnan``, NaN read as 0)."""
    if kind == "index":
        return part.reshape(part.shape[0], 1), None
    if kind == "image":
        return part.reshape(part.shape[0], *shape), None
    if kind == "tokens":
        x = part.reshape(part.shape[0], part.shape[1])  # explicit length: reshape(0, -1) fails
        return x, x != 0
    x = part.reshape(part.shape[0], part.shape[1], 1)
    mask = ~torch.isnan(x[..., 0])
    return x.masked_fill(~mask.unsqueeze(-1), 0.0), mask


_INPUT_KINDS = ("index", "tokens", "values", "image")


class FeatureEncoder(nn.Module):
    """One non-numeric feature: its matrix columns -> its input and mask (``kind``, as
    :func:`_encoder_input` reads it) -> its encoder's layers -> one vector per row."""

    def __init__(self, name: str, kind: str, shape: tuple[int, ...], layers: nn.Module,
                 augment: Optional[ImageAugment] = None):
        super().__init__()
        if kind not in _INPUT_KINDS:
            raise ValueError(f"unknown input kind {kind!r}")
        self.name, self.kind, self.shape = name, kind, tuple(shape)
        self.augment = augment
        self.layers = layers
        steps = list(layers) if isinstance(layers, nn.Sequential) else [layers]
        # a categorical's embedding (+ dropout) + flatten is one lookup: taken directly, four
        # module calls per step are skipped (benchmarks/feature_types.py measured 0.92 of a
        # hand-written model's speed through them); a tuple, so they stay registered once
        self._lookup = (steps[0], [step for step in steps[1:] if isinstance(step, nn.Dropout)]) \
            if kind == "index" and isinstance(steps[0], TokenEmbedding) and all(
                isinstance(step, (nn.Flatten, nn.Dropout)) for step in steps[1:]) else None

    def forward(self, part: torch.Tensor) -> torch.Tensor:
        """``part``: the feature's columns (B, width); a sequence's may be of any length."""
        if self._lookup is not None:  # the same values as the layers' (B, 1, dim) -> (B, dim)
            embedding, dropouts = self._lookup
            out = F.embedding(part[:, 0].long(), embedding.weight, embedding.padding_idx)
            for dropout in dropouts:
                out = dropout(out)
            return out
        x, mask = _encoder_input(self.kind, part, self.shape)
        if self.augment is not None:  # an image's, in training
            x = self.augment(x)
        return self.layers(x, mask)

    def extra_repr(self) -> str:
        return f"name={self.name!r}, kind={self.kind}, shape={self.shape}"


class ConcatCombiner(nn.Module):
    """The vectors side by side, in the order given (numeric first, then features)."""

    @classmethod
    def from_spec(cls, spec: Any, widths: list[int]) -> "ConcatCombiner":
        return cls()

    def forward(self, vectors: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat(vectors, dim=1)


class AttentionCombiner(nn.Module):
    """Each vector projected to ``width`` (one token per feature; the numeric features'
    vector is one token), then transformer encoder layers across the tokens (self-attention
    with residuals, layer norm and a 4 x width feed-forward block: nn.TransformerEncoderLayer),
    flattened to (B, tokens * width).

    No position embedding: each token has a projection of its own, which tells features apart.
    """

    def __init__(self, widths: list[int], width: int, heads: int, layers: int, dropout: float):
        super().__init__()
        self.projections = nn.ModuleList(nn.Linear(w, width) for w in widths)
        layer = nn.TransformerEncoderLayer(width, heads, dim_feedforward=4 * width,
                                           dropout=dropout, batch_first=True)
        self.attention = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)

    @classmethod
    def from_spec(cls, spec: Any, widths: list[int]) -> "AttentionCombiner":
        """The combiner of ``model.combiner`` over vectors of ``widths``."""
        return cls(widths, spec.width, spec.heads, spec.layers, spec.dropout)

    def forward(self, vectors: list[torch.Tensor]) -> torch.Tensor:
        tokens = torch.stack([p(v) for p, v in zip(self.projections, vectors)], dim=1)
        return self.attention(tokens).flatten(1)


#: The torch module of each ``model.combiner`` kind
COMBINERS: dict[str, type[ConcatCombiner] | type[AttentionCombiner]] = {
    "concat": ConcatCombiner, "attention": AttentionCombiner}


class TypedNetwork(nn.Module):
    """Feature matrix (B, columns) -> output (B, out_features): the numeric features' columns
    (maybe none) and each encoder's ``columns[i] = (start, stop)`` encoded, combined (the list
    [numeric vector (if any), encoder outputs...]) and passed through the ``head`` layers."""

    def __init__(self, numeric_columns: list[int], encoders: list[FeatureEncoder],
                 columns: list[tuple[int, int]], combiner: nn.Module, head: nn.Module):
        super().__init__()
        self.register_buffer("numeric_columns", torch.tensor(numeric_columns, dtype=torch.long),
                             persistent=False)
        first = numeric_columns[0] if numeric_columns else 0
        contiguous = list(numeric_columns) == list(range(first, first + len(numeric_columns)))
        self._numeric_slice = (first, first + len(numeric_columns)) if contiguous else None
        self.encoders = nn.ModuleList(encoders)
        self.columns = [tuple(c) for c in columns]
        self.combiner = combiner
        self.head = head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == 0 and not self.training:
            # no rows (a batch engine learning the output columns, an empty request): packed
            # sequences refuse empty batches, so one row of zeros goes through and none back
            return self.forward(x.new_zeros((1, x.shape[1])))[:0]
        if not len(self.numeric_columns):
            vectors = []
        elif self._numeric_slice is not None:  # a view: no gather when they sit side by side
            vectors = [x[:, self._numeric_slice[0]:self._numeric_slice[1]]]
        else:
            vectors = [x.index_select(1, self.numeric_columns)]
        vectors += [encoder(x[:, start:stop])
                    for encoder, (start, stop) in zip(self.encoders, self.columns)]
        return self.head(self.combiner(vectors))

    def encoded(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """Each encoder's output vectors by feature name (for inspection and tests)."""
        return {encoder.name: encoder(x[:, start:stop])
                for encoder, (start, stop) in zip(self.encoders, self.columns)}
