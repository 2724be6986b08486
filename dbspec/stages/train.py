"""train: build the network, train it, log the run and the served model to MLflow."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import numpy as np

from dbspec.errors import DbspecError
from dbspec.stages.base import StageContext, write_json
from dbspec.stages.data import load_preprocessing, load_splits, load_table

#: Networks smaller than this train on one intra-op thread (see ``choose_threads``).
SMALL_MODEL_PARAMETERS = 1_000_000


def select_device(compute):
    """The torch device ``compute`` asks for; a clear error when it is not there."""
    import torch

    if compute.kind == "single_gpu":
        if not torch.cuda.is_available():
            raise DbspecError("compute.kind single_gpu: no CUDA GPU is visible to this process "
                              "(torch.cuda.is_available() is False); use kind: local to train "
                              "on the CPU")
        if compute.device_index >= torch.cuda.device_count():
            raise DbspecError(f"compute.device_index {compute.device_index}: only "
                              f"{torch.cuda.device_count()} GPU(s) present")
        return torch.device("cuda", compute.device_index)
    wanted = compute.device
    if wanted == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if wanted == "cuda" and not torch.cuda.is_available():
        raise DbspecError("compute.device cuda: no CUDA GPU is visible; use device: auto or cpu")
    if wanted == "mps" and not torch.backends.mps.is_available():
        raise DbspecError("compute.device mps: Apple's MPS backend is not available here")
    return torch.device(wanted)


def choose_threads(setting, parameters: int) -> int:
    """Intra-op threads: ``auto`` gives small models one thread.

    Measured on a 2-core machine: a tiny MLP ran ~5,500 steps/s on one thread but fell to a
    median of 60 steps/s on two while another process used a core.
    """
    import os

    import torch

    if setting != "auto":
        threads = int(setting)
    elif parameters < SMALL_MODEL_PARAMETERS:
        threads = 1
    else:
        threads = max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                      else os.cpu_count() or 1)
    torch.set_num_threads(threads)
    return threads


def output_width(task: str, loss: str, classes: Optional[list]) -> int:
    """Network outputs per row for the task and loss."""
    if task == "regression":
        return 1
    if task == "binary":
        return 1 if loss == "bce" else 2
    return len(classes)


class TrainStage:
    """Train the network and log the run, its metrics and the served model."""

    name = "train"

    @staticmethod
    def check(spec) -> None:
        """Refuse compute kinds this executor cannot launch before any stage runs."""
        if spec.compute.kind not in ("local", "single_gpu"):
            raise DbspecError(f"compute.kind {spec.compute.kind} trains through Spark's "
                              "distributors, which this version of dbspec does not launch yet; "
                              "use kind: local or single_gpu")

    def run(self, ctx: StageContext) -> dict[str, Any]:
        import torch

        from dbspec.models.network import build_network
        from dbspec.models.served import ModelCard, ServedModel, save_served_model
        from dbspec.training.checkpoints import CheckpointStore
        from dbspec.training.loop import Tensors, train

        spec = ctx.spec
        table, splits, fitted = load_table(ctx), load_splits(ctx), load_preprocessing(ctx)
        task, loss = spec.data.task, spec.training.loss_for(spec.data.task)
        width, out = len(table.feature_names), output_width(task, loss, table.classes)
        device = select_device(spec.compute)
        torch.manual_seed(spec.training.seed)
        network = build_network(spec.model, width, out)
        parameters = sum(p.numel() for p in network.parameters())
        threads = choose_threads(spec.training.num_threads, parameters)
        mean, std = _target_scale(task, table.target[splits.train])
        card = ModelCard(task=task, loss=loss, feature_names=table.feature_names,
                         out_features=out, model=spec.model.model_dump(mode="json", by_alias=True),
                         preprocessing=json.loads((ctx.dir_of("preprocess") /
                                                   "preprocessing.json").read_text()),
                         classes=table.classes, target_mean=mean, target_std=std)
        served = ServedModel(card, network)
        tensors = _tensors(served, table, splits, task, loss, device)
        network.to(device)
        checkpoints = None
        if spec.training.checkpointing.enabled:
            checkpoints = CheckpointStore(ctx.directory / "checkpoints",
                                          every=spec.training.checkpointing.every_n_epochs,
                                          keep=spec.training.checkpointing.keep_last)
            if not ctx.options.resume:
                checkpoints.clear()
        epochs = 1 if ctx.options.smoke else spec.training.epochs
        run_file = ctx.directory / "run.json"
        previous_run = json.loads(run_file.read_text())["run_id"] \
            if ctx.options.resume and run_file.exists() else None
        tracker = ctx.tracker
        tags = {"dbspec.spec": spec.name, "dbspec.target": ctx.loaded.target or "",
                "dbspec.smoke": str(ctx.options.smoke).lower(),
                "dbspec.data_version": ctx.output_of("load_data")["data_version"]}
        with tracker.run(previous_run, tags=tags,
                         system_metrics=spec.tracking.system_metrics) as run_id:
            write_json(run_file, {"run_id": run_id})
            if previous_run is None:
                _log_inputs(ctx, tracker, table, parameters, threads, device)

            def log_epoch(*, epoch: int, metrics: dict[str, float], **_: Any) -> None:
                tracker.log_metrics(metrics, step=epoch)
                ctx.reporter.epoch(epoch=epoch, epochs=epochs, metrics=metrics)

            outcome = train(network, tensors, spec.training, loss=loss, device=device,
                            epochs=epochs, score_validation=_scorer(spec, served),
                            checkpoints=checkpoints, resume=ctx.options.resume,
                            callbacks=[log_epoch])
            network.cpu()
            served_dir = save_served_model(served.eval(), ctx.directory / "served")
            write_json(ctx.directory / "history.json", outcome.history)
            example = _example_frame(table, splits)
            model_uri = tracker.log_model(served_dir, example, served.predict_frame(example))
            summary = {"best_epoch": outcome.best_epoch + 1, "epochs_run": outcome.epochs_run,
                       "train_samples_per_second": outcome.samples_per_second}
            tracker.log_metrics(summary)
        return {"run_id": run_id, "experiment_id": tracker.experiment_id,
                "tracking_uri": tracker.tracking_uri, "model_uri": model_uri,
                "resumed_from_epoch": outcome.resumed_from, "stopped_early": outcome.stopped_early,
                "device": str(device), "threads": threads, "parameters": parameters, **summary}


def _target_scale(task: str, y_train: np.ndarray) -> tuple[float, float]:
    """Regression targets are trained standardised; the served model undoes it."""
    if task != "regression" or len(y_train) == 0:
        return 0.0, 1.0
    std = float(y_train.std())
    return float(y_train.mean()), std if std > 0 else 1.0


def _tensors(served, table, splits, task: str, loss: str, device):
    """Preprocess once with the served model's own transform; targets in training form."""
    import torch

    from dbspec.training.loop import Tensors

    with torch.no_grad():
        x = served.transform(torch.from_numpy(table.features))

    def target(rows):
        y = torch.from_numpy(table.target[rows])
        if task == "regression":
            return ((y - served.card.target_mean) / served.card.target_std).unsqueeze(1)
        return y.float().unsqueeze(1) if loss == "bce" else y.long()

    def rows(index):
        return x[torch.from_numpy(index)].to(device), target(index).to(device)

    x_train, y_train = rows(splits.train)
    x_val, y_val = rows(splits.validation) if len(splits.validation) else (None, None)
    return Tensors(x_train, y_train, x_val, y_val)


def _scorer(spec, served):
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


def _example_frame(table, splits):
    import pandas as pd

    rows = splits.train[:5]
    return pd.DataFrame(table.features[rows].astype(np.float64), columns=table.feature_names)


def _log_inputs(ctx: StageContext, tracker, table, parameters: int, threads: int, device) -> None:
    """Params (the flattened resolved spec), the spec files and the dataset of a new run."""
    import pandas as pd
    import yaml

    from dbspec.tracking.mlflow_tracking import flatten

    spec = ctx.spec
    dumped = spec.model_dump(mode="json", by_alias=True, exclude={"targets"})
    params = flatten(dumped)
    params.update({"dbspec.parameters": str(parameters), "dbspec.threads": str(threads),
                   "dbspec.device": str(device), "dbspec.target": ctx.loaded.target or ""})
    tracker.log_params(params)
    spec_dir = ctx.directory / "spec"
    spec_dir.mkdir(exist_ok=True)
    (spec_dir / "resolved.yaml").write_text(yaml.safe_dump(dumped, sort_keys=False))
    source = Path(ctx.loaded.file)
    (spec_dir / source.name).write_text(source.read_text())
    tracker.log_artifact(spec_dir / "resolved.yaml", "spec")
    tracker.log_artifact(spec_dir / source.name, "spec")
    load = ctx.output_of("load_data")
    frame = pd.DataFrame(table.features, columns=table.feature_names)
    frame[spec.data.target] = table.target
    tracker.log_dataset(frame, source=load["uri"], target=spec.data.target,
                        version=load["data_version"], name=f"{spec.name}-data")
