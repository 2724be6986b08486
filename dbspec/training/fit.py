"""Fit a spec's network on prepared data: the work shared by the train stage and search trials."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import numpy as np

from dbspec.data.prepare import FittedStep, Splits, Table
from dbspec.errors import DbspecError
from dbspec.spec.sections import Spec

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


@dataclass
class Fitted:
    """A trained served model and how its training went."""

    served: Any
    outcome: Any
    device: Any
    threads: int
    parameters: int
    batch_size: Optional[int] = None  # what training ended with (auto_batch_size may halve it)


def fit_spec(spec: Spec, table: Table, splits: Splits, fitted: list[FittedStep], *,
             epochs: Optional[int] = None, checkpoints=None, resume: bool = False,
             callbacks: Sequence = (), work_dir=None, tracking: Optional[dict] = None,
             observer=None, say: Callable[[str], None] = lambda text: None) -> Fitted:
    """Build the spec's network for ``table``, train it, and wrap it as a served model.

    With ``compute.kind`` torch_distributor, deepspeed or ray the training runs on the
    launcher's ranks (``work_dir`` holds their files; ``tracking`` names the MLflow run rank 0
    logs to; ``say`` gets the launcher's progress lines).
    ``observer`` (a :class:`~dbspec.monitoring.observer.TrainingObserver`) sees every epoch
    first. A CUDA out-of-memory error fails with advice, or with ``training.auto_batch_size``
    restarts the training at half the batch size.
    """
    from dataclasses import asdict

    import torch

    from dbspec.models.inputs import training_ranges
    from dbspec.models.network import build_network
    from dbspec.models.served import ModelCard, ServedModel
    from dbspec.training.loop import TrainingError, train

    task, loss = spec.data.task, spec.training.loss_for(spec.data.task)
    width, out = len(table.feature_names), output_width(task, loss, table.classes)
    distributed = spec.compute.kind in ("torch_distributor", "deepspeed", "ray")
    device = torch.device("cpu") if distributed else select_device(spec.compute)
    torch.manual_seed(spec.training.seed)
    network = build_network(spec.model, width, out)
    parameters = sum(p.numel() for p in network.parameters())
    threads = choose_threads(spec.training.num_threads, parameters)
    mean, std = _target_scale(task, table.target[splits.train])
    card = ModelCard(task=task, loss=loss, feature_names=table.feature_names, out_features=out,
                     model=spec.model.model_dump(mode="json", by_alias=True),
                     preprocessing=[asdict(step) for step in fitted], classes=table.classes,
                     target_mean=mean, target_std=std, threshold=spec.evaluation.threshold,
                     feature_ranges=training_ranges(table.features[splits.train]))
    served = ServedModel(card, network)
    tensors = _tensors(served, table, splits, task, loss, device)
    if distributed:
        return _fit_distributed(spec, served, tensors, card, epochs=epochs, resume=resume,
                                work_dir=work_dir, tracking=tracking, checkpoints=checkpoints,
                                threads=threads, parameters=parameters, say=say)
    training = spec.training
    while True:
        network.to(device)
        if observer is not None:
            observer.attach(network, tensors.x_train[:2])
            callbacks = [observer.callback, *callbacks]
        try:
            outcome = train(network, tensors, training, loss=loss, device=device, epochs=epochs,
                            score_validation=validation_scorer(spec, served),
                            checkpoints=checkpoints, resume=resume, callbacks=callbacks)
            break
        except torch.cuda.OutOfMemoryError:
            if observer is not None:
                observer.oom_batch_sizes.append(training.batch_size)
                callbacks = callbacks[1:]
            if not training.auto_batch_size or training.batch_size == 1:
                raise TrainingError(
                    f"training.batch_size: CUDA ran out of memory at batch size "
                    f"{training.batch_size}; lower it, add gradient checkpointing for deep "
                    "models, or set training.auto_batch_size: true") from None
            training = training.model_copy(update={"batch_size": training.batch_size // 2})
            print(f"  CUDA out of memory: restarting at batch size {training.batch_size} "
                  "(training.auto_batch_size)", file=sys.stderr)
            network.cpu()
            torch.cuda.empty_cache()
            torch.manual_seed(spec.training.seed)  # the same start, with a smaller batch
            network = build_network(spec.model, width, out)
            served = ServedModel(card, network)
            if checkpoints is not None:
                checkpoints.clear()
            resume = False
    network.cpu()
    return Fitted(served.eval(), outcome, device, threads, parameters, training.batch_size)


def _fit_distributed(spec, served, tensors, card, *, epochs, resume, work_dir, tracking,
                     checkpoints, threads, parameters, say) -> Fitted:
    import json
    from pathlib import Path

    import torch

    from dbspec.training.distributed import launch
    from dbspec.training.loop import TrainOutcome

    if work_dir is None:
        raise DbspecError("distributed training needs a work directory")
    work_dir = Path(work_dir)
    record = launch(spec, tensors, card, work_dir=work_dir, epochs=epochs, resume=resume,
                    tracking=tracking,
                    checkpoint_dir=checkpoints.directory if checkpoints is not None else None,
                    say=say)
    served.network.load_state_dict(torch.load(work_dir / "weights.pt", weights_only=True))
    fields = TrainOutcome.__dataclass_fields__
    outcome = TrainOutcome(**{k: v for k, v in record.items() if k in fields})
    outcome.extra = {"world_size": record["world_size"], "backend": record["backend"],
                     "diagnosis": record.get("diagnosis", []),
                     **({"placement": record["placement"]} if "placement" in record else {}),
                     "ranks": [json.loads(p.read_text())
                               for p in sorted(work_dir.glob("rank-*.json"))]}
    return Fitted(served.eval(), outcome, torch.device("cpu"), threads, parameters)


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


