"""``compute.kind: local``: one process on this machine (CUDA when present)."""

from __future__ import annotations

from typing import Literal

from dbspec.compute.common import NO_RESOURCES, InProcessKind
from dbspec.spec.databricks import Resources
from dbspec.spec.sections.base import SpecModel, d


class LocalCompute(SpecModel):
    """One process on this machine."""

    kind: Literal["local"] = d("One process; CUDA when present (device: auto).")
    device: Literal["auto", "cpu", "cuda", "mps"] = d("Device; auto picks CUDA when present.",
                                                      default="auto")


class LocalKind(InProcessKind):
    """Train in this process on ``compute.device``."""

    name = "local"
    model = LocalCompute

    def gpu_expected(self, compute) -> bool:
        return compute.device == "cuda"

    def resources(self, compute) -> Resources:
        return Resources(1, 0, False) if compute.device == "cuda" else NO_RESOURCES


KIND = LocalKind()
