"""The driver's side of training on a compute kind's ranks (pyspark's ``TorchDistributor`` or
DeepSpeed's, Ray Train through :mod:`dbspec.training.ray_launch`, or a plugin's launcher).

The driver writes one shard per rank and a :class:`~dbspec.training.job.RankJob` to a work
directory; every rank trains from them (:mod:`dbspec.training.rank`). Results come back
through files, never the distributor's return value (measured: in local mode it comes from an
arbitrary rank, often ``None``), and rank 0's result is checked for explicitly, because a
failing rank can return without an exception.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from dbspec.errors import DbspecError
from dbspec.seams.compute import compute_kind
from dbspec.training.job import DistributedError, RankJob, RankReport, RankResult, rank_errors
from dbspec.training.rank import rank_main

if TYPE_CHECKING:
    from dbspec.training.fit import FitOptions


def launch(spec, tensors_cpu, served, *, options: FitOptions, shards: Optional[Path] = None):
    """Train on the compute kind's ranks; the weights and records come back through files.

    ``tensors_cpu`` are the prepared rows, or None when every rank streams its part of each
    epoch from the shard set at ``shards``. Returns the served model with rank 0's weights
    (eval mode) and the loop's outcome, its ``extra`` holding world size, backend, rank 0's
    diagnosis, placement and every rank's report.

    Raises:
        DistributedError: a rank failed (its error is in the message) or no result appeared.
        DbspecError: the kind cannot run here (a missing package, a refused config).
    """
    import torch

    if options.work_dir is None:
        raise DbspecError("distributed training needs a work directory")
    kind = compute_kind(spec)
    kind.check_runnable(spec, quick=False)  # before any file is written
    settings = kind.rank_settings(spec)
    checkpoints = options.checkpoints
    # absolute paths: ranks may run in another working directory
    job = RankJob(spec=spec, card=served.card, backend=settings.backend,
                  use_gpu=settings.use_gpu, epochs=options.epochs, resume=options.resume,
                  tracking=options.tracking, deepspeed=settings.engine_config,
                  checkpoint_dir=checkpoints.directory.resolve() if checkpoints else None,
                  shards=shards.resolve() if shards is not None else None)
    work_dir = Path(options.work_dir).resolve()
    world = kind.world_size(spec.compute)
    if shards is not None:
        from dbspec.data.shards import open_shard_set
        from dbspec.data.stream import epoch_plan
        from dbspec.training.streamed import stream_settings

        train_shards = open_shard_set(shards).shards("train")  # enough rows for every rank?
        epoch_plan(train_shards, stream_settings(spec), epoch=0, world=world)
    _prepare_work_dir(work_dir, tensors_cpu, world)
    job.write(work_dir)
    placement = kind.start_ranks(spec, settings, work_dir, options.say)
    result = _result(work_dir).with_placement(placement)
    served.network.load_state_dict(torch.load(work_dir / "weights.pt", weights_only=True))
    outcome = result.outcome
    outcome.extra = {"world_size": result.world_size, "backend": result.backend,
                     "diagnosis": list(result.diagnosis),
                     **({"placement": result.placement} if result.placement else {}),
                     "ranks": [asdict(report) for report in RankReport.read_all(work_dir)]}
    return served.eval(), outcome


def _prepare_work_dir(work_dir: Path, tensors_cpu, world: int) -> None:
    """Remove an earlier launch's records and write this one's shards."""
    work_dir.mkdir(parents=True, exist_ok=True)
    for stale in [*work_dir.glob("rank-*"), *work_dir.glob("shard-*.pt"),
                  work_dir / "result.json", work_dir / "weights.pt"]:
        stale.unlink(missing_ok=True)
    if tensors_cpu is not None:  # streamed data: every rank reads the shard set itself
        _write_shards(tensors_cpu, work_dir, world)


def run_distributor(distributor, work_dir: Path, *, watch_executors: bool) -> None:
    """Start :func:`~dbspec.training.rank.rank_main` on every rank through the kind's pyspark
    distributor (``TorchDistributor``, ``DeepspeedTorchDistributor``); a failure is worded
    from the ranks' own records. ``watch_executors``: the ranks are Spark tasks, so the job is
    stopped at the first lost executor."""
    watch = RankWatcher(distributor.spark) if watch_executors else None
    try:
        with watch or contextlib.nullcontext():
            distributor.run(rank_main, str(work_dir))
    except Exception as exc:  # the distributor wraps rank failures in several types
        from dbspec.spark.session import python_cause

        causes = [c for c in (watch.lost() if watch else "", rank_errors(work_dir)) if c]
        raise DistributedError(f"{type(distributor).__name__} failed: "
                               f"{'; '.join(causes) or python_cause(exc)}") from None


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
    """One equal shard file per rank, plus the validation rows (DDP needs equal step counts)."""
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
    """Cancels a barrier training job at its first failed task or lost executor (noting which):
    Spark would retry the stage and wait minutes for lost slots, survivors for gloo's timeout."""

    def __init__(self, spark, interval: float = 0.5):
        self.context = spark.sparkContext
        self.interval = interval
        self.group = f"dbspec-train-{os.getpid()}-{id(self)}"
        self.gone: list[str] = []

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
        if not self.gone:  # the job failed before the next poll (a loaded driver): look once more
            self.gone = sorted(self.known - (self._executors() or self.known))
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
