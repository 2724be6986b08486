"""``compute.kind: single_gpu``: one process on one CUDA GPU; fails clearly without one."""

from __future__ import annotations

from typing import Literal

from dbspec.compute.common import InProcessKind
from dbspec.errors import DbspecError
from dbspec.spec.databricks import Resources
from dbspec.spec.sections.base import SpecModel, d


class SingleGpuCompute(SpecModel):
    """One process on one CUDA GPU; fails clearly when there is none."""

    kind: Literal["single_gpu"] = d("One process on one GPU.")
    device_index: int = d("Which CUDA device.", default=0, ge=0)


class SingleGpuKind(InProcessKind):
    """Train in this process on CUDA device ``device_index``."""

    name = "single_gpu"
    model = SingleGpuCompute

    def device(self, compute):
        import torch

        if not torch.cuda.is_available():
            raise DbspecError("compute.kind single_gpu: no CUDA GPU is visible to this process "
                              "(torch.cuda.is_available() is False); use kind: local to train "
                              "on the CPU")
        if compute.device_index >= torch.cuda.device_count():
            raise DbspecError(f"compute.device_index {compute.device_index}: only "
                              f"{torch.cuda.device_count()} GPU(s) present")
        return torch.device("cuda", compute.device_index)

    def gpu_expected(self, compute) -> bool:
        return True

    def resources(self, compute) -> Resources:
        return Resources(1, 0, False)


KIND = SingleGpuKind()
