"""Typed features as one float32 matrix: fitted on the training split, applied to any rows.

Each feature becomes fixed-width columns (widths: :mod:`dbspec.spec.layout`): a number (NaN when
missing); a categorical's index in the training vocabulary (0: unknown); ``max_length`` token ids
of a text or token sequence (0: padding, 1: unknown); ``max_length`` values of a numeric
sequence (NaN-padded); an image's normalised pixels, channel first (:mod:`.images`).

:func:`fit_inputs` returns the fitted vocabularies and tokenizers as JSON-able dicts ("inputs")
that travel inside the logged model; the served model encodes raw rows with
:class:`InputEncoder` over them, so training and serving run one encoding. Pillow and
``tokenizers`` are imported when an image or a subword text is met.
"""

from __future__ import annotations

import threading
from collections import Counter, OrderedDict
from functools import partial
from itertools import chain
from typing import Any, Callable

import numpy as np
import pandas as pd

from dbspec.data.sources import DataError
from dbspec.errors import did_you_mean
from dbspec.models.card import takes_raw_columns
from dbspec.models.images import describe, encode_images, is_missing
from dbspec.models.inputs import InputError
from dbspec.models import tokens
from dbspec.spec.sections.features import NumericFeature

NUMERIC_KINDS = "biuf"  # NumPy dtype kinds read as numbers: booleans, integers, floats


# --- fitting --------------------------------------------------------------------------------

def fit_inputs(features: list, train: pd.DataFrame, pretrained: Any = None) -> list[dict]:
    """Fit each feature on the training rows: one JSON-able dict per feature, in order.

    Each holds ``name``, ``type``, ``spec`` (as JSON), ``columns`` (its matrix column names),
    ``indices`` (an embedding table's size, reserved indices included) and the fitted state:
    ``vocabulary``, ``tokenizer`` (bpe and wordpiece: the ``tokenizers`` JSON) and ``raw_dtype``
    (the MLflow type of the training column, for :func:`signature_types`). A text feature
    with ``tokenizer: checkpoint`` takes ``pretrained``'s (``model.pretrained``) tokenizer and
    model config (:func:`dbspec.models.pretrained.checkpoint_input`).

    Raises:
        DataError: ``data.features.<name>: ...``: no usable value in the training rows, or a
            value of the wrong kind.
    """
    labels = {str(c): c for c in train.columns}
    fitted = []
    for feature in features:
        if isinstance(feature, str):
            feature = NumericFeature(name=feature, type="numeric")
        if feature.name not in labels:
            raise DataError(f"data.features.{feature.name}: no such column in the training "
                            f"rows{did_you_mean(feature.name, labels)}")
        try:
            fitted.append(_fit(feature, _series(train[labels[feature.name]]), pretrained))
        except InputError as exc:
            raise DataError(f"data.features.{feature.name}: {exc} (in the training rows)") \
                from None
    return fitted


def _fit(feature: Any, column: pd.Series, pretrained: Any = None) -> dict:
    spec = feature.model_dump(mode="json")
    entry: dict[str, Any] = {"name": feature.name, "type": feature.type, "spec": spec}
    width = {"text": spec.get("max_length"), "sequence": spec.get("max_length"),
             "image": spec.get("channels", 0) * spec.get("height", 0) * spec.get("width", 0)}
    entry["columns"] = ([f"{feature.name}[{i}]" for i in range(width[feature.type])]
                        if feature.type in width else [feature.name])
    where = f"data.features.{feature.name}"
    if feature.type == "categorical":
        counts = pd.Series(_keys(column)).value_counts()
        entry["vocabulary"] = _vocabulary(counts, spec["min_frequency"], spec["max_vocabulary"])
        if not entry["vocabulary"]:
            raise DataError(f"{where}: no value occurs {spec['min_frequency']} time(s) in the "
                            f"{len(column)} training rows; lower min_frequency")
        entry["indices"] = len(entry["vocabulary"]) + 1
        entry["raw_dtype"] = {"b": "boolean", "i": "long", "u": "long", "f": "double"}.get(
            column.dtype.kind, "string")
    elif feature.type == "text" and spec["tokenizer"] == "checkpoint":
        if pretrained is None:
            raise DataError(f"{where}: tokenizer: checkpoint needs model.pretrained")
        from dbspec.models.pretrained import checkpoint_input

        entry.update(checkpoint_input(pretrained, spec["max_length"]))
    elif feature.type == "image" and pretrained is not None:
        from dbspec.models.pretrained import image_checkpoint_input

        entry.update(image_checkpoint_input(pretrained, spec))
    elif feature.type == "text" and spec["tokenizer"] in tokens.SUBWORD:
        texts = [t for t in tokens.texts(column.tolist(), feature.name) if t]
        tokenizer = tokens.train_subword(texts, spec, where)
        entry["tokenizer"] = tokenizer.to_str()
        entry["indices"] = tokenizer.get_vocab_size()
    elif feature.type == "text" or (feature.type == "sequence" and spec["values"] == "tokens"):
        if feature.type == "text":
            split = tokens.text_splitter(spec)
            rows = [split(t) for t in tokens.texts(column.tolist(), feature.name) if t]
        else:
            rows = [[key for key in map(tokens.key, items) if key is not None]
                    for items in tokens.sequences(column.tolist(), feature.name)]
        counts = pd.Series(Counter(chain.from_iterable(rows)), dtype="int64")
        entry["vocabulary"] = _vocabulary(counts, spec["min_frequency"],
                                          spec["vocabulary_size"] - 2)
        if not entry["vocabulary"]:
            raise DataError(f"{where}: no " + (
                ("text" if feature.type == "text" else "items") + " in the training rows"
                if counts.empty else f"token occurs {spec['min_frequency']} time(s) in the "
                "training rows; lower min_frequency"))
        entry["indices"] = len(entry["vocabulary"]) + 2
    if feature.type == "sequence":
        entry["raw_dtype"] = _sequence_dtype(column, spec["values"])
    return entry


def _vocabulary(counts: pd.Series, min_frequency: int, most: Any) -> list[str]:
    """Keys counted at least ``min_frequency`` times, most frequent first, ties by key."""
    kept = counts[counts >= min_frequency]
    order = pd.DataFrame({"key": kept.index.astype(str), "n": kept.to_numpy()}).sort_values(
        ["n", "key"], ascending=[False, True], kind="stable")
    return order["key"].tolist()[:most]


def _sequence_dtype(column: pd.Series, values: str) -> str:
    sample = column.dropna().head(100).tolist()
    if sample and all(isinstance(v, str) for v in sample):
        return "string"  # items in one string per row
    if values == "numeric":
        return "array<double>"
    items = [item for row in sample for item in row]
    whole = items and all(isinstance(v, (int, np.integer)) and not isinstance(v, bool)
                          for v in items)
    return "array<long>" if whole else "array<string>"


# --- encoding -------------------------------------------------------------------------------

class InputEncoder:
    """Encodes raw columns into the feature matrix of ``inputs`` (what :func:`fit_inputs`
    returned, or its JSON round trip); vocabularies and tokenizers are compiled once, here."""

    def __init__(self, inputs: list[dict]):
        self.inputs = inputs
        self.names = raw_columns(inputs)
        self.widths = [len(entry["columns"]) for entry in inputs]
        self._encoders = [_compiled(entry) for entry in inputs]

    def encode(self, columns: Any) -> np.ndarray:
        """``columns`` as a float32 matrix (rows, sum of widths), inputs in order.

        Args:
            columns: A pandas DataFrame, a pyarrow Table, or a mapping of each input's name to
                its raw values (a Series, a NumPy array, a pyarrow Array, a list).

        Raises:
            InputError: a missing column or a value the feature cannot take, by column and row.
        """
        column = _column_getter(columns, self.names)
        raw = [_series(column(name)) for name in self.names]
        rows = {len(values) for values in raw}
        if len(rows) > 1:
            raise InputError("the input columns have different lengths: " + ", ".join(
                f"{name} {len(values)}" for name, values in zip(self.names, raw)))
        out = np.empty((rows.pop() if rows else 0, sum(self.widths)), dtype=np.float32)
        start = 0
        for encode, name, width, values in zip(self._encoders, self.names, self.widths, raw):
            out[:, start:start + width] = encode(values, name)
            start += width
        return out


_CACHE: OrderedDict[int, InputEncoder] = OrderedDict()
_CACHED = 8
_CACHE_LOCK = threading.Lock()  # a scoring server may answer requests on several threads


def encode_columns(inputs: list[dict], columns: Any) -> np.ndarray:
    """``columns`` encoded as :meth:`InputEncoder.encode` does; the encoder of the last few
    ``inputs`` lists is kept (by identity: a list changed in place is not noticed)."""
    encoder = _CACHE.get(id(inputs))
    if encoder is None or encoder.inputs is not inputs:  # held there, so an id is not reused
        encoder = InputEncoder(inputs)
        with _CACHE_LOCK:
            _CACHE[id(inputs)] = encoder
            while len(_CACHE) > _CACHED:
                _CACHE.popitem(last=False)
    return encoder.encode(columns)


def _column_getter(columns: Any, names: list[str]) -> Callable[[str], Any]:
    """A function from an input's name to its values in ``columns``.

    Raises (when called):
        InputError: no such column, naming the columns the model takes."""
    if isinstance(columns, pd.DataFrame):
        labels = {str(c): c for c in columns.columns}
        available, get = list(labels), lambda name: columns[labels[name]]
    elif hasattr(columns, "column_names"):  # a pyarrow Table
        available, get = list(columns.column_names), columns.column
    else:
        available, get = [str(c) for c in columns], columns.__getitem__

    present = set(available)

    def column(name: str) -> Any:
        if name not in present:
            raise InputError(f"the input has no column '{name}'"
                             f"{did_you_mean(name, available)}: the model takes the columns "
                             f"{listing(names)}")
        values = get(name)
        if isinstance(values, pd.DataFrame):
            raise InputError(f"the input has {values.shape[1]} columns named '{name}'")
        return values
    return column


def _series(values: Any) -> pd.Series:
    """Raw values as a Series: NumPy rows of a 2-D array and pyarrow lists become objects."""
    if isinstance(values, pd.Series):
        return values
    if isinstance(values, np.ndarray) and values.ndim > 1:
        return pd.Series(list(values), dtype=object)
    if hasattr(values, "to_pandas"):  # a pyarrow Array or ChunkedArray
        return values.to_pandas()
    return pd.Series(values if isinstance(values, np.ndarray) else list(values))


def _compiled(entry: dict) -> Callable[[pd.Series, str], np.ndarray]:
    """The encoding of one input: ``(values, column name) -> (rows, width)``."""
    kind, spec = entry["type"], entry["spec"]
    if kind == "numeric":
        return _numbers
    if kind == "categorical":
        return partial(_indices, index=pd.Index(entry["vocabulary"], dtype=object))
    if kind == "image":
        return lambda values, name: encode_images(values.tolist(), spec, name)
    if kind == "sequence" and spec["values"] == "numeric":
        return partial(tokens.numeric_sequences, length=spec["max_length"])
    if kind == "text" and spec["tokenizer"] in tokens.SUBWORD + ("checkpoint",):
        return partial(tokens.subword_ids, tokenizer=tokens.loaded_tokenizer(entry))
    ids = {token: i for i, token in enumerate(entry["vocabulary"], start=2)}
    if kind == "text":
        return partial(tokens.text_ids, split=tokens.text_splitter(spec), ids=ids,
                       length=spec["max_length"])
    return partial(tokens.item_ids, ids=ids, length=spec["max_length"])


def _numbers(values: pd.Series, name: str) -> np.ndarray:
    try:
        return values.to_numpy(dtype=np.float32, na_value=np.nan).reshape(-1, 1)
    except (TypeError, ValueError):
        pass  # objects: one at a time, to accept numbers as text and to name a bad row
    numbers = np.empty((len(values), 1), dtype=np.float32)
    for row, value in enumerate(values.tolist()):
        try:
            numbers[row] = np.nan if is_missing(value) else float(value)
        except (TypeError, ValueError):
            raise InputError(f"column '{name}', row {row}: expected a number, got "
                             f"{describe(value)}") from None
    return numbers


def _indices(values: pd.Series, name: str, index: pd.Index) -> np.ndarray:
    return (index.get_indexer(_keys(values)) + 1).astype(np.float32).reshape(-1, 1)


def _keys(values: pd.Series) -> Any:
    """Categorical keys, alike whatever the column's dtype: strings as they are, whole numbers
    as integers ('5' for 5 and 5.0: pandas makes an int column with NaN a float one),
    booleans as 'True' / 'False'; None for a missing value."""
    kind = values.dtype.kind
    if kind in NUMERIC_KINDS:
        missing = values.isna().to_numpy()
        if kind == "b":
            keys = np.where(values.to_numpy(dtype=bool, na_value=False), "True", "False")
        elif kind in "iu":
            keys = values.to_numpy(dtype=np.int64, na_value=0).astype(str)
        else:
            x = values.to_numpy(dtype=np.float64, na_value=np.nan)
            whole = np.isfinite(x) & (np.floor(x) == x) & (np.abs(x) < 2.0 ** 63)
            keys = np.empty(len(x), dtype=object)
            keys[whole] = x[whole].astype(np.int64).astype(str)
            for i in np.flatnonzero(~whole & ~missing):
                keys[i] = str(float(x[i]))
        keys = keys.astype(object)
        keys[missing] = None
        return keys
    if isinstance(values.dtype, pd.StringDtype) or \
            pd.api.types.infer_dtype(values, skipna=True) == "string":
        return values  # strings, and NaN or None, which no vocabulary holds
    return np.array([tokens.key(v) for v in values.tolist()] or [], dtype=object)


def listing(names: list[str], most: int = 20) -> str:
    """The first ``most`` names, comma-separated, and how many there are in all."""
    return ", ".join(names[:most]) + (f", ... ({len(names)} in all)" if len(names) > most
                                      else "")


# --- what the inputs need -------------------------------------------------------------------

def matrix_names(inputs: list[dict]) -> list[str]:
    """Every matrix column name, inputs in order."""
    return [column for entry in inputs for column in entry["columns"]]


def raw_columns(inputs: list[dict]) -> list[str]:
    """The input columns the model takes, one per feature."""
    return [entry["name"] for entry in inputs]


def required_packages(inputs: list[dict]) -> list[str]:
    """Distributions scoring needs beyond NumPy and pandas: pillow, tokenizers."""
    needed = []
    if any(entry["type"] == "image" for entry in inputs):
        needed.append("pillow")
    if any(entry["type"] == "text" and entry["spec"]["tokenizer"] in tokens.SUBWORD
           for entry in inputs):
        needed.append("tokenizers")
    if any("config" in entry for entry in inputs):  # a pretrained checkpoint's network
        needed += ["tokenizers", "transformers"]
    return needed


def signature_types(inputs: list[dict]) -> list[tuple[str, str]]:
    """``(column, MLflow type)`` per raw column, for the model signature."""
    types = []
    for entry in inputs:
        kind, spec = entry["type"], entry["spec"]
        if kind == "categorical":
            mlflow_type = entry.get("raw_dtype", "string")
        elif kind == "sequence":
            mlflow_type = entry.get("raw_dtype") or (
                "array<double>" if spec["values"] == "numeric" else "array<string>")
        elif kind == "image":
            mlflow_type = {"bytes": "binary", "path": "string"}.get(spec["format"],
                                                                    "array<double>")
        else:
            mlflow_type = {"numeric": "double", "text": "string"}[kind]
        types.append((entry["name"], mlflow_type))
    return types


def model_matrix(card: Any, features: Any) -> np.ndarray:
    """:func:`dbspec.models.inputs.feature_matrix` for any model: one with typed features
    (``card.inputs``) encodes its raw named columns with its fitted vocabularies and tokenizers.

    Raises:
        InputError: missing columns, or a value the model cannot encode (the column and the
            row named).
    """
    if takes_raw_columns(card):
        return encode_columns(card.inputs, features)
    from dbspec.models.inputs import feature_matrix

    return feature_matrix(card.feature_names, features)
