"""Fit a spec's network on prepared data: the work shared by the train stage and search trials."""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np

from dbspec.data.prepare import FittedStep, Splits, Table
from dbspec.seams.compute import COMPUTE, trains_on_ranks
from dbspec.spec.sections import Spec
from dbspec.spec.semantics import output_width
from dbspec.tracking.metrics import TrackingTarget

#: Networks smaller than this train on one intra-op thread (see ``choose_threads``).
SMALL_MODEL_PARAMETERS = 1_000_000


def select_device(compute):
    """The torch device ``compute`` asks for (its kind decides); a clear error when it is not
    there."""
    return COMPUTE.get(compute.kind).device(compute)


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


@dataclass
class Fitted:
    """A trained served model and how its training went."""

    served: Any
    outcome: Any
    device: Any
    threads: int
    parameters: int
    batch_size: Optional[int] = None  # what training ended with (auto_batch_size may halve it)
    #: Parameters the training updated (LoRA: the adapters and the head), of ``parameters``
    trained: Optional[int] = None


@dataclass(frozen=True)
class FitOptions:
    """How :func:`fit_spec` runs one training, beyond the spec.

    Attributes:
        epochs: Epoch override (smoke runs).
        checkpoints: A :class:`~dbspec.training.checkpoints.CheckpointStore`, or None.
        resume: Continue from the newest checkpoint.
        callbacks: Called with each epoch's metrics (in process; ranks log to ``tracking``).
        observer: A :class:`~dbspec.observability.observer.TrainingObserver` that sees every
            epoch first (in process; rank 0 runs its own).
        work_dir: The ranks' shared files (required for distributed training).
        tracking: The MLflow run rank 0 logs each epoch to (distributed training).
        say: Progress lines of the launcher (distributed training).
    """

    epochs: Optional[int] = None
    checkpoints: Any = None
    resume: bool = False
    callbacks: Sequence[Any] = ()
    observer: Any = None
    work_dir: Optional[Path] = None
    tracking: Optional[TrackingTarget] = None
    say: Callable[[str], None] = lambda text: None


def fit_spec(spec: Spec, table: Table, splits: Splits, fitted: list[FittedStep],
             options: FitOptions = FitOptions()) -> Fitted:
    """Build the spec's network for ``table``, train it (in process, or on the compute kind's
    ranks), and wrap it as a served model. CUDA out of memory fails with advice, or with
    ``training.auto_batch_size`` restarts at half the batch size.

    Raises:
        TrainingError: the loss became non-finite, or CUDA ran out of memory.
        DistributedError: a rank failed.
    """
    from dbspec.models.inputs import training_ranges

    mean, std = _target_scale(spec.data.task, table.target[splits.train])
    card = model_card(spec, fitted, feature_names=table.feature_names, classes=table.classes,
                      target_mean=mean, target_std=std, inputs=table.inputs,
                      feature_ranges=_ranges(table, splits.train, training_ranges))
    return _fit_card(spec, card, lambda served, device: _tensors(served, table, splits, device),
                     options)


def fit_streamed(spec: Spec, data, stats: dict[str, Any], fitted: list[FittedStep],
                 options: FitOptions = FitOptions()) -> Fitted:
    """:func:`fit_spec` on streamed data: ``data`` is a
    :class:`~dbspec.data.access.StreamedData`, ``stats`` what the statistics pass found
    (target scale, feature ranges); every rank streams its own part of each epoch."""
    from dbspec.training.streamed import streamed_tensors

    card = model_card(spec, fitted, feature_names=data.feature_names, classes=data.classes,
                      target_mean=stats["target_mean"], target_std=stats["target_std"],
                      feature_ranges=stats["ranges"])
    shard_set = data.shard_set
    return _fit_card(spec, card, lambda served, _: streamed_tensors(spec, served, shard_set),
                     options, shards=shard_set)


def _fit_card(spec: Spec, card, make_tensors, options: FitOptions, shards=None) -> Fitted:
    """Build the network for ``card``, train it, wrap it as a served model (``fit_spec``)."""
    distributed = trains_on_ranks(spec)
    device = select_device(spec.compute)
    served = _new_served(spec, card)
    parameters = sum(p.numel() for p in served.network.parameters())
    trained = sum(p.numel() for p in served.network.parameters() if p.requires_grad)
    threads = choose_threads(spec.training.num_threads, parameters)
    if distributed:
        from dbspec.training.distributed import launch

        tensors = None if shards is not None else make_tensors(served, device)
        served, outcome = launch(spec, tensors, served, options=options,
                                 shards=shards.root if shards is not None else None)
        _finish(served.network)
        return Fitted(served, outcome, device, threads, parameters, trained=trained)
    tensors = make_tensors(served, device)
    served, outcome, batch_size = _fit_in_process(spec, served, tensors, device, options)
    _finish(served.network)
    return Fitted(served, outcome, device, threads, parameters, batch_size, trained)


def _finish(network) -> None:
    """What a network does once trained (a pretrained one merges its LoRA adapters), so that
    the served model is the one a state dict rebuilds."""
    finish = getattr(network, "finish", None)
    if callable(finish):
        finish()


def model_card(spec: Spec, fitted: list[FittedStep], *, feature_names: list[str],
               classes: Optional[list], **data: Any):
    """The served model's card: the spec's task, loss and network, the fitted preprocessing,
    and what the data says (``data``: target scale, feature ranges, typed inputs)."""
    from dataclasses import asdict

    from dbspec.models.card import ModelCard

    task, loss = spec.data.task, spec.training.loss_for(spec.data.task)
    return ModelCard(task=task, loss=loss, feature_names=feature_names,
                     out_features=output_width(task, loss, len(classes or ())), classes=classes,
                     model=spec.model.model_dump(mode="json", by_alias=True),
                     preprocessing=[asdict(step) for step in fitted],
                     threshold=spec.evaluation.threshold, **data)


def _ranges(table: Table, train, training_ranges) -> dict[str, list]:
    """The training range of each feature column; with typed features only numeric features
    have one (a token id or a pixel has no 'unit' to get wrong)."""
    if table.inputs is None:
        return training_ranges(table.features[train])
    numeric = {i["name"] for i in table.inputs if i["type"] == "numeric"}
    columns = [j for j, name in enumerate(table.feature_names) if name in numeric]
    found = training_ranges(table.features[np.ix_(train, columns)]) if columns \
        else {"low": [], "high": []}
    ranges: dict[str, list] = {"low": [None] * len(table.feature_names),
                               "high": [None] * len(table.feature_names)}
    for k, j in enumerate(columns):
        ranges["low"][j], ranges["high"][j] = found["low"][k], found["high"][k]
    return ranges


def _fit_in_process(spec: Spec, served, tensors, device, options: FitOptions):
    """Train in this process; on CUDA out-of-memory, again at half the batch size if allowed.
    Returns the served model (on the CPU, eval mode), the outcome and the final batch size."""
    import torch

    from dbspec.training.loop import is_streamed
    from dbspec.training.streamed import preparer

    training, resume = spec.training, options.resume
    while True:
        try:
            outcome = _train_once(spec, served, tensors, training, device,
                                  replace(options, resume=resume))
            break
        except torch.cuda.OutOfMemoryError:
            training = _halved_batch(training, options.observer)
            served.network.cpu()  # the failed one's memory freed
            torch.cuda.empty_cache()
            served = _new_served(spec, served.card)  # the same start, with a smaller batch
            if is_streamed(tensors):  # the stream cuts the batches: it gets the new size
                stream = tensors.train
                stream.settings = replace(stream.settings, batch_size=training.batch_size)
                stream.prepare = preparer(served)
            if options.checkpoints is not None:
                options.checkpoints.clear()
            resume = False
    served.network.cpu()
    return served.eval(), outcome, training.batch_size


def _train_once(spec: Spec, served, tensors, training, device, options: FitOptions):
    from dbspec.training.loop import TrainOptions, example_rows, train, validation_scorer

    network = served.network.to(device)
    callbacks = list(options.callbacks)
    if options.observer is not None:
        options.observer.attach(network, example_rows(tensors).to(device))
        callbacks.insert(0, options.observer.callback)
    return train(network, tensors, training, loss=served.card.loss, device=device,
                 options=TrainOptions(epochs=options.epochs,
                                      score_validation=validation_scorer(spec, served),
                                      checkpoints=options.checkpoints, resume=options.resume,
                                      callbacks=callbacks))


def _halved_batch(training, observer):
    """The training section at half the batch size after CUDA ran out of memory.

    Raises:
        TrainingError: ``training.auto_batch_size`` is off, or the batch is one row already.
    """
    from dbspec.training.loop import TrainingError

    if observer is not None:
        observer.oom_batch_sizes.append(training.batch_size)
    if not training.auto_batch_size or training.batch_size == 1:
        raise TrainingError(
            f"training.batch_size: CUDA ran out of memory at batch size "
            f"{training.batch_size}; lower it, add gradient checkpointing for deep "
            "models, or set training.auto_batch_size: true") from None
    halved = training.model_copy(update={"batch_size": training.batch_size // 2})
    print(f"  CUDA out of memory: restarting at batch size {halved.batch_size} "
          "(training.auto_batch_size)", file=sys.stderr)
    return halved


def _new_served(spec: Spec, card):
    """A served model around a new network for ``card``, its initial weights from the seed."""
    import torch

    from dbspec.models.network import build_network
    from dbspec.models.served import ServedModel

    torch.manual_seed(spec.training.seed)
    return ServedModel(card, build_network(spec.model, len(card.feature_names),
                                           card.out_features, inputs=card.inputs,
                                           load_weights=True))


def _target_scale(task: str, y_train: np.ndarray) -> tuple[float, float]:
    """Regression targets are trained standardised; the served model undoes it."""
    if task != "regression" or len(y_train) == 0:
        return 0.0, 1.0
    std = float(y_train.std())
    return float(y_train.mean()), std if std > 0 else 1.0


def _tensors(served, table, splits, device):
    """Preprocess once with the served model's own transform; targets in training form."""
    import torch

    from dbspec.models.card import training_targets
    from dbspec.training.loop import Tensors

    with torch.no_grad():
        x = served.transform(torch.from_numpy(table.features))

    def target(rows):
        return training_targets(served.card, torch.from_numpy(table.target[rows]))

    def rows(index):
        return x[torch.from_numpy(index)].to(device), target(index).to(device)

    x_train, y_train = rows(splits.train)
    x_val, y_val = rows(splits.validation) if len(splits.validation) else (None, None)
    return Tensors(x_train, y_train, x_val, y_val)
