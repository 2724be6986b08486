"""Hyperparameter search: an Optuna study whose trials train through the same code as ``train``.

Each trial applies its suggestions to a copy of the spec at the ``search.space`` paths, trains,
and reports ``search.metric`` every epoch so the pruner stops weak trials. Trials are nested
MLflow runs under the study's run; the study lives in Optuna storage, so an interrupted search
continues where it stopped. Nothing here imports Optuna, MLflow or torch at import time.
"""
