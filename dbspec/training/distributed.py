"""DistributedDataParallel training launched by pyspark's ``TorchDistributor`` (or DeepSpeed's,
or Ray Train's ``TorchTrainer`` through :mod:`dbspec.training.ray_launch`): the driver's side.

The driver writes the prepared tensors (one shard per rank) and a
:class:`~dbspec.training.job.RankJob` to a work directory; every rank reads them and trains
(:mod:`dbspec.training.rank`). Results come back through files, never through the
distributor's return value (measured here: in local mode it comes from an arbitrary rank,
often ``None``), and the driver checks for rank 0's result explicitly, because a failing rank
can return without an exception.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from dbspec.tracking.metrics import TrackingTarget
from dbspec.training.job import DistributedError, RankJob, RankResult, rank_errors
from dbspec.training.rank import rank_main


def _quiet(text: str) -> None:
    """No progress lines."""


@dataclass(frozen=True)
class DistributedRun:
    """How the driver runs one distributed training, besides the spec.

    Attributes:
        work_dir: Shared directory for the job, the shards, the per-rank records and the
            result.
        epochs: Epoch override (smoke runs).
        resume: Continue from the newest checkpoint in ``checkpoint_dir``.
        tracking: The MLflow run rank 0 logs each epoch to, or None.
        checkpoint_dir: Where the ranks checkpoint, or None.
        say: Progress lines for people (the reporter's ``line``).
        shards: The shard set every rank streams its part of each epoch from
            (``data.streaming``); the tensors are then None and no per-rank file is written.
    """

    work_dir: Path
    epochs: Optional[int] = None
    resume: bool = False
    tracking: Optional[TrackingTarget] = None
    checkpoint_dir: Optional[Path] = None
    say: Callable[[str], None] = _quiet
    shards: Optional[Path] = None


def launch(spec, tensors_cpu, card, run: DistributedRun) -> RankResult:
    """Train on the compute's ranks; returns rank 0's result.

    Args:
        spec: The validated spec (``compute.kind`` torch_distributor, deepspeed or ray).
        tensors_cpu: Preprocessed inputs and training targets on the CPU.
        card: The served model's card (to rebuild the network on every rank).
        run: Work directory, epochs, resume, tracking, checkpoints, progress lines.

    Raises:
        DistributedError: a rank failed (its error is in the message) or no result appeared.
        DbspecError: ``compute.kind: ray`` without Ray installed.
    """
    if spec.compute.kind == "ray":
        from dbspec.training.ray_launch import require_ray

        require_ray()  # before any file is written
    job = rank_job(spec, card, run)
    work_dir = Path(run.work_dir).resolve()  # ranks may run in another working directory
    if run.shards is not None:
        from dbspec.data.shards import open_shard_set
        from dbspec.data.stream import epoch_plan
        from dbspec.training.streamed import stream_settings

        shards = open_shard_set(run.shards).shards("train")  # enough rows for every rank?
        epoch_plan(shards, stream_settings(spec), epoch=0, world=world_size(spec.compute))
    _prepare_work_dir(work_dir, tensors_cpu, world_size(spec.compute))
    job.write(work_dir)
    if spec.compute.kind == "ray":
        from dbspec.training.ray_launch import run_on_ray

        where = run_on_ray(spec, work_dir, use_gpu=job.use_gpu, backend=job.backend,
                           say=run.say)
        return _result(work_dir).with_placement(f"on Ray Train workers: {where}")
    _run_distributor(spec.compute, job, work_dir)
    return _result(work_dir)


def rank_job(spec, card, run: DistributedRun) -> RankJob:
    """The job every rank reads: GPU use, backend and DeepSpeed config resolved here."""
    import torch

    compute = spec.compute
    use_gpu = torch.cuda.is_available() if compute.use_gpu == "auto" else bool(compute.use_gpu)
    backend = getattr(compute, "backend", "auto")
    backend = backend if backend != "auto" else ("nccl" if use_gpu else "gloo")
    ds_config = None
    if compute.kind == "deepspeed":
        from dbspec.training.deepspeed_config import check_deepspeed_config, deepspeed_config

        ds_config = deepspeed_config(spec, use_gpu=use_gpu)
        check_deepspeed_config(ds_config)
    checkpoint_dir = Path(run.checkpoint_dir).resolve() if run.checkpoint_dir else None
    return RankJob(spec=spec, card=card, backend=backend, use_gpu=use_gpu, epochs=run.epochs,
                   resume=run.resume, tracking=run.tracking, deepspeed=ds_config,
                   checkpoint_dir=checkpoint_dir,
                   shards=Path(run.shards).resolve() if run.shards is not None else None)


def _prepare_work_dir(work_dir: Path, tensors_cpu, world: int) -> None:
    """Remove an earlier launch's records and write this one's shards."""
    work_dir.mkdir(parents=True, exist_ok=True)
    for stale in [*work_dir.glob("rank-*"), *work_dir.glob("shard-*.pt"),
                  work_dir / "result.json", work_dir / "weights.pt"]:
        stale.unlink(missing_ok=True)
    if tensors_cpu is not None:  # streamed data: every rank reads the shard set itself
        _write_shards(tensors_cpu, work_dir, world)


def _run_distributor(compute, job: RankJob, work_dir: Path) -> None:
    """Start :func:`~dbspec.training.rank.rank_main` on every rank through TorchDistributor or
    DeepSpeed's distributor; a failure is worded from the ranks' own records."""
    if job.deepspeed is not None:
        from pyspark.ml.deepspeed.deepspeed_distributor import DeepspeedTorchDistributor

        distributor = DeepspeedTorchDistributor(
            numGpus=compute.num_gpus, nnodes=compute.num_nodes, localMode=compute.local_mode,
            useGpu=job.use_gpu, deepspeedConfig=job.deepspeed)
    else:
        from pyspark.ml.torch.distributor import TorchDistributor

        distributor = TorchDistributor(num_processes=compute.num_processes,
                                       local_mode=compute.local_mode, use_gpu=job.use_gpu)
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


def world_size(compute) -> int:
    """How many ranks the compute trains on."""
    if compute.kind == "deepspeed":
        return compute.num_gpus * compute.num_nodes
    if compute.kind == "ray":
        return compute.num_workers
    return compute.num_processes


def _result(work_dir: Path) -> RankResult:
    """Rank 0's result, once the launcher returned; the shards are removed."""
    result = RankResult.read(work_dir)
    if result is None:
        raise DistributedError("training ranks ended without a result: "
                               + (rank_errors(work_dir) or "no rank reported an error"))
    for shard in work_dir.glob("shard-*.pt"):
        shard.unlink(missing_ok=True)  # inputs can be large; checkpoints and results stay
    return result


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
