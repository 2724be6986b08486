"""A served model scored with numpy alone, for ``dbspec serve``.

Importing torch costs ``dbspec serve`` 1.1-1.4 s of its start and about 190 MB of memory, for
a network that is often a few dense layers: the diabetes MLP is 385 numbers. When a served
model is made only of the layers below, the server scores it with numpy; anything else (a
custom class, convolutions, normalisation layers, a weights file this reader does not follow)
is scored by the torch module as before (:func:`load_numpy_model` returns None).

Layers: ``linear``, ``relu``, ``leaky_relu``, ``tanh``, ``sigmoid``, ``identity``, ``dropout``
(nothing at inference) and ``flatten`` (nothing on rows). Preprocessing and output heads are
those of :class:`~dbspec.models.served.ServedModel`, step for step in float32.

Equivalence: elementwise float32 steps (preprocessing, ReLU, the regression head) give the
same bits as torch; a matrix product or an ``exp``/``tanh`` may differ in the last place,
because numpy and torch sum and round in their own order. torch itself differs that much
from one batch composition to another (a row scored alone or inside 64 rows: measured up to
2e-7 relative on the diabetes MLP), and the server batches requests, so this is the
precision the endpoint already had. The tests compare both on every layer and head.

The weights are read from ``weights.pt`` without torch: torch's zip format holds a pickle of
the state dict whose tensors point at raw little-endian storages in ``data/``.
:class:`_StateDictUnpickler` accepts only the names such a pickle uses, so nothing else in the
file can run.
"""

from __future__ import annotations

import pickle
import zipfile
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

from dbspec.models.card import ModelCard, read_card, takes_raw_columns

#: Layers (spec vocabulary) this module scores; anything else stays with torch.
LAYERS = ("linear", "relu", "leaky_relu", "tanh", "sigmoid", "identity", "dropout", "flatten")
_STORAGES = {"FloatStorage": np.float32, "DoubleStorage": np.float64,
             "HalfStorage": np.float16, "LongStorage": np.int64, "IntStorage": np.int32,
             "ShortStorage": np.int16, "CharStorage": np.int8, "ByteStorage": np.uint8,
             "BoolStorage": np.bool_}


class Unsupported(Exception):
    """The model or its weights file is outside what this module scores (torch will)."""


class NumpyServedModel:
    """Raw rows -> predictions, as :class:`~dbspec.models.served.ServedModel` computes them.

    Attributes:
        card: The model's card.
    """

    runtime = "numpy"

    def __init__(self, card: ModelCard, state: dict[str, np.ndarray]):
        self.card = card
        self._steps = _steps(card, state)
        self._layers = _layers(card, state)
        self._mean = np.float32(state["target_mean"])
        self._std = np.float32(state["target_std"])

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """Score a float32 matrix of raw rows in feature order; float32 predictions."""
        with np.errstate(over="ignore"):  # exp overflowing to inf gives 0 or 1, as in torch
            for kind, columns, params in self._steps:
                x = _preprocess(x, kind, columns, params)
            for layer in self._layers:
                x = layer(x)
            return self._head(x)

    def _head(self, out: np.ndarray) -> np.ndarray:
        card = self.card
        if card.task == "regression":
            return out[:, 0] * self._std + self._mean
        if card.loss == "bce":
            return _sigmoid(out[:, 0])
        if card.loss == "nll":
            probabilities = np.exp(out)
        else:
            shifted = np.exp(out - out.max(axis=1, keepdims=True))
            probabilities = shifted / shifted.sum(axis=1, keepdims=True)
        return probabilities[:, 1] if card.task == "binary" else probabilities


def load_numpy_model(directory: Path) -> Optional[NumpyServedModel]:
    """The model in ``directory`` (``model.json``, ``weights.pt``) for numpy, or None when it
    is outside what this module scores."""
    try:
        card = read_card(directory)
        if card.model.get("custom") or card.model.get("encoders") or takes_raw_columns(card):
            return None  # a custom class, or typed features' encoders: torch scores them
        model = NumpyServedModel(card, read_state_dict(Path(directory) / "weights.pt"))
        # weights that fit the card, found now rather than as a 500 on every request
        model(np.zeros((2, len(card.feature_names)), dtype=np.float32))
        return model
    except Unsupported:
        return None
    except (KeyError, ValueError, IndexError, TypeError):
        return None  # a card and weights that disagree: torch's loader says what is wrong


def read_state_dict(path: Path) -> dict[str, np.ndarray]:
    """A state dict saved by ``torch.save`` (zip format) as numpy arrays.

    Raises:
        Unsupported: not a zip-format file, big-endian storages, or a pickle that names
            anything but tensors of the storages above.
    """
    try:
        archive = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as exc:
        raise Unsupported(f"{path}: {exc}") from None
    with archive:
        pickles = [n for n in archive.namelist() if n.endswith("/data.pkl")]
        if len(pickles) != 1:
            raise Unsupported(f"{path}: not one data.pkl")
        prefix = pickles[0][:-len("data.pkl")]
        names = set(archive.namelist())
        if f"{prefix}byteorder" in names and archive.read(f"{prefix}byteorder") != b"little":
            raise Unsupported(f"{path}: big-endian storages")
        unpickler = _StateDictUnpickler(archive, prefix, archive.open(pickles[0]))
        try:
            state = unpickler.load()
        except Exception as exc:  # whatever the file holds, torch is the fallback
            raise Unsupported(f"{path}: {exc}") from None
    if not isinstance(state, dict) or not all(isinstance(v, np.ndarray) for v in state.values()):
        raise Unsupported(f"{path}: not a state dict of tensors")
    return dict(state)


class _StateDictUnpickler(pickle.Unpickler):
    """Unpickles a state dict only: the names below and storages from the archive."""

    def __init__(self, archive: zipfile.ZipFile, prefix: str, stream):
        super().__init__(stream)
        self._archive = archive
        self._prefix = prefix

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("collections", "OrderedDict"):
            return OrderedDict
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild_tensor
        if module == "torch" and name in _STORAGES:
            return _STORAGES[name]
        raise pickle.UnpicklingError(f"{module}.{name} is not part of a state dict")

    def persistent_load(self, pid: Any) -> np.ndarray:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise pickle.UnpicklingError(f"unexpected persistent id {pid!r}")
        _, dtype, key, _location, count = pid
        if not (isinstance(dtype, type) and issubclass(dtype, np.generic)):
            raise pickle.UnpicklingError(f"unexpected storage type {dtype!r}")
        data = self._archive.read(f"{self._prefix}data/{key}")
        return np.frombuffer(data, dtype=np.dtype(dtype).newbyteorder("<"), count=count)


def _rebuild_tensor(storage: np.ndarray, offset: int, size: tuple, stride: tuple,
                    _requires_grad: bool, _hooks: Any, _metadata: Any = None) -> np.ndarray:
    itemsize = storage.dtype.itemsize
    if offset < 0 or any(n < 0 for n in size) or any(s < 0 for s in stride):
        raise ValueError("a tensor with a negative offset, size or stride")
    if size and offset + sum((n - 1) * s for n, s in zip(size, stride)) >= len(storage):
        raise ValueError("a tensor reaches past its storage")
    view = np.lib.stride_tricks.as_strided(storage[offset:], shape=tuple(size),
                                           strides=tuple(s * itemsize for s in stride))
    return np.array(view, dtype=storage.dtype.newbyteorder("="))  # a native, writable copy


def _steps(card: ModelCard, state: dict[str, np.ndarray]) -> list[tuple]:
    """(kind, columns or None for all, {param: float32 array}) per preprocessing step."""
    steps = []
    for i, step in enumerate(card.preprocessing):
        columns = _get(state, f"transform.cols{i}")
        params = {name: _get(state, f"transform.{name}{i}").astype(np.float32)
                  for name in step["params"]}
        steps.append((step["kind"], columns.astype(np.intp) if columns.size else None, params))
    return steps


def _preprocess(x: np.ndarray, kind: str, columns: Optional[np.ndarray],
                params: dict[str, np.ndarray]) -> np.ndarray:
    # as FeatureTransform.forward: a copy of the columns, changed, written back
    part = x if columns is None else x[:, columns]
    if kind == "impute":
        part = np.where(np.isnan(part), params["fill"], part)
    elif kind == "clip":
        part = np.minimum(np.maximum(part, params["low"]), params["high"])
    else:
        part = (part - params["center"]) / params["scale"]
    if columns is None:
        return part
    x = x.copy()
    x[:, columns] = part
    return x


def _layers(card: ModelCard, state: dict[str, np.ndarray]) -> list[Callable]:
    layers = []
    for index, entry in enumerate(card.model.get("layers") or []):
        name, args = _entry(entry)
        if name == "linear":
            weight = _get(state, f"network.{index}.weight")
            bias = state.get(f"network.{index}.bias")
            if weight.dtype != np.float32 or weight.ndim != 2 or (
                    bias is not None and bias.shape != weight.shape[:1]):
                raise Unsupported(f"layer {index}: unexpected weights")
            layers.append(_linear(np.ascontiguousarray(weight.T), bias))
        elif name == "relu":
            layers.append(lambda x: np.maximum(x, np.float32(0)))
        elif name == "leaky_relu":
            slope = np.float32(args.get("negative_slope", 0.01))
            layers.append(lambda x, slope=slope: np.where(x > 0, x, x * slope))
        elif name == "tanh":
            layers.append(np.tanh)
        elif name == "sigmoid":
            layers.append(_sigmoid)
        elif name not in ("identity", "dropout", "flatten"):
            raise Unsupported(f"layer {index}: {name}")
    expected = {f"network.{i}.{p}" for i, entry in enumerate(card.model.get("layers") or [])
                if _entry(entry)[0] == "linear" for p in ("weight", "bias")}
    extra = {k for k in state if k.startswith("network.")} - expected
    if extra:
        raise Unsupported(f"weights no layer here uses: {sorted(extra)}")
    return layers


def _linear(weight_t: np.ndarray, bias: Optional[np.ndarray]) -> Callable:
    if bias is None:
        return lambda x: x @ weight_t
    return lambda x: x @ weight_t + bias


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return np.float32(1) / (np.float32(1) + np.exp(-x))


def _entry(entry: Any) -> tuple[str, dict]:
    if isinstance(entry, str):
        return entry, {}
    if isinstance(entry, dict) and len(entry) == 1:
        name, args = next(iter(entry.items()))
        return name, args or {}
    raise Unsupported(f"layer entry {entry!r}")


def _get(state: dict[str, np.ndarray], key: str) -> np.ndarray:
    try:
        return state[key]
    except KeyError:
        raise Unsupported(f"no {key} in the weights") from None
