"""Training inputs streamed from a shard set (``data.streaming``): what the loop, a rank and a
search trial read instead of in-memory tensors."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from dbspec.data.shards import ShardSet
from dbspec.models.card import training_targets
from dbspec.data.stream import StreamedSplit, StreamSettings, tensor_of
from dbspec.training.loop import StreamedTensors

#: Rows per validation batch (scoring only: no gradient, so large batches are cheap).
VALIDATION_BATCH = 65_536


def stream_settings(spec) -> StreamSettings:
    """The spec's streaming settings for the training split."""
    streaming = spec.data.streaming
    return StreamSettings(batch_size=spec.training.batch_size, seed=spec.training.seed,
                          shuffle=streaming.shuffle, window=streaming.shuffle_window,
                          prefetch=streaming.prefetch, cache_dir=streaming.cache_dir)


def preparer(served):
    """Raw ``(x, y)`` numpy arrays to training tensors: the served model's own transform (the
    same code the in-memory path runs once over the whole table) and the target's training
    form."""
    import torch

    card = served.card

    def prepare(x: np.ndarray, y: np.ndarray) -> tuple[Any, Any]:
        xt, yt = tensor_of(x), tensor_of(y)
        with torch.no_grad():
            xt = served.transform(xt)
        return xt, training_targets(card, yt)

    return prepare


def streamed_tensors(spec, served, shard_set: ShardSet, *, rank: int = 0,
                     world: int = 1) -> StreamedTensors:
    """This rank's training batches and the whole validation split, streamed."""
    settings = stream_settings(spec)
    prepare = preparer(served)
    train = StreamedSplit(shard_set, "train", settings, prepare, rank=rank, world=world)
    validation = None
    if shard_set.rows("validation"):
        scoring = StreamedSplit(shard_set, "validation",
                                replace(settings, shuffle=False, batch_size=VALIDATION_BATCH),
                                prepare)
        validation = lambda: scoring.batches(0)  # noqa: E731 - every rank scores every row
    return StreamedTensors(train, validation, train.example(2)[0])
