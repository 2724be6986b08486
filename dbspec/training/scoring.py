"""Validation metrics during training: shared by single-process training (:mod:`.fit`) and
every distributed rank (:mod:`.rank`), so neither imports the other."""

from __future__ import annotations


def validation_scorer(spec, served):
    """Per-epoch validation metrics, only when a monitored metric needs more than val_loss."""
    monitored = {spec.training.early_stopping.monitor if spec.training.early_stopping else "",
                 spec.training.scheduler.monitor if spec.training.scheduler is not None
                 and spec.training.scheduler.name == "plateau" else "",
                 spec.search.metric if spec.search is not None else ""}
    names = sorted(m[4:] for m in monitored if m.startswith("val_") and m != "val_loss")
    if not names:
        return None
    from dbspec.evaluation.metrics import task_metrics

    def score(out, y):
        import torch

        with torch.inference_mode():
            predictions = served.head(out.cpu()).numpy()
        y_true = y.cpu().numpy().reshape(-1)
        if spec.data.task == "regression":
            y_true = y_true * served.card.target_std + served.card.target_mean
        found = task_metrics(spec.data.task, y_true, predictions, names,
                             threshold=spec.evaluation.threshold)
        return {f"val_{k}": v for k, v in found.items()}

    return score


