"""Text and sequences for typed features: tokenizing, the ids of tokens and items, padding.

Used by :mod:`dbspec.models.encoding`, which fits the vocabularies and subword models on the
training rows and encodes whole columns; numpy, pandas and (for ``bpe`` / ``wordpiece``
text) the ``tokenizers`` package, imported only when a subword model is trained or loaded.
"""

from __future__ import annotations

import re
from itertools import chain
from typing import Any, Callable

import numpy as np
import pandas as pd

from dbspec.data.sources import DataError
from dbspec.models.images import describe, is_missing
from dbspec.models.inputs import InputError

_WORD = re.compile(r"\w+|[^\w\s]")  # words and single punctuation marks
_ITEMS = re.compile(r"[\s,]+")  # items of a sequence given as one string
SUBWORD = ("bpe", "wordpiece")
_PAD, _UNKNOWN = "[PAD]", "[UNK]"  # ids 0 and 1 of every token vocabulary


def train_subword(texts: list[str], spec: dict, where: str) -> Any:
    if not texts:
        raise DataError(f"{where}: no text in the training rows")
    try:
        from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    except ImportError:
        raise DataError(f"{where}: the {spec['tokenizer']} tokenizer needs the tokenizers "
                        "package: pip install tokenizers") from None
    options = {"vocab_size": spec["vocabulary_size"], "min_frequency": spec["min_frequency"],
               "special_tokens": [_PAD, _UNKNOWN], "show_progress": False}
    model, trainer = {"bpe": (models.BPE, trainers.BpeTrainer),
                      "wordpiece": (models.WordPiece, trainers.WordPieceTrainer)}[spec["tokenizer"]]
    tokenizer = Tokenizer(model(unk_token=_UNKNOWN))
    if spec["lowercase"]:
        tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()  # words and punctuation, as 'word'
    tokenizer.train_from_iterator(texts, trainer=trainer(**options))
    return tokenizer


def text_splitter(spec: dict) -> Callable[[str], list]:
    split = _WORD.findall if spec["tokenizer"] == "word" else list
    return (lambda text: split(text.lower())) if spec["lowercase"] else split


def texts(values: list, name: str) -> list:
    """The rows as text, "" for a missing one.

    Raises:
        InputError: a value that is not a string."""
    out = []
    for row, value in enumerate(values):
        if isinstance(value, str):
            out.append(value)
        elif is_missing(value):
            out.append("")
        else:
            raise InputError(f"column '{name}', row {row}: expected text (a string), got "
                             f"{describe(value)}")
    return out


def text_ids(values: pd.Series, name: str, split: Callable, ids: dict,
              length: int) -> np.ndarray:
    get = ids.get
    rows = [[get(token, 1) for token in split(text)[:length]]
            for text in texts(values.tolist(), name)]
    return _padded(rows, length, 0.0)


def subword_ids(values: pd.Series, name: str, tokenizer: Any) -> np.ndarray:
    # encode_batch_fast (tokenizers 0.21+) leaves out the character offsets, unused here
    batch = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)
    encoded = batch(texts(values.tolist(), name))
    return np.array([e.ids for e in encoded], dtype=np.float32).reshape(
        len(encoded), tokenizer.padding["length"])


def loaded_tokenizer(entry: dict) -> Any:
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise InputError(f"the text feature '{entry['name']}' needs the tokenizers package: "
                         "pip install tokenizers") from None
    tokenizer = Tokenizer.from_str(entry["tokenizer"])
    length = entry["spec"]["max_length"]
    tokenizer.enable_truncation(max_length=length)
    # a checkpoint's tokenizer pads with its own token (models.pretrained.checkpoint_input)
    tokenizer.enable_padding(pad_id=entry.get("pad_id", 0), pad_token=entry.get("pad_token", _PAD),
                             length=length)
    return tokenizer


def sequences(values: list, name: str) -> list[list]:
    """Each row's items: a list, tuple or 1-D array, or a string split on spaces and commas;
    a missing row has none.

    Raises:
        InputError: a row that is neither."""
    out = []
    for row, value in enumerate(values):
        if isinstance(value, str):
            out.append([item for item in _ITEMS.split(value) if item])
        elif isinstance(value, (list, tuple)) or (isinstance(value, np.ndarray) and
                                                  value.ndim == 1):
            out.append(value)
        elif is_missing(value):
            out.append([])
        else:
            raise InputError(f"column '{name}', row {row}: expected a list (or a string of "
                             f"items separated by spaces or commas), got {describe(value)}")
    return out


def item_ids(values: pd.Series, name: str, ids: dict, length: int) -> np.ndarray:
    rows = [[ids.get(key(item), 1) for item in items[:length]]
            for items in sequences(values.tolist(), name)]
    return _padded(rows, length, 0.0)


def numeric_sequences(values: pd.Series, name: str, length: int) -> np.ndarray:
    rows = []
    for row, items in enumerate(sequences(values.tolist(), name)):
        try:
            numbers = np.asarray(items[:length], dtype=np.float64)
        except (TypeError, ValueError):
            raise InputError(f"column '{name}', row {row}: the sequence holds an item that is "
                             "not a number") from None
        if not np.isfinite(numbers).all():
            raise InputError(f"column '{name}', row {row}: a missing (NaN) or infinite value "
                             "inside the sequence; NaN only pads sequences: fill or drop it")
        rows.append(numbers)
    return _padded(rows, length, np.nan)


def _padded(rows: list, length: int, fill: float) -> np.ndarray:
    """Rows of at most ``length`` values as a (rows, length) matrix, the rest ``fill``."""
    out = np.full((len(rows), length), fill, dtype=np.float32)
    sizes = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    total = int(sizes.sum())
    if total:
        flat = (np.concatenate(rows).astype(np.float32) if isinstance(rows[0], np.ndarray)
                else np.fromiter(chain.from_iterable(rows), dtype=np.float32, count=total))
        starts = np.repeat(np.cumsum(sizes) - sizes, sizes)
        out[np.repeat(np.arange(len(rows)), sizes), np.arange(total) - starts] = flat
    return out


def key(value: Any) -> Any:
    if isinstance(value, str):
        return value
    if isinstance(value, (bool, np.bool_)):
        return "True" if value else "False"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        if value != value:
            return None
        return str(int(value)) if float(value).is_integer() else str(float(value))
    return None if is_missing(value) else str(value)
