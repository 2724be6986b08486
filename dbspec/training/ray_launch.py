"""``compute.kind: ray``: the DDP ranks as Ray Train workers in a Ray cluster started on Spark.

The work directory is prepared as for TorchDistributor (:mod:`dbspec.training.distributed`);
:func:`run_on_ray` starts Ray on the active Spark session (``setup_ray_cluster``: a head node on
the driver, worker nodes as Spark tasks; sized by :mod:`dbspec.training.ray_sizing`) and runs
``TorchTrainer`` with one worker per rank, each running
:func:`~dbspec.training.rank.train_rank`. Ray's retries are off (``max_failures=0``): a failed
run is resumed with ``dbspec run --resume`` from dbspec's checkpoints, as with the other engines.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from pathlib import Path
from typing import Any, Callable, Collection, ContextManager, Iterator, Optional

from dbspec.errors import DbspecError
from dbspec.training.ray_sizing import ray_layout

RAY_INSTALL = "pip install 'dbspec[ray]'"
#: Environment the training workers get from the driver, as torchrun's ranks do by inheritance
#: (Ray workers start from the worker node's environment instead): the import path of a custom
#: network, dbspec's switches, and the tracking server's address and credentials for rank 0.
PROPAGATED_ENV = ("PYTHONPATH",)
PROPAGATED_PREFIXES = ("DBSPEC_", "MLFLOW_", "DATABRICKS_")


def require_ray(*, quick: bool = False) -> None:
    """Ray Train and Ray on Spark are importable (``quick``: Ray is installed, checked without
    importing it, which takes seconds); a :class:`DbspecError` names the extra to install."""
    from importlib.util import find_spec

    try:
        if quick and find_spec("ray") is None:
            raise ImportError("no module named 'ray'")
        if not quick:
            import ray.train  # noqa: F401
            import ray.util.spark  # noqa: F401
    except ImportError as exc:
        raise DbspecError(f"compute.kind ray needs Ray Train and Ray on Spark: {RAY_INSTALL} "
                          f"({exc})") from None


def run_on_ray(spec, work_dir: Path, *, use_gpu: bool, backend: str,
               say: Callable[[str], None] = lambda text: None) -> str:
    """Train the prepared job in ``work_dir`` on ``compute.num_workers`` Ray Train workers;
    returns where they ran, in words.

    Raises:
        DistributedError: Ray could not start, or a worker failed (its Python error).
    """
    import shutil

    from dbspec.training.job import DistributedError, rank_errors

    require_ray()
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise DbspecError("compute.kind ray starts Ray on Spark: pip install 'dbspec[spark]'") \
            from None
    session = SparkSession.getActiveSession()
    if session is None:
        raise DistributedError("compute.kind ray starts Ray on a Spark session; none is active")
    compute = spec.compute
    storage = work_dir / "ray"
    shutil.rmtree(storage, ignore_errors=True)  # Ray Train's run state of an earlier launch
    with ray_on_spark(session, compute, use_gpu=use_gpu, say=say) as where:
        trainer = _trainer(compute, work_dir, storage, use_gpu=use_gpu, backend=backend)
        started = time.perf_counter()
        try:
            trainer.fit()
        except Exception as exc:  # WorkerGroupError, ControllerError, an actor that died
            # the ranks' own records first; Ray's word for the ranks that left none (a worker
            # whose process or node died)
            recorded = {int(p.stem.split("-")[1]) for p in work_dir.glob("rank-*.error")}
            causes = [c for c in (rank_errors(work_dir), worker_cause(exc, skip=recorded)) if c]
            raise DistributedError(f"Ray Train failed: {'; '.join(causes)}") from None
        say(f"  Ray Train: {compute.num_workers} worker{'s' if compute.num_workers > 1 else ''} "
            f"({backend}) trained in {time.perf_counter() - started:.0f} s")
    return where


def _trainer(compute, work_dir: Path, storage: Path, *, use_gpu: bool, backend: str):
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    resources = {"CPU": compute.cpus_per_worker, **({"GPU": 1} if use_gpu else {})}
    return TorchTrainer(
        _worker_loop, train_loop_config={"work_dir": str(work_dir), "use_gpu": use_gpu},
        torch_config=TorchConfig(backend=backend),
        scaling_config=ScalingConfig(num_workers=compute.num_workers, use_gpu=use_gpu,
                                     resources_per_worker=resources),
        run_config=RunConfig(name="train", storage_path=str(storage),
                             failure_config=FailureConfig(max_failures=0),
                             worker_runtime_env={"env_vars": propagated_env()}))


def propagated_env(environ: Optional[dict[str, str]] = None) -> dict[str, str]:
    """The driver's variables the training workers get (see :data:`PROPAGATED_ENV`)."""
    environ = os.environ if environ is None else environ
    return {k: v for k, v in environ.items()
            if k in PROPAGATED_ENV or k.startswith(PROPAGATED_PREFIXES)}


def _worker_loop(config: dict[str, Any]) -> None:
    """One Ray Train worker: Ray Train has joined the process group; the rank body is
    :func:`~dbspec.training.rank.train_rank`, as under TorchDistributor."""
    import ray.train
    import torch

    from dbspec.training.job import record_rank_failure
    from dbspec.training.rank import train_rank

    work_dir = Path(config["work_dir"])
    rank = ray.train.get_context().get_world_rank()
    try:
        if config["use_gpu"]:
            from ray.train.torch import get_device

            device = get_device()  # the GPU Ray assigned to this worker
        else:
            device = torch.device("cpu")
        train_rank(work_dir, rank, device)
    except BaseException as exc:
        record_rank_failure(work_dir, rank, exc)
        raise


def ray_on_spark(session, compute, *, use_gpu: bool,
                 say: Callable[[str], None] = lambda text: None) -> ContextManager[str]:
    """A Ray cluster for ``compute``, connected, for the block; yields where it runs, in words.

    A cluster this process already uses (``ray.init`` called, or ``RAY_ADDRESS`` set, as
    ``setup_ray_cluster`` in a notebook does) is used and left running; otherwise one is
    started on ``session`` and shut down afterwards (:class:`DistributedError` when it cannot
    start, or starts without room for the workers).
    """
    import ray

    if ray.is_initialized() or os.environ.get("RAY_ADDRESS"):
        return _running_cluster(compute, use_gpu=use_gpu, say=say)
    return _cluster_on_spark(session, compute, use_gpu=use_gpu, say=say)


def _needed(compute, use_gpu: bool) -> tuple[int, int]:
    """The CPUs and GPUs the training workers need in all."""
    return compute.num_workers * compute.cpus_per_worker, compute.num_workers if use_gpu else 0


@contextlib.contextmanager
def _running_cluster(compute, *, use_gpu: bool, say: Callable[[str], None]) -> Iterator[str]:
    """The Ray cluster this process uses already, or the one ``RAY_ADDRESS`` names (joined for
    the block, then left); the cluster itself is left running."""
    import ray

    from dbspec.training.job import DistributedError

    need_cpus, need_gpus = _needed(compute, use_gpu)
    joined = not ray.is_initialized()
    if joined:
        try:
            with _quiet_ray():
                ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=False)
        except Exception as exc:
            raise DistributedError(f"RAY_ADDRESS={os.environ['RAY_ADDRESS']}: cannot join "
                                   f"that Ray cluster: {_causes(exc)}") from None
    have = ray.cluster_resources()
    where = f"the running Ray cluster ({have.get('CPU', 0):.0f} CPUs, " \
            f"{have.get('GPU', 0):.0f} GPUs; left running)"
    say(f"  Ray: using {where}")
    if have.get("CPU", 0) < need_cpus or have.get("GPU", 0) < need_gpus:
        say(f"  Ray: the workers need {need_cpus} CPUs and {need_gpus} GPUs; Ray Train "
            "waits until the cluster has them")
    try:
        yield where
    finally:
        if joined:
            ray.shutdown()


@contextlib.contextmanager
def _cluster_on_spark(session, compute, *, use_gpu: bool,
                      say: Callable[[str], None]) -> Iterator[str]:
    """A Ray cluster started on ``session`` for the block (``setup_ray_cluster``), connected,
    and shut down afterwards."""
    import ray
    import torch
    from ray.util.spark import setup_ray_cluster

    from dbspec.spark.placement import is_local_master
    from dbspec.spark.session import environment_variable
    from dbspec.training.job import DistributedError

    need_cpus, need_gpus = _needed(compute, use_gpu)
    context = session.sparkContext
    master = context.master
    if use_gpu and is_local_master(master) and torch.cuda.device_count() < need_gpus:
        raise DistributedError(f"compute.num_workers: {need_gpus} GPU workers need {need_gpus} "
                               f"GPUs on this machine (local Spark master); "
                               f"{torch.cuda.device_count()} present")
    layout = ray_layout(compute, use_gpu=use_gpu, master=master,
                        task_cpus=int(context.getConf().get("spark.task.cpus", "1")),
                        parallelism=context.defaultParallelism)
    say(f"  Ray on Spark: starting a head node on the driver, training on {layout.where}")
    started = time.perf_counter()
    # a ~/.ray/auth_token that any local ray.init() leaves turns token auth on for the head
    # node, which the worker nodes in Spark tasks then fail (InvalidAuthToken): the cluster
    # lives for this stage only, so its mode is stated (a user's RAY_AUTH_MODE is kept)
    auth_mode = None if "RAY_AUTH_MODE" in os.environ else "disabled"
    with environment_variable("RAY_AUTH_MODE", auth_mode):
        try:
            try:
                with _quiet_ray():
                    address, _ = setup_ray_cluster(**layout.setup_arguments())
                    ray.init(address=address, log_to_driver=False)
            except Exception as exc:
                raise DistributedError(f"Ray on Spark could not start: {_causes(exc)}") from None
            have = ray.cluster_resources()
            if have.get("CPU", 0) < need_cpus or have.get("GPU", 0) < need_gpus:
                raise DistributedError(
                    f"Ray on Spark started with {have.get('CPU', 0):.0f} CPUs and "
                    f"{have.get('GPU', 0):.0f} GPUs; compute.num_workers "
                    f"{compute.num_workers} x cpus_per_worker {compute.cpus_per_worker} need "
                    f"{need_cpus} CPUs{f' and {need_gpus} GPUs' if need_gpus else ''}: the "
                    f"Spark cluster {master} has no room for the worker nodes")
            say(f"  Ray cluster up in {time.perf_counter() - started:.0f} s "
                f"({have.get('CPU', 0):.0f} CPUs, {have.get('GPU', 0):.0f} GPUs)")
            yield layout.where
        finally:
            _shut_down_spark_cluster()


def _shut_down_spark_cluster() -> None:
    """Disconnect and stop the Ray-on-Spark cluster, its head node's last words kept quiet."""
    import ray
    from ray.util.spark import shutdown_ray_cluster

    with _quiet_ray():
        head = _head_process()
        with contextlib.suppress(Exception):
            ray.shutdown()
        with contextlib.suppress(Exception):  # nothing to shut down when it never started
            shutdown_ray_cluster()
        if head is not None:  # its last words come while the quiet lasts
            with contextlib.suppress(Exception):
                head.wait(timeout=15)


def _head_process():
    """The active Ray-on-Spark cluster's head node process, or None (a Ray internal, only read
    to wait for the head's exit)."""
    from ray.util.spark import cluster_init

    return getattr(getattr(cluster_init, "_active_ray_cluster", None), "head_proc", None)


@contextlib.contextmanager
def _quiet_ray() -> Iterator[None]:
    """Ray's start-up chatter off stdout (``setup_ray_cluster`` copies the head node's output
    there) and its INFO logging (sizing advice for general workloads) off stderr."""
    import io

    loggers = [logging.getLogger(name) for name in (
        "ray", "ray._private.worker", "ray.util.spark",
        "ray.autoscaler._private.spark.spark_job_server")]  # ray.init resets "ray" to INFO
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def _causes(exc: BaseException) -> str:
    """The first line of an exception and of each cause under it."""
    parts: list[str] = []
    seen: Optional[BaseException] = exc
    while seen is not None and len(parts) < 4:
        text = str(seen).strip().splitlines()
        parts.append(f"{type(seen).__name__}: {text[0][:300]}" if text else type(seen).__name__)
        seen = seen.__cause__ or seen.__context__
    return "; ".join(parts)


def worker_cause(exc: BaseException, skip: Collection[int] = ()) -> str:
    """The workers' Python errors out of a Ray Train failure, one line each, no traceback
    (``skip``: ranks already worded; '' when only those failed)."""
    failures = getattr(exc, "worker_failures", None)
    if failures:
        return "; ".join(f"rank-{rank}: {type(error).__name__}: "
                         f"{(str(error).strip().splitlines() or [''])[0][:300]}"
                         for rank, error in sorted(failures.items()) if rank not in skip)
    inner = getattr(exc, "controller_failure", None)
    if inner is not None:
        return _causes(inner)
    return _causes(exc)
