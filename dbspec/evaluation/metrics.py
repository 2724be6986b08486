"""Metrics by name, computed from targets and the served model's predictions."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np


def regression_metrics(y_true: np.ndarray, y_pred: np.ndarray,
                       names: list[str]) -> dict[str, float]:
    """rmse, mae, mse, r2 and mape (as a fraction) of the requested ``names``."""
    from sklearn import metrics as m

    y_true, y_pred = np.asarray(y_true, dtype=np.float64), np.asarray(y_pred, dtype=np.float64)
    found = {"rmse": lambda: np.sqrt(m.mean_squared_error(y_true, y_pred)),
             "mse": lambda: m.mean_squared_error(y_true, y_pred),
             "mae": lambda: m.mean_absolute_error(y_true, y_pred),
             "r2": lambda: m.r2_score(y_true, y_pred) if len(y_true) > 1 else float("nan"),
             "mape": lambda: m.mean_absolute_percentage_error(y_true, y_pred)}
    return {name: float(found[name]()) for name in names if name in found}


def classification_metrics(y_true: np.ndarray, probabilities: np.ndarray, names: list[str], *,
                           binary: bool, threshold: float = 0.5) -> dict[str, float]:
    """accuracy, precision, recall, f1 (binary, or macro-averaged), roc_auc and log_loss.

    Args:
        y_true: Encoded class indices.
        probabilities: P(class 1) for binary, (rows, classes) otherwise.
    """
    from sklearn import metrics as m

    y_true = np.asarray(y_true)
    probabilities = np.asarray(probabilities, dtype=np.float64)
    full = np.column_stack([1 - probabilities, probabilities]) if binary else probabilities
    y_pred = predicted_labels("binary" if binary else "multiclass", probabilities, threshold)
    average = {"average": "binary" if binary else "macro", "zero_division": 0}
    found = {"accuracy": lambda: m.accuracy_score(y_true, y_pred),
             "precision": lambda: m.precision_score(y_true, y_pred, **average),
             "recall": lambda: m.recall_score(y_true, y_pred, **average),
             "f1": lambda: m.f1_score(y_true, y_pred, **average),
             "log_loss": lambda: m.log_loss(y_true, _probabilities(full),
                                            labels=list(range(full.shape[1]))),
             "roc_auc": lambda: _roc_auc(y_true, probabilities if binary
                                         else _probabilities(full), binary)}
    return {name: float(found[name]()) for name in names if name in found}


def _probabilities(full: np.ndarray) -> np.ndarray:
    """Rows clipped away from 0 (log_loss is infinite there) and scaled to sum to one again:
    a float32 softmax sums to 1 ± 1e-7, and clipping moves it further, which sklearn warns
    about on every multiclass evaluation."""
    clipped = np.clip(full, 1e-7, 1.0)
    return clipped / clipped.sum(axis=1, keepdims=True)


def _roc_auc(y_true, scores, binary: bool) -> float:
    from sklearn import metrics as m

    if len(np.unique(y_true)) < 2:
        return float("nan")  # undefined with one class present (tiny smoke splits)
    if binary:
        return float(m.roc_auc_score(y_true, scores))
    return float(m.roc_auc_score(y_true, scores, multi_class="ovr",
                                 labels=list(range(scores.shape[1]))))


def confusion(y_true: np.ndarray, y_pred: np.ndarray, classes: int) -> list[list[int]]:
    """Confusion matrix rows = true class, columns = predicted class."""
    from sklearn.metrics import confusion_matrix

    return confusion_matrix(y_true, y_pred, labels=list(range(classes))).tolist()


def task_metrics(task: str, y_true: np.ndarray, predictions: np.ndarray, names: list[str], *,
                 threshold: float = 0.5) -> dict[str, float]:
    """Regression or classification metrics, as the task is."""
    if task == "regression":
        return regression_metrics(y_true, predictions, names)
    return classification_metrics(y_true, predictions, names, binary=task == "binary",
                                  threshold=threshold)


def predicted_labels(task: str, predictions: np.ndarray, threshold: float = 0.5) -> Optional[Any]:
    """Encoded predicted classes of a classifier's probabilities (None for regression)."""
    if task == "regression":
        return None
    if task == "binary":
        return (predictions >= threshold).astype(int)
    return predictions.argmax(axis=1)
