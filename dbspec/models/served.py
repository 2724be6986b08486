"""The model as it is logged and served: preprocessing + network + output head, one module.

Raw feature rows in, predictions in the target's units out (classifiers: probabilities); the
evaluate stage scores the test split with the same module. On disk: ``model.json`` (what rebuilds
it), ``weights.pt`` (its state dict) and, when the network exports, ``model.onnx``.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any, Optional

import torch
from torch import nn

from dbspec.data.prepare import FittedStep
from dbspec.models.card import ModelCard, prediction_columns, read_card
from dbspec.models.network import build_network
from dbspec.spec.sections.network import ModelSpec


class FeatureTransform(nn.Module):
    """Fitted preprocessing steps applied to raw rows, in order."""

    def __init__(self, steps: list[FittedStep], width: int):
        super().__init__()
        self.kinds = [s.kind for s in steps]
        for i, step in enumerate(steps):
            every = step.columns == list(range(width))
            self.register_buffer(f"cols{i}", torch.tensor([] if every else step.columns,
                                                          dtype=torch.long))
            for name, values in step.params.items():
                self.register_buffer(f"{name}{i}", torch.tensor(values, dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        owned = False  # x is the caller's until a step makes a new tensor: copy before writing
        for i, kind in enumerate(self.kinds):
            cols = getattr(self, f"cols{i}")
            part = x if cols.numel() == 0 else x[:, cols]
            if kind == "impute":
                part = torch.where(torch.isnan(part), getattr(self, f"fill{i}"), part)
            elif kind == "clip":
                part = torch.minimum(torch.maximum(part, getattr(self, f"low{i}")),
                                     getattr(self, f"high{i}"))
            else:
                part = (part - getattr(self, f"center{i}")) / getattr(self, f"scale{i}")
            if cols.numel() == 0:
                x, owned = part, True
            else:
                if not owned:
                    x, owned = x.clone(), True
                x[:, cols] = part
        return x


class ServedModel(nn.Module):
    """Raw rows -> predictions: regression values, or class probabilities."""

    def __init__(self, card: ModelCard, network: Optional[nn.Module] = None):
        super().__init__()
        self.card = card
        width = len(card.feature_names)
        steps = [FittedStep(**s) for s in card.preprocessing]
        self.transform = FeatureTransform(steps, width)
        self.network = network if network is not None else build_network(
            ModelSpec.model_validate(card.model), width, card.out_features, inputs=card.inputs)
        self.register_buffer("target_mean", torch.tensor(card.target_mean))
        self.register_buffer("target_std", torch.tensor(card.target_std))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.network(self.transform(x)))

    def head(self, out: torch.Tensor) -> torch.Tensor:
        """Network output -> prediction (values, P(class 1), or class probabilities)."""
        if self.card.task == "regression":
            return out[:, 0] * self.target_std + self.target_mean
        if self.card.loss == "bce":
            return torch.sigmoid(out[:, 0])
        probabilities = out.exp() if self.card.loss == "nll" else torch.softmax(out, dim=1)
        return probabilities[:, 1] if self.card.task == "binary" else probabilities

    def predict_frame(self, features) -> "Any":
        """Score a frame (or array, or list of rows) of raw features: a DataFrame of
        :func:`prediction_columns`. Columns are read as
        :func:`~dbspec.models.encoding.model_matrix` reads them.

        Raises:
            InputError: missing columns, positional input of another width, or a value a
                typed feature cannot encode.
        """
        from dbspec.models.encoding import model_matrix

        return self.predict_matrix(model_matrix(self.card, features))

    def predict_matrix(self, x) -> "Any":
        """:meth:`predict_frame` of a writable float32 matrix in training column order."""
        import pandas as pd

        return pd.DataFrame(self.predict_columns(x))

    def predict_columns(self, x) -> dict[str, Any]:
        """:func:`prediction_columns` of a writable float32 matrix in training column order."""
        with torch.inference_mode():
            return prediction_columns(self.card, self(torch.from_numpy(x)).numpy())


def save_served_model(model: ServedModel, directory: Path, *, onnx: bool = False) -> Path:
    """Write ``model.json`` and ``weights.pt`` into ``directory``; with ``onnx`` (a model to
    be logged and served), ``model.onnx`` too when the network exports
    (:func:`dbspec.models.onnx_export.export_onnx`)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "model.json").write_text(json.dumps(asdict(model.card), indent=2, default=str))
    torch.save(model.state_dict(), directory / "weights.pt")
    if onnx:
        from dbspec.models.onnx_export import export_onnx

        export_onnx(model, directory)
    return directory


def load_served_model(directory: Path) -> ServedModel:
    """Rebuild a served model from :func:`save_served_model`'s directory, in eval mode.

    When the directory is the ``artifacts/served`` of a downloaded MLflow model, a custom
    network's module that travelled in the model's ``code/`` is used if it is not installed.
    """
    from dbspec.models.portable import travelled_code

    directory = Path(directory)
    card = read_card(directory)
    with travelled_code(card.model, _model_code_dir(directory)):
        model = ServedModel(card)
    state = torch.load(Path(directory) / "weights.pt", map_location="cpu", weights_only=True)
    model.load_state_dict(state)
    return model.eval()


def _model_code_dir(directory: Path) -> Optional[Path]:
    """The ``code/`` of the MLflow model whose ``artifacts/`` hold ``directory``, if any."""
    root = directory.resolve().parent.parent
    if directory.resolve().parent.name == "artifacts" and (root / "MLmodel").is_file() \
            and (root / "code").is_dir():
        return root / "code"
    return None
