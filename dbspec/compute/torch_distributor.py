"""``compute.kind: torch_distributor``: DistributedDataParallel launched by pyspark's
``TorchDistributor``, on the driver (``local_mode``) or on Spark executors."""

from __future__ import annotations

from typing import Iterator, Literal

from dbspec.compute.common import NO_RESOURCES, Backend, GpuChoice, RankKind
from dbspec.seams.compute import ComputeFinding, RankSettings
from dbspec.spec.databricks import Resources
from dbspec.spec.sections.base import SpecModel, d


class TorchDistributorCompute(SpecModel):
    """DistributedDataParallel launched by pyspark's TorchDistributor."""

    kind: Literal["torch_distributor"] = d("DDP through pyspark.ml.torch.distributor.TorchDistributor.")
    num_processes: int = d("Training processes (one per GPU when use_gpu).", default=2, ge=1)
    use_gpu: GpuChoice = d("Use GPUs (nccl) or CPUs (gloo); auto: GPUs when present.",
                           default="auto")
    local_mode: bool = d("Run the processes on the driver instead of on Spark executors.",
                         default=True)
    backend: Backend = d("Process-group backend; auto: nccl on GPU, gloo on CPU.",
                         default="auto")


class TorchDistributorKind(RankKind):
    """``num_processes`` DDP ranks started by ``TorchDistributor``."""

    name = "torch_distributor"
    model = TorchDistributorCompute

    def check(self, spec) -> Iterator[ComputeFinding]:
        if spec.compute.backend == "nccl" and spec.compute.use_gpu is False:
            yield ComputeFinding(("compute", "backend"),
                                 "nccl needs GPUs; use gloo, or use_gpu: true")

    def world_size(self, compute) -> int:
        return compute.num_processes

    def resources(self, compute) -> Resources:
        """On the driver: one GPU per process on one node; on executors: one GPU per worker."""
        if compute.use_gpu is False:
            return NO_RESOURCES
        if compute.local_mode:
            return Resources(compute.num_processes, 0, False)
        return Resources(1, compute.num_processes, True)

    def distributor(self, compute, settings: RankSettings):
        from pyspark.ml.torch.distributor import TorchDistributor

        return TorchDistributor(num_processes=compute.num_processes,
                                local_mode=compute.local_mode, use_gpu=settings.use_gpu)


KIND = TorchDistributorKind()
