"""DistributedDataParallel training launched by pyspark's ``TorchDistributor`` (or DeepSpeed's,
or Ray Train's ``TorchTrainer`` through :mod:`dbspec.training.ray_launch`).

The driver writes the prepared tensors and a job description to a work directory; every rank
reads them, trains its own shard with DDP (gloo on CPU, nccl on GPU) through the same loop as
single-process training, and rank 0 alone logs metrics to MLflow, writes checkpoints and the
final weights. Results come back through files, never through the distributor's return value
(measured here: in local mode it comes from an arbitrary rank, often ``None``), and the driver
checks for rank 0's success marker explicitly, because a failing rank can return without an
exception. The launchers differ only in who starts the processes and joins the process group
(:func:`rank_main` for torchrun's environment, Ray Train on its own); :func:`train_rank` is the
rank's work under every launcher.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Optional

from dbspec.errors import DbspecError
from dbspec.faults import pause_point


class DistributedError(DbspecError):
    """A rank failed or the distributor could not start."""


def launch(spec, tensors_cpu, card, *, work_dir: Path, epochs: Optional[int], resume: bool,
           tracking: Optional[dict[str, str]], checkpoint_dir: Optional[Path],
           say: Callable[[str], None] = lambda text: None) -> dict[str, Any]:
    """Train on the compute's ranks; returns rank 0's result record.

    Args:
        spec: The validated spec (``compute.kind`` torch_distributor, deepspeed or ray).
        tensors_cpu: Preprocessed inputs and training targets on the CPU.
        card: The served model's card (to rebuild the network on every rank).
        work_dir: Shared directory for the job, the per-rank records and the result.
        epochs: Epoch override (smoke runs).
        resume: Continue from the newest checkpoint in ``checkpoint_dir``.
        tracking: ``{"uri", "run_id"}`` for rank 0's metric logging, or None.
        checkpoint_dir: Where rank 0 writes checkpoints.
        say: Progress lines for people (the reporter's ``line``).

    Raises:
        DistributedError: a rank failed (its error is in the message) or no result appeared.
        DbspecError: ``compute.kind: ray`` without Ray installed.
    """
    import torch

    compute = spec.compute
    if compute.kind == "ray":
        from dbspec.training.ray_launch import require_ray

        require_ray()  # before any file is written
    use_gpu = torch.cuda.is_available() if compute.use_gpu == "auto" else bool(compute.use_gpu)
    backend = getattr(compute, "backend", "auto")
    backend = backend if backend != "auto" else ("nccl" if use_gpu else "gloo")
    ds_config = None
    if compute.kind == "deepspeed":
        from dbspec.training.deepspeed_config import check_deepspeed_config, deepspeed_config

        ds_config = deepspeed_config(spec, use_gpu=use_gpu)
        check_deepspeed_config(ds_config)
    work_dir = Path(work_dir).resolve()  # ranks may run in another working directory
    work_dir.mkdir(parents=True, exist_ok=True)
    for stale in [*work_dir.glob("rank-*"), *work_dir.glob("shard-*.pt"),
                  work_dir / "result.json", work_dir / "weights.pt"]:
        stale.unlink(missing_ok=True)
    _write_shards(tensors_cpu, work_dir, world_size(compute))
    job = {"spec": spec.model_dump(mode="json", by_alias=True), "card": asdict(card),
           "epochs": epochs, "resume": resume, "backend": backend, "use_gpu": use_gpu,
           "tracking": tracking, "deepspeed": ds_config,
           "checkpoint_dir": str(Path(checkpoint_dir).resolve())
           if checkpoint_dir and not ds_config else None,
           "deepspeed_checkpoint_dir": str(Path(checkpoint_dir).resolve())
           if checkpoint_dir and ds_config else None}
    (work_dir / "job.json").write_text(json.dumps(job, default=str))
    if compute.kind == "ray":
        from dbspec.training.ray_launch import run_on_ray

        where = run_on_ray(spec, work_dir, use_gpu=use_gpu, backend=backend, say=say)
        return {**_result(work_dir), "placement": f"on Ray Train workers: {where}"}
    if ds_config is not None:
        from pyspark.ml.deepspeed.deepspeed_distributor import DeepspeedTorchDistributor

        distributor = DeepspeedTorchDistributor(
            numGpus=compute.num_gpus, nnodes=compute.num_nodes, localMode=compute.local_mode,
            useGpu=use_gpu, deepspeedConfig=ds_config)
    else:
        from pyspark.ml.torch.distributor import TorchDistributor

        distributor = TorchDistributor(num_processes=compute.num_processes,
                                       local_mode=compute.local_mode, use_gpu=use_gpu)
    watch = None if compute.local_mode else RankWatcher(distributor.spark)
    try:
        if watch is None:
            distributor.run(rank_main, str(work_dir))
        else:
            with watch:
                distributor.run(rank_main, str(work_dir))
    except Exception as exc:  # the distributor wraps rank failures in several types
        from dbspec.spark import python_cause

        causes = [c for c in (watch.lost() if watch else "", rank_errors(work_dir)) if c]
        raise DistributedError(f"{type(distributor).__name__} failed: "
                               f"{'; '.join(causes) or python_cause(exc)}") from None
    return _result(work_dir)


def world_size(compute) -> int:
    """How many ranks the compute trains on."""
    if compute.kind == "deepspeed":
        return compute.num_gpus * compute.num_nodes
    if compute.kind == "ray":
        return compute.num_workers
    return compute.num_processes


def _result(work_dir: Path) -> dict[str, Any]:
    """Rank 0's result record, once the launcher returned; the shards are removed."""
    result = work_dir / "result.json"
    if not result.exists():
        raise DistributedError("training ranks ended without a result: "
                               + (rank_errors(work_dir) or "no rank reported an error"))
    for shard in work_dir.glob("shard-*.pt"):
        shard.unlink(missing_ok=True)  # inputs can be large; checkpoints and results stay
    return json.loads(result.read_text())


def _write_shards(tensors_cpu, work_dir: Path, world: int) -> None:
    """One file per rank with its rows, and the validation rows: a rank reads only its own.

    Shards are equal (DDP needs the same step count on every rank); the remainder rows are
    dropped, as a ``DistributedSampler`` with ``drop_last`` does.
    """
    import torch

    rows = len(tensors_cpu.x_train) // world
    if rows == 0:
        raise DistributedError(f"{len(tensors_cpu.x_train)} training rows cannot be split over "
                               f"{world} ranks; lower the process count")
    for rank in range(world):
        part = slice(rank * rows, (rank + 1) * rows)
        torch.save({"x_train": tensors_cpu.x_train[part].clone(),
                    "y_train": tensors_cpu.y_train[part].clone(),
                    "x_val": tensors_cpu.x_val, "y_val": tensors_cpu.y_val},
                   work_dir / f"shard-{rank}.pt")


class RankWatcher:
    """Stops a barrier training job as soon as one of its tasks fails or an executor is lost.

    Spark retries a failed barrier stage (and waits minutes for lost slots to come back),
    while the surviving ranks only fail on a gloo timeout; this thread watches the job and
    cancels it at the first failure, remembering which executor went away.
    """

    def __init__(self, spark, interval: float = 0.5):
        self.context = spark.sparkContext
        self.interval = interval
        self.group = f"dbspec-train-{os.getpid()}-{id(self)}"
        self.gone: list[str] = []
        self.failed_tasks = 0

    def __enter__(self):
        import threading

        self.context.setJobGroup(self.group, "dbspec distributed training",
                                 interruptOnCancel=True)
        self.known = self._executors()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="dbspec-rank-watcher",
                                        daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.context.setLocalProperty("spark.jobGroup.id", None)

    def lost(self) -> str:
        """Which executors disappeared during training, in words ('' when none)."""
        self._thread.join(timeout=10)  # it may still be settling after the failure
        if not self.gone:
            return ""
        return (f"executor(s) {', '.join(self.gone)} lost during training (the node or its "
                "processes died); the surviving ranks were stopped")

    def _executors(self) -> set[str]:
        try:
            infos = self.context._jsc.sc().statusTracker().getExecutorInfos()
            driver = self.context.getConf().get("spark.driver.host", "")
            port = self.context.getConf().get("spark.driver.port", "")
            return {f"{i.host()}:{i.port()}" for i in infos} - {f"{driver}:{port}"}
        except Exception:  # the JVM is going away with the session
            return set()

    def _watch(self) -> None:
        tracker = self.context.statusTracker()
        while not self._stop.wait(self.interval):
            now = self._executors()
            self.known |= now
            # an empty answer is a JVM call that failed, not every executor gone at once
            gone = sorted(self.known - now) if now else []
            failed = 0
            for job in tracker.getJobIdsForGroup(self.group):
                info = tracker.getJobInfo(job)
                for stage in (info.stageIds if info else ()):
                    stage_info = tracker.getStageInfo(stage)
                    failed += stage_info.numFailedTasks if stage_info else 0
            if gone or failed:
                self.gone = gone
                self.failed_tasks = failed
                self.context.cancelJobGroup(self.group)
                self._settle()
                return

    def _settle(self, seconds: float = 5.0) -> None:
        """After a failure, watch a few seconds more: a surviving rank's gloo error often
        arrives before the driver has noticed the executor that died."""
        deadline = time.monotonic() + seconds
        while not self.gone and time.monotonic() < deadline:
            now = self._executors()
            if now:
                self.gone = sorted(self.known - now)
            time.sleep(self.interval)


def rank_errors(work_dir: Path) -> str:
    """Each failed rank's Python error, one ``rank-N: Type: message`` per rank ('' if none)."""
    errors = sorted(work_dir.glob("rank-*.error"))
    return "; ".join(f"{p.stem}: {p.read_text().strip().splitlines()[-1]}" for p in errors)


def record_rank_failure(work_dir: Path, rank: int, exc: BaseException) -> None:
    """The rank's traceback into ``rank-N.error``, one line on its stderr."""
    record = Path(work_dir) / f"rank-{rank}.error"
    record.write_text("".join(traceback.format_exception(exc)))
    # one line on the rank's output (streamed to the driver), the traceback in the file:
    # the driver words the failure from these files, so a Python stack per rank is noise
    print(f"rank {rank} failed: {type(exc).__name__}: {str(exc)[:300]} (traceback in "
          f"{record})", file=sys.stderr, flush=True)


def skip_cpu_shm_op() -> None:
    """Keep DeepSpeed from JIT-compiling its shared-memory all-reduce op on CPU.

    On CPU, DeepSpeed's communication backend builds the ``deepspeed_shm_comm`` C++ extension
    the first time it starts (measured: 146-250 s, g++ required, once per torch extensions
    dir) when it finds the op compatible. Marking it incompatible makes DeepSpeed use
    ``torch.distributed``'s gloo all-reduce, as it does wherever the op cannot build: CPU
    training is for development and tests, where minutes of compilation cost more than a
    faster all-reduce saves. ``DBSPEC_DEEPSPEED_SHM=1`` leaves DeepSpeed's choice alone.
    """
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

        job = json.loads((Path(work_dir) / "job.json").read_text())
        if job["deepspeed"]:
            import deepspeed

            if not job["use_gpu"]:
                skip_cpu_shm_op()
            deepspeed.init_distributed(dist_backend=job["backend"])
        else:
            dist.init_process_group(job["backend"])
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        device = torch.device("cuda", local_rank) if job["use_gpu"] else torch.device("cpu")
        train_rank(Path(work_dir), rank, device)
        dist.destroy_process_group()
    except BaseException as exc:
        record_rank_failure(Path(work_dir), rank, exc)
        raise SystemExit(1) from None


def train_rank(work_dir: Path, rank: int, device) -> None:
    """One rank's training, in a process group its launcher has joined already: reads its
    shard, trains under DDP (or the DeepSpeed engine), rank 0 logs, checkpoints and writes the
    result; ends on a barrier, leaving the group to the launcher."""
    import contextlib
    import gc
    import time

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from dbspec.models.served import ModelCard, ServedModel
    from dbspec.spec.sections import Spec
    from dbspec.training.checkpoints import CheckpointStore
    from dbspec.training.loop import Tensors, train

    job = json.loads((work_dir / "job.json").read_text())
    if job["deepspeed"]:
        import deepspeed
    world = dist.get_world_size()
    spec = Spec.model_validate(job["spec"])
    card = ModelCard(**job["card"])
    torch.manual_seed(spec.training.seed)  # identical initial weights on every rank
    served = ServedModel(card)
    network = served.network.to(device)
    data = torch.load(work_dir / f"shard-{rank}.pt", weights_only=True)  # this rank's rows
    shard = len(data["x_train"])
    tensors = Tensors(data["x_train"].to(device), data["y_train"].to(device),
                      _to(data["x_val"], device), _to(data["y_val"], device))
    engine = None
    if job["deepspeed"]:
        from dbspec.training.components import build_optimizer

        engine, *_ = deepspeed.initialize(model=network,
                                          optimizer=build_optimizer(network,
                                                                    spec.training.optimizer),
                                          config=job["deepspeed"])
        model = _EngineModule(engine, engine.module.parameters().__next__().dtype)
    else:
        model = DistributedDataParallel(network,
                                        device_ids=[device.index] if device.type == "cuda"
                                        else None)
    checkpoints = None
    if engine is not None and job["deepspeed_checkpoint_dir"]:
        checkpoints = DeepspeedCheckpoints(engine, Path(job["deepspeed_checkpoint_dir"]),
                                           every=spec.training.checkpointing.every_n_epochs,
                                           keep=spec.training.checkpointing.keep_last,
                                           writer=rank == 0)
    elif job["checkpoint_dir"]:
        checkpoints = CheckpointStore(Path(job["checkpoint_dir"]), writer=rank == 0,
                                      every=spec.training.checkpointing.every_n_epochs,
                                      keep=spec.training.checkpointing.keep_last)
    logger = _RankZeroLogger(job["tracking"]) if rank == 0 and job["tracking"] else None

    def reduce_metrics(metrics: dict[str, float]) -> None:
        loss = torch.tensor([metrics["train_loss"]], device=device)
        dist.all_reduce(loss)
        metrics["train_loss"] = float(loss) / world

    def log_metrics(*, epoch: int, metrics: dict[str, float], **_: Any) -> None:
        if logger is not None:
            logger.log(metrics, epoch)
            if checkpoints is not None and checkpoints.due(epoch, last=False):
                # everything up to a checkpoint is in MLflow before the checkpoint exists, so a
                # run resumed from it after a crash (even a kill -9) has no gap of epochs
                logger.flush()
        # a test seam: a test stops one rank here to kill its node mid-training, on cue
        pause_point(f"train.rank{rank}.epoch.{epoch}")

    observer = None
    if rank == 0:  # rank 0 watches the run for everyone: monitor, TensorBoard, diagnosis
        from dbspec.monitoring.observer import TrainingObserver

        observer = TrainingObserver(spec, log_dir=work_dir / "tensorboard", say=lambda text: None)
        observer.__enter__()
        observer.attach(network, tensors.x_train[:2])
    started = time.perf_counter()
    from dbspec.training.fit import validation_scorer

    training = spec.training
    if engine is not None and spec.compute.zero_stage == 3 and training.early_stopping:
        # ZeRO-3 partitions the parameters: a copied state dict is not the whole model
        training = training.model_copy(update={"early_stopping": training.early_stopping
                                               .model_copy(update={"restore_best": False})})
    try:
        outcome = train(model, tensors, training, loss=card.loss, device=device,
                        epochs=job["epochs"], score_validation=validation_scorer(spec, served),
                        checkpoints=checkpoints, resume=job["resume"],
                        callbacks=([observer.callback] if observer else []) + [log_metrics],
                        engine=engine, reduce=reduce_metrics)
    except BaseException:
        if logger is not None:
            with contextlib.suppress(Exception):  # the failure itself is what matters
                logger.flush()
        raise
    seconds = time.perf_counter() - started
    weights = _full_state(network, engine, spec)
    (work_dir / f"rank-{rank}.json").write_text(json.dumps({
        "rank": rank, "rows": shard, "samples_per_second": outcome.samples_per_second,
        "seconds": seconds, "checksum": float(sum(v.double().sum() for v in weights.values()))}))
    if rank == 0:
        torch.save(weights, work_dir / "weights.pt")
        if logger is not None:
            logger.flush()
        record = {k: v for k, v in asdict(outcome).items()}
        record.update(world_size=world, backend=job["backend"])
        if observer is not None:
            findings = observer.finish(device=device.type, threads=torch.get_num_threads(),
                                       batch_size=training.batch_size)
            observer.__exit__(None, None, None)
            record["diagnosis"] = [f.text() for f in findings]
        (work_dir / "result.json").write_text(json.dumps(record, default=str))
    # measured here: ~30% of runs aborted at exit until the model and optimizer were released
    # and collected before tearing the process group down
    del model, network, served, outcome, engine
    gc.collect()
    dist.barrier()


class DeepspeedCheckpoints:
    """Checkpoints through ``engine.save_checkpoint``: every rank writes its ZeRO partition.

    Same interface as :class:`~dbspec.training.checkpoints.CheckpointStore`. The loop's own
    state (epoch, history, early stopping, random generators) travels as DeepSpeed's
    client state; the engine restores weights and optimizer partitions itself.
    """

    def __init__(self, engine, directory: Path, *, every: int, keep: int, writer: bool):
        self.engine, self.directory = engine, Path(directory)
        self.every, self.keep, self.writer = every, keep, writer

    def due(self, epoch: int, *, last: bool) -> bool:
        return last or (epoch + 1) % self.every == 0

    def epochs(self) -> list[int]:
        if not self.directory.is_dir():
            return []
        return sorted(int(p.name.split("-")[1]) for p in self.directory.glob("epoch-*")
                      if p.is_dir() and (p / ".complete").exists())

    def save(self, epoch: int, state: dict[str, Any]) -> Path:
        import torch.distributed as dist

        client = {k: v for k, v in state.items() if k not in ("network", "optimizer")}
        tag = f"epoch-{epoch}"
        self.engine.save_checkpoint(str(self.directory), tag=tag, client_state=client)
        dist.barrier()  # every partition is on disk before the checkpoint counts as complete
        if self.writer:
            (self.directory / tag / ".complete").touch()
            for old in self.epochs()[:-self.keep]:
                import shutil

                shutil.rmtree(self.directory / f"epoch-{old}", ignore_errors=True)
        return self.directory / tag

    def load_latest(self) -> Optional[dict[str, Any]]:
        epochs = self.epochs()
        if not epochs:
            return None
        _, client = self.engine.load_checkpoint(str(self.directory), tag=f"epoch-{epochs[-1]}")
        return client

    def clear(self) -> None:
        """Cleared by the driver before launch, like the single-process store."""


def _full_state(network, engine, spec) -> dict:
    """The complete float32 weights (gathered from every rank under ZeRO-3)."""
    import contextlib

    gather = contextlib.nullcontext()
    if engine is not None and spec.compute.zero_stage == 3:
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


def _to(tensor, device):
    return tensor.to(device) if tensor is not None else None


class _RankZeroLogger:
    """Rank 0's per-epoch metrics to the driver's MLflow run, sent in batches."""

    def __init__(self, tracking: dict[str, str]):
        import mlflow

        self.client = mlflow.MlflowClient(tracking_uri=tracking["uri"])
        self.run_id = tracking["run_id"]
        self.buffer: list[Any] = []

    def log(self, metrics: dict[str, float], step: int) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)  # the epoch's real time, not MLflow's 1970
        self.buffer.extend(Metric(k, float(v), now, step) for k, v in metrics.items()
                           if v is not None)
        if len(self.buffer) > 500:
            self.flush()

    def flush(self) -> None:
        for start in range(0, len(self.buffer), 1000):
            self.client.log_batch(self.run_id, metrics=self.buffer[start:start + 1000])
        self.buffer = []
