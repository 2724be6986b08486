"""``compute.kind: toy``: a compute kind from an installed package (dbspec's plugin test).

It trains in this process on the CPU like ``kind: local``, with one setting of its own
(``threads``) and one check at validate that can fail.
"""

from __future__ import annotations

from typing import Literal

from dbspec.compute.common import InProcessKind
from dbspec.seams.compute import ComputeFinding
from dbspec.spec.sections.base import SpecModel, d


class ToyCompute(SpecModel):
    """One process on the CPU with a fixed number of intra-op threads."""

    kind: Literal["toy"] = d("The toy plugin's compute kind.")
    threads: int = d("Intra-op threads; at most training.batch_size.", default=1, ge=1)


class ToyKind(InProcessKind):
    """Train in this process on the CPU."""

    name = "toy"
    model = ToyCompute

    def check(self, spec):
        """More threads than rows in a batch is refused."""
        if spec.compute.threads > spec.training.batch_size:
            yield ComputeFinding(("compute", "threads"), f"{spec.compute.threads} threads for "
                                 f"batches of {spec.training.batch_size} rows; use at most "
                                 f"{spec.training.batch_size}")

    def device(self, compute):
        """The CPU, with ``threads`` intra-op threads."""
        import torch

        torch.set_num_threads(compute.threads)
        return torch.device("cpu")


KIND = ToyKind()
