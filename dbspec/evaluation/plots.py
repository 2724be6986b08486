"""PNG plots of a run: loss curves, residuals, predicted vs actual, confusion matrix, ROC, PR."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np


@dataclass(frozen=True)
class PlotData:
    """What the plots draw: one split's truth and predictions, and the training history."""

    task: str
    history: list[dict[str, float]]
    y_true: np.ndarray
    predictions: np.ndarray
    classes: Optional[list[Any]]
    threshold: float = 0.5


def write_plots(names: list[str], directory: Path, data: PlotData) -> list[Path]:
    """Write each named plot as ``<name>.png`` into ``directory``; returns the paths.

    Figures are made without pyplot: no backend is switched and no window can open, in a
    notebook's process too."""
    from matplotlib.figure import Figure

    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name in names:
        fig = Figure(figsize=(6, 4.5), dpi=100)
        _DRAW[name](fig.subplots(), **vars(data))
        fig.tight_layout()
        fig.savefig(directory / f"{name}.png")
        written.append(directory / f"{name}.png")
    return written


def _loss_curve(ax, *, history, **_):
    from dbspec.evaluation.curves import best_epoch

    epochs = np.arange(1, len(history) + 1)
    for key, label in (("train_loss", "train"), ("val_loss", "validation")):
        values = [h.get(key) for h in history]
        if any(v is not None for v in values):
            ax.plot(epochs, [np.nan if v is None else v for v in values], label=label)
    best = best_epoch(history)
    if best is not None:  # the epoch early stopping keeps: lowest validation loss
        ax.axvline(best, color="grey", linestyle="--", linewidth=1, label=f"best epoch ({best})")
    ax.set(xlabel="epoch", ylabel="loss", title="Loss per epoch")
    ax.legend()


def _residuals(ax, *, y_true, predictions, **_):
    ax.scatter(predictions, y_true - predictions, s=10, alpha=0.6)
    ax.axhline(0, color="grey", linewidth=1)
    ax.set(xlabel="predicted", ylabel="actual - predicted", title="Residuals (test split)")


def _predicted_vs_actual(ax, *, y_true, predictions, **_):
    ax.scatter(y_true, predictions, s=10, alpha=0.6)
    low, high = float(min(y_true.min(), predictions.min())), float(max(y_true.max(),
                                                                       predictions.max()))
    ax.plot([low, high], [low, high], color="grey", linewidth=1)
    ax.set(xlabel="actual", ylabel="predicted", title="Predicted vs actual (test split)")


def _confusion_matrix(ax, *, task, y_true, predictions, classes, threshold, **_):
    from dbspec.evaluation.metrics import confusion, predicted_labels

    labels = predicted_labels(task, predictions, threshold)
    matrix = np.asarray(confusion(y_true, labels, len(classes)))
    ax.imshow(matrix, cmap="Blues")
    for (i, j), count in np.ndenumerate(matrix):
        ax.text(j, i, str(count), ha="center", va="center",
                color="white" if count > matrix.max() / 2 else "black")
    ticks = range(len(classes))
    ax.set(xticks=ticks, yticks=ticks, xticklabels=classes, yticklabels=classes,
           xlabel="predicted", ylabel="actual", title="Confusion matrix (test split)")


def _one_vs_rest(task, y_true, predictions, classes):
    if task == "binary":
        return [(str(classes[1]), y_true == 1, predictions)]
    return [(str(label), y_true == j, predictions[:, j]) for j, label in enumerate(classes)]


def _roc(ax, *, task, y_true, predictions, classes, **_):
    from sklearn.metrics import auc, roc_curve

    for label, positive, scores in _one_vs_rest(task, y_true, predictions, classes):
        if positive.any() and (~positive).any():
            fpr, tpr, _ = roc_curve(positive, scores)
            ax.plot(fpr, tpr, label=f"{label} (AUC {auc(fpr, tpr):.3f})")
    ax.plot([0, 1], [0, 1], color="grey", linewidth=1, linestyle="--")
    ax.set(xlabel="false positive rate", ylabel="true positive rate", title="ROC (test split)")
    ax.legend(fontsize="small")


def _precision_recall(ax, *, task, y_true, predictions, classes, **_):
    from sklearn.metrics import precision_recall_curve

    for label, positive, scores in _one_vs_rest(task, y_true, predictions, classes):
        if positive.any():
            precision, recall, _ = precision_recall_curve(positive, scores)
            ax.plot(recall, precision, label=label)
    ax.set(xlabel="recall", ylabel="precision", title="Precision-recall (test split)")
    ax.legend(fontsize="small")


_DRAW: dict[str, Callable[..., None]] = {"loss_curve": _loss_curve, "residuals": _residuals,
         "predicted_vs_actual": _predicted_vs_actual, "confusion_matrix": _confusion_matrix,
         "roc": _roc, "precision_recall": _precision_recall}
