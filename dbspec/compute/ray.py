"""``compute.kind: ray``: DistributedDataParallel on Ray Train workers, in a Ray cluster
started on Spark (:mod:`dbspec.training.ray_launch`)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, ClassVar, Literal, Mapping, Optional

from dbspec.compute.common import Backend, GpuChoice, RankKind
from dbspec.seams.compute import RankSettings
from dbspec.spec.databricks import Resources
from dbspec.spec.sections.base import SpecModel, d


class RayCompute(SpecModel):
    """DistributedDataParallel on Ray Train workers, in a Ray cluster started on Spark."""

    kind: Literal["ray"] = d("DDP through Ray Train's TorchTrainer on a Ray-on-Spark cluster "
                             "(ray.util.spark.setup_ray_cluster); needs 'dbspec[ray]'.")
    num_workers: int = d("Ray Train workers: training processes (one GPU each when use_gpu).",
                         default=2, ge=1)
    use_gpu: GpuChoice = d("Use GPUs (nccl) or CPUs (gloo); auto: GPUs when present.",
                           default="auto")
    cpus_per_worker: int = d("CPUs each training worker reserves.", default=1, ge=1)
    backend: Backend = d("Process-group backend; auto: nccl on GPU, gloo on CPU.",
                         default="auto")


class RayKind(RankKind):
    """``num_workers`` Ray Train workers on a Ray-on-Spark cluster."""

    name = "ray"
    model = RayCompute
    extras: ClassVar[Mapping[str, str]] = {"ray": "ray"}

    def check_runnable(self, spec, *, quick: bool) -> None:
        """Ray Train and Ray on Spark are installed (``quick``: without importing Ray)."""
        from dbspec.training.ray_launch import require_ray

        require_ray(quick=quick)

    def world_size(self, compute) -> int:
        return compute.num_workers

    def remote_ranks(self, compute) -> Optional[str]:
        """Always Spark tasks: Ray's worker nodes run as Spark tasks."""
        return "training ranks (Ray Train workers on Ray-on-Spark worker nodes)"

    def resources(self, compute) -> Resources:
        """One Spark worker per training worker, with a GPU each unless ``use_gpu: false``."""
        return Resources(1 if compute.use_gpu is not False else 0, compute.num_workers, True)

    def start_ranks(self, spec, settings: RankSettings, work_dir: Path,
                    say: Callable[[str], None]) -> Optional[str]:
        from dbspec.training.ray_launch import run_on_ray

        where = run_on_ray(spec, work_dir, use_gpu=settings.use_gpu, backend=settings.backend,
                           say=say)
        return f"on Ray Train workers: {where}"


KIND = RayKind()
