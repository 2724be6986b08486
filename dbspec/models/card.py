"""A served model's card (``model.json``) and its output as named columns: no torch here, so
``dbspec serve`` can read a model and answer with it without importing torch
(:mod:`dbspec.serving.onnx_model`). :mod:`dbspec.models.served` re-exports both names.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

FORMAT_VERSION = 1
#: The served model exported to ONNX, next to ``model.json`` (:mod:`dbspec.models.onnx_export`),
#: and its graph's input (float32 rows in training column order) and output (predictions).
ONNX_FILE = "model.onnx"
ONNX_INPUT, ONNX_OUTPUT = "x", "prediction"


@dataclass
class ModelCard:
    """What is needed to rebuild a served model, stored as ``model.json``."""

    task: str
    loss: str
    feature_names: list[str]
    out_features: int
    model: dict[str, Any]
    preprocessing: list[dict[str, Any]]
    classes: Optional[list[Any]] = None
    target_mean: float = 0.0
    target_std: float = 1.0
    threshold: float = 0.5
    #: ``{"low": [...], "high": [...]}`` per feature of the training split (raw units);
    #: ``None`` in models logged before dbspec recorded it (:mod:`dbspec.models.inputs`)
    feature_ranges: Optional[dict[str, list]] = None
    #: Typed features (text, images, categorical values...) fitted on the training split, in
    #: order (:mod:`dbspec.models.encoding`): raw rows are encoded with them into the matrix
    #: whose columns ``feature_names`` names. ``None``: every feature is numeric
    inputs: Optional[list[dict[str, Any]]] = None
    format_version: int = FORMAT_VERSION
    extra: dict[str, Any] = field(default_factory=dict)


def has_typed_inputs(inputs: Optional[list[dict[str, Any]]]) -> bool:
    """Whether fitted ``inputs`` (``ModelCard.inputs``) hold a non-numeric feature."""
    return any(entry["type"] != "numeric" for entry in inputs or ())


def takes_raw_columns(card: Any) -> bool:
    """Whether the model encodes typed features (text, images...) itself, from raw named
    columns, rather than taking a matrix of numbers. A card without ``inputs`` (logged before
    typed features, or a stand-in) is numeric."""
    return has_typed_inputs(getattr(card, "inputs", None))


def prediction_columns(card: ModelCard, out) -> dict[str, Any]:
    """The model's raw output as named columns, as every serving path returns them.

    ``prediction`` is the value (regression) or the class label; classifiers add
    ``probability`` (binary, P(second class)) or ``probability_<label>`` per class.
    """
    import numpy as np

    if card.task == "regression":
        return {"prediction": out.astype(np.float64)}
    labels = np.asarray(card.classes)
    if card.task == "binary":
        return {"prediction": labels[(out >= card.threshold).astype(np.intp)],
                "probability": out.astype(np.float64)}
    columns = {"prediction": labels[out.argmax(axis=1)]}
    for j, label in enumerate(card.classes):
        columns[f"probability_{label}"] = out[:, j].astype(np.float64)
    return columns


def probability_meaning(card: ModelCard) -> str:
    """What a binary model's ``probability`` column is the probability of, as printed when it
    is served or scores a table; empty for other tasks."""
    if card.task != "binary" or not card.classes:
        return ""
    return f"probability = P(prediction = {card.classes[-1]!r})"


def training_targets(card: ModelCard, y):
    """Targets (a tensor, as stored) in the form the loss trains on: a regression standardised
    with the card's scale, a column of floats for ``bce``, class indices otherwise."""
    if card.task == "regression":
        return ((y - card.target_mean) / card.target_std).unsqueeze(1)
    return y.float().unsqueeze(1) if card.loss == "bce" else y.long()


def read_card(directory: Path) -> ModelCard:
    """The :class:`ModelCard` in ``directory/model.json``."""
    return ModelCard(**json.loads((Path(directory) / "model.json").read_text()))
