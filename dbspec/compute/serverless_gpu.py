"""``compute.kind: serverless_gpu``: Databricks AI Runtime (see :class:`ServerlessGpuCompute`)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any, Callable, Iterator, Literal, Optional, get_args

from pydantic import AfterValidator

from dbspec.compute.common import InProcessKind, resolve_backend
from dbspec.compute.deepspeed import (Offload, config_findings, check_deepspeed_config,
                                      deepspeed_config)
from dbspec.seams.compute import ComputeFinding, RankSettings
from dbspec.spec.databricks import EXPERIMENT_NAME, experiment_location
from dbspec.spec.sections.base import SpecModel, d, section

#: AI Runtime (serverless GPU) accelerator types, as databricks-sdk's
#: ``jobs.ComputeSpecAcceleratorType`` names them (a test keeps the two equal); the number
#: after ``GPU_`` is the GPUs per node.
Accelerator = Literal["GPU_1xA10", "GPU_1xH100", "GPU_8xB300", "GPU_8xH100"]
AI_RUNTIME_ACCELERATORS = get_args(Accelerator)


def _environment(value: str) -> str:
    if not re.fullmatch(r"[0-9]+|databricks_ai_v([5-9]|[1-9][0-9]+)", value):
        raise ValueError(f"'{value}' is no AI Runtime environment: a version number such as "
                         "'4' or '5', or 'databricks_ai_v<N>' with N >= 5")
    return value


class ServerlessGpuCompute(SpecModel):
    """Databricks AI Runtime (serverless GPU): an ``ai_runtime_task`` in jobs; here, one process
    on this machine's GPU when there is one, else the CPU (as ``kind: local``)."""

    kind: Literal["serverless_gpu"] = d("AI Runtime serverless GPU compute.")
    accelerator: Accelerator = d("Accelerator type; GPU_8x... means eight GPUs per node.",
                                 default="GPU_1xA10")
    count: int = d("Total accelerators across all nodes; a multiple of the GPUs per node.",
                   default=1, ge=1)
    environment: Annotated[str, AfterValidator(_environment)] = d(
        "The job's AI Runtime environment: a serverless GPU environment version ('4', '5', ...) "
        "or the Databricks AI environment, 'databricks_ai_v<N>' (N >= 5, PyTorch preinstalled).",
        default="4")
    provisioned_capacity_id: Optional[str] = d("A reserved-capacity id to run on instead of "
                                               "on-demand capacity.", default=None, min_length=1)
    strategy: Literal["ddp", "deepspeed"] = d(
        "With count > 1: one torchrun rank per GPU on every node, under DDP or DeepSpeed ZeRO.",
        default="ddp")
    zero_stage: Literal[0, 1, 2, 3] = d("ZeRO stage (strategy deepspeed).", default=2)
    offload: Offload = section("ZeRO offload targets (strategy deepspeed).")
    config: dict[str, Any] = d("Extra DeepSpeed config (strategy deepspeed), merged over the "
                               "generated one and checked with DeepSpeed's classes.", default={})

    @property
    def device(self) -> str:
        """Locally the training takes a GPU when present (as ``kind: local``, ``device: auto``)."""
        return "auto"

    @property
    def gpus_per_node(self) -> int:
        """GPUs per node, from the accelerator name."""
        return int(self.accelerator.split("_")[1].split("x")[0])


class ServerlessGpuKind(InProcessKind):
    """AI Runtime in jobs; one GPU: ``device: auto`` in this process; several: torchrun ranks
    on every node (here: ``count`` ranks on this machine)."""

    name = "serverless_gpu"
    model = ServerlessGpuCompute
    serverless = True

    def check(self, spec) -> Iterator[ComputeFinding]:
        """``count`` fits the accelerator, DeepSpeed settings fit; no job cluster sections."""
        compute = spec.compute
        per_node = compute.gpus_per_node
        if compute.count % per_node:
            yield ComputeFinding(("compute", "count"), f"{compute.accelerator} has {per_node} "
                                 f"GPUs per node, so count must be a multiple of {per_node}, "
                                 f"not {compute.count}")
        if compute.strategy == "deepspeed":
            yield from config_findings(compute.config)
            if compute.offload.params != "none" and compute.zero_stage != 3:
                yield ComputeFinding(("compute", "offload", "params"), "parameter offload "
                                     f"needs zero_stage 3, not {compute.zero_stage}")
        elif compute.model_fields_set & {"zero_stage", "offload", "config"}:
            yield ComputeFinding(("compute", "strategy"), "zero_stage, offload and config are "
                                 "DeepSpeed's: set strategy: deepspeed, or remove them")
        name, _ = experiment_location(spec.tracking.experiment or spec.name)
        if not EXPERIMENT_NAME.match(name):
            yield ComputeFinding(("tracking", "experiment"), f"AI Runtime refuses the experiment "
                                 f"name '{name}': letters, digits, '_' and '-' only (at most 100)"
                                 "; the folder before it may be any workspace path",
                                 warning=True)
        for field in ("cluster", "training_cluster"):
            if getattr(spec.jobs, field).model_fields_set:
                yield ComputeFinding(("jobs", field), "compute.kind serverless_gpu runs the job "
                                     "on AI Runtime, which has no cluster to configure; remove "
                                     "this section", warning=True)

    def gpu_expected(self, compute) -> bool:
        return True

    def trains_on_gpu(self, compute) -> bool:
        return True

    def world_size(self, compute) -> int:
        """``count`` ranks (more than one: launched by torchrun, see :meth:`start_ranks`)."""
        return compute.count

    def remote_ranks(self, compute) -> Optional[str]:
        """On AI Runtime's other nodes when it runs several (so the files go to the shared
        directory); here, on this machine."""
        nodes = int(os.environ.get("NUM_NODES", "1") or 1)
        return f"ranks on {nodes} AI Runtime nodes" if nodes > 1 else None

    def check_runnable(self, spec, *, quick: bool) -> None:
        if spec.compute.count > 1 and spec.compute.strategy == "deepspeed":
            self.rank_settings(spec)

    def rank_settings(self, spec) -> RankSettings:
        """GPUs when this machine has one for every rank here, else CPUs (gloo)."""
        use_gpu = _gpus_for(_ranks_here(spec.compute))
        config = None
        if spec.compute.strategy == "deepspeed":
            config = deepspeed_config(spec, use_gpu=use_gpu)
            check_deepspeed_config(config)
        return RankSettings(use_gpu, resolve_backend("auto", use_gpu), config)

    def start_ranks(self, spec, settings: RankSettings, work_dir: Path,
                    say: Callable[[str], None]) -> Optional[str]:
        from dbspec.training.torchrun import run_torchrun

        return run_torchrun(work_dir, _ranks_here(spec.compute), say)


def _ranks_here(compute) -> int:
    """Ranks on this node: AI Runtime's ``LOCAL_WORLD_SIZE``, else every rank (a laptop)."""
    return int(os.environ.get("LOCAL_WORLD_SIZE") or compute.count)


def _gpus_for(ranks: int) -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.device_count() >= ranks


KIND = ServerlessGpuKind()
