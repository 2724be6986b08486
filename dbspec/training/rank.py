"""One rank of a distributed training, under every launcher.

TorchDistributor and DeepSpeed's distributor start :func:`rank_main` (it joins the process group
torchrun's environment describes); Ray Train joins the group itself and calls :func:`train_rank`.
A rank trains its shard through the same loop as single-process training, under DDP or the
DeepSpeed engine; rank 0 alone logs to MLflow, checkpoints and writes the weights and result.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Iterator

from dbspec.faults import pause_point
from dbspec.training.job import RankJob, RankReport, RankResult, record_rank_failure


def skip_cpu_shm_op() -> None:
    """Keep DeepSpeed from JIT-compiling its shared-memory all-reduce op on CPU (measured:
    146-250 s, g++ required): marked incompatible, the op gives way to gloo's all-reduce, as
    wherever it cannot build. CPU training is for development and tests, where the compile
    costs more than it saves. ``DBSPEC_DEEPSPEED_SHM=1`` leaves DeepSpeed's choice alone."""
    if os.environ.get("DBSPEC_DEEPSPEED_SHM", "") not in ("", "0"):
        return
    import deepspeed.ops

    compatible = deepspeed.ops.__compatible_ops__  # probed once, on first access
    compatible["deepspeed_shm_comm"] = False


def rank_main(work_dir: str) -> None:
    """One torchrun rank (TorchDistributor, DeepSpeed): join the process group its environment
    describes, train its shard under DDP, leave the group."""
    rank = int(os.environ.get("RANK", "0"))
    try:
        import torch
        import torch.distributed as dist

        job = RankJob.read(Path(work_dir))
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        device = torch.device("cuda", local_rank) if job.use_gpu else torch.device("cpu")
        if job.use_gpu:  # before nccl's communicators, and where zero.Init puts a partition
            torch.cuda.set_device(device)
        if job.deepspeed:
            import deepspeed

            if not job.use_gpu:
                skip_cpu_shm_op()
            deepspeed.init_distributed(dist_backend=job.backend)
        else:
            dist.init_process_group(job.backend)
        train_rank(Path(work_dir), rank, device)
        dist.destroy_process_group()
    except BaseException as exc:
        record_rank_failure(Path(work_dir), rank, exc)
        raise SystemExit(1) from None


def train_rank(work_dir: Path, rank: int, device) -> None:
    """One rank's training, in a process group its launcher has joined already: reads its
    shard, trains under DDP (or the DeepSpeed engine), rank 0 logs, checkpoints and writes the
    result; ends on a barrier, leaving the group to the launcher."""
    import gc
    import time

    import torch
    import torch.distributed as dist

    from dbspec.models.served import ServedModel
    from dbspec.training.loop import TrainOptions, is_streamed, train, validation_scorer

    job = RankJob.read(work_dir)
    spec = job.spec
    torch.manual_seed(spec.training.seed)  # identical initial weights on every rank
    served = ServedModel(job.card, _rank_network(job))
    held = _held_parameters(served.network)
    network = served.network.to(device)
    tensors = _rank_tensors(job, served, work_dir, rank, device)
    model, engine = _parallel_model(network, job, device)
    checkpoints = _checkpoints(job, engine, rank)
    logger = _rank_zero_logger(job, rank)
    observer = _rank_zero_observer(job, rank, work_dir, network, tensors)
    training = _training_for(job)
    options = TrainOptions(
        epochs=job.epochs, score_validation=validation_scorer(spec, served),
        checkpoints=checkpoints, resume=job.resume,
        callbacks=([observer.callback] if observer else [])
        + [_epoch_logger(logger, checkpoints, rank)],
        engine=engine, reduce=_mean_of_ranks(device))
    started = time.perf_counter()
    with _flushed(logger):
        outcome = train(model, tensors, training, loss=job.card.loss, device=device,
                        options=options)
    seconds = time.perf_counter() - started
    if job.zero3:
        _count_flops_together(observer, network, tensors)
    weights = _full_state(network, job.zero3)
    rows = tensors.train.rows(0) if is_streamed(tensors) else len(tensors.x_train)
    RankReport(rank, rows, outcome.samples_per_second, seconds,
               float(sum(v.double().sum() for v in weights.values())), held).write(work_dir)
    if rank == 0:
        torch.save(weights, work_dir / "weights.pt")
        diagnosis = _diagnosis(observer, device, training.batch_size)
        RankResult(outcome, dist.get_world_size(), job.backend, diagnosis).write(work_dir)
    # measured here: ~30% of runs aborted at exit until the model and optimizer were released
    # and collected before tearing the process group down
    del model, network, served, outcome, engine, options, checkpoints
    gc.collect()
    dist.barrier()


def _rank_network(job: RankJob):
    """The network as the launcher trains it; a pretrained one from its checkpoint, with its
    adapters (None: the card's own network, whose weights the seed sets)."""
    if job.spec.model.pretrained is None:
        return None
    from dbspec.models.network import build_network

    if job.zero3:
        _load_partitioned(job.deepspeed)
    card = job.card  # the launcher built this network and checked its output already
    return build_network(job.spec.model, len(card.feature_names), card.out_features,
                         inputs=card.inputs, load_weights=True, check=not job.zero3)


#: Transformers' ZeRO-3 switch, kept for the life of the rank (it holds a weak reference)
_ZERO3_LOADING: list = []


def _load_partitioned(config: dict) -> None:
    """Under ZeRO-3, ``from_pretrained`` builds the model inside ``deepspeed.zero.Init`` and
    loads the checkpoint into the partitions, so no rank holds (or moves to its GPU) the whole
    model: Transformers' documented switch outside its Trainer, ``HfDeepSpeedConfig``."""
    from transformers.integrations import HfDeepSpeedConfig

    _ZERO3_LOADING.append(HfDeepSpeedConfig(config))


@contextlib.contextmanager
def _flushed(logger) -> Iterator[None]:
    """Rank 0's buffered metrics flushed to MLflow on the way out of the training."""
    try:
        yield
    except BaseException:
        if logger is not None:
            with contextlib.suppress(Exception):  # the failure itself is what matters
                logger.flush()
        raise
    if logger is not None:
        logger.flush()  # every epoch is in MLflow before the result says the training ended


def _held_parameters(network) -> int:
    """Parameters this rank holds: under ZeRO-3 a partitioned one is an empty placeholder and
    the rank's part of it is its ``ds_tensor``."""
    return sum(p.ds_tensor.numel() if hasattr(p, "ds_tensor") else p.numel()
               for p in network.parameters())


def _count_flops_together(observer, network, tensors) -> None:
    """The diagnosis's FLOP count under ZeRO-3: its forward pass gathers the partitioned
    parameters, which takes every rank, so the others run it beside rank 0's observer (seen:
    rank 0 counting alone waited forever on ranks already at the closing barrier)."""
    if observer is not None:
        observer.count_flops()
        return
    from dbspec.observability.observer import training_flops_per_row
    from dbspec.training.loop import example_rows

    training_flops_per_row(network, example_rows(tensors).to(next(network.parameters()).device))


def _diagnosis(observer, device, batch_size: int) -> tuple[str, ...]:
    """Rank 0's observer closed, and what it found, in words (nothing without one)."""
    if observer is None:
        return ()
    import torch

    findings = observer.finish(device=device.type, threads=torch.get_num_threads(),
                               batch_size=batch_size)
    observer.__exit__(None, None, None)
    return tuple(f.text() for f in findings)


def _rank_tensors(job: RankJob, served, work_dir: Path, rank: int, device):
    """This rank's training rows and the validation rows, on ``device``; or its part of each
    epoch, streamed from the shard set (``data.streaming``)."""
    import torch
    import torch.distributed as dist

    from dbspec.training.loop import Tensors

    if job.shards is not None:
        from dbspec.data.shards import open_shard_set
        from dbspec.training.streamed import streamed_tensors

        return streamed_tensors(job.spec, served, open_shard_set(job.shards), rank=rank,
                                world=dist.get_world_size())
    data = torch.load(work_dir / f"shard-{rank}.pt", weights_only=True)
    return Tensors(*(None if data[key] is None else data[key].to(device)
                     for key in ("x_train", "y_train", "x_val", "y_val")))


def _parallel_model(network, job: RankJob, device):
    """The network under DDP, or wrapped around a DeepSpeed engine; returns (model, engine)."""
    if job.deepspeed:
        import deepspeed

        from dbspec.training.components import build_optimizer

        engine, *_ = deepspeed.initialize(
            model=network, optimizer=build_optimizer(network, job.spec.training.optimizer),
            config=job.deepspeed)
        return _EngineModule(engine, next(engine.module.parameters()).dtype), engine
    from torch.nn.parallel import DistributedDataParallel

    ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(network, device_ids=ids), None


def _checkpoints(job: RankJob, engine, rank: int):
    """Where this rank checkpoints: DeepSpeed's partitions, dbspec's store, or nowhere."""
    if job.checkpoint_dir is None:
        return None
    every = job.spec.training.checkpointing.every_n_epochs
    keep = job.spec.training.checkpointing.keep_last
    from dbspec.training.checkpoints import CheckpointStore, DeepspeedCheckpoints

    if engine is not None:
        return DeepspeedCheckpoints(engine, job.checkpoint_dir, every=every, keep=keep,
                                    writer=rank == 0)
    return CheckpointStore(job.checkpoint_dir, writer=rank == 0, every=every, keep=keep)


def _rank_zero_logger(job: RankJob, rank: int):
    """Rank 0's metric buffer on the driver's MLflow run (None elsewhere, or untracked)."""
    if rank != 0 or job.tracking is None:
        return None
    import mlflow

    from dbspec.tracking.metrics import MetricBuffer

    client = mlflow.MlflowClient(tracking_uri=job.tracking.uri)
    return MetricBuffer(client, job.tracking.run_id)


def _rank_zero_observer(job: RankJob, rank: int, work_dir: Path, network, tensors):
    """Rank 0 watches the run for everyone: monitor, TensorBoard, diagnosis."""
    if rank != 0:
        return None
    from dbspec.observability.observer import TrainingObserver

    observer = TrainingObserver(job.spec, log_dir=work_dir / "tensorboard",
                                say=lambda text: None)
    observer.__enter__()
    from dbspec.training.loop import example_rows

    observer.attach(network, example_rows(tensors).to(next(network.parameters()).device))
    return observer


def _training_for(job: RankJob):
    """The training section as this rank runs it: under ZeRO-3 the parameters are
    partitioned, so a copied state dict is not the whole model and restore-best is off."""
    training = job.spec.training
    if not job.zero3 or not training.early_stopping:
        return training
    stopping = training.early_stopping.model_copy(update={"restore_best": False})
    return training.model_copy(update={"early_stopping": stopping})


def _mean_of_ranks(device):
    """The loop's ``reduce``: the epoch's training loss averaged over the ranks."""
    import torch
    import torch.distributed as dist

    world = dist.get_world_size()

    def reduce(metrics: dict[str, float]) -> None:
        loss = torch.tensor([metrics["train_loss"]], device=device)
        dist.all_reduce(loss)
        metrics["train_loss"] = float(loss) / world

    return reduce


def _epoch_logger(logger, checkpoints, rank: int):
    """The epoch callback every rank runs: rank 0 logs; all pause at the test seam."""

    def log_epoch(*, epoch: int, metrics: dict[str, float], **_: Any) -> None:
        if logger is not None:
            logger.log(metrics, epoch)
            if checkpoints is not None and checkpoints.due(epoch, last=False):
                # everything up to a checkpoint is in MLflow before the checkpoint exists, so a
                # run resumed from it after a crash (even a kill -9) has no gap of epochs
                logger.flush()
        # a test seam: a test stops one rank here to kill its node mid-training, on cue
        pause_point(f"train.rank{rank}.epoch.{epoch}")

    return log_epoch


def _full_state(network, zero3: bool) -> dict:
    """The complete float32 weights (gathered from every rank under ZeRO-3)."""
    gather = contextlib.nullcontext()
    if zero3:
        import deepspeed

        gather = deepspeed.zero.GatheredParameters(list(network.parameters()), modifier_rank=None)
    with gather:
        return {k: v.detach().float().cpu().clone() for k, v in network.state_dict().items()}


class _EngineModule:
    """Calls a DeepSpeed engine with inputs in its dtype and returns float32 outputs."""

    def __init__(self, engine, dtype):
        self.engine, self.dtype = engine, dtype

    def __call__(self, x):
        return self.engine(x.to(self.dtype)).float()

    def train(self, mode: bool = True):
        self.engine.train(mode)
        return self

    def eval(self):
        return self.train(False)

    def state_dict(self):
        return self.engine.module.state_dict()

    def load_state_dict(self, state):
        return self.engine.module.load_state_dict(state)

    def parameters(self):
        return self.engine.module.parameters()



if __name__ == "__main__":  # a torchrun rank: python -m dbspec.training.rank WORK_DIR
    import sys

    rank_main(sys.argv[1])
