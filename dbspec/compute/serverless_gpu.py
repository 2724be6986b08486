"""``compute.kind: serverless_gpu``: Databricks AI Runtime (see :class:`ServerlessGpuCompute`)."""

from __future__ import annotations

import re
from typing import Annotated, Iterator, Literal, Optional, get_args

from pydantic import AfterValidator

from dbspec.compute.common import InProcessKind
from dbspec.seams.compute import ComputeFinding
from dbspec.spec.databricks import EXPERIMENT_NAME, experiment_location
from dbspec.spec.sections.base import SpecModel, d

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

    @property
    def device(self) -> str:
        """Locally the training takes a GPU when present (as ``kind: local``, ``device: auto``)."""
        return "auto"

    @property
    def gpus_per_node(self) -> int:
        """GPUs per node, from the accelerator name."""
        return int(self.accelerator.split("_")[1].split("x")[0])


class ServerlessGpuKind(InProcessKind):
    """AI Runtime in jobs; ``device: auto`` in this process."""

    name = "serverless_gpu"
    model = ServerlessGpuCompute
    serverless = True

    def check(self, spec) -> Iterator[ComputeFinding]:
        """``count`` fits the accelerator and one process; no job cluster sections."""
        compute = spec.compute
        per_node = compute.gpus_per_node
        if compute.count % per_node:
            yield ComputeFinding(("compute", "count"), f"{compute.accelerator} has {per_node} "
                                 f"GPUs per node, so count must be a multiple of {per_node}, "
                                 f"not {compute.count}")
        elif compute.count > 1:
            yield ComputeFinding(("compute", "count"), f"{compute.count} accelerators: dbspec "
                                 "trains one process on one GPU in an AI Runtime task today; "
                                 "use count: 1 (GPU_1x...), or torch_distributor / deepspeed / "
                                 "ray on a job cluster for several GPUs")
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


KIND = ServerlessGpuKind()
