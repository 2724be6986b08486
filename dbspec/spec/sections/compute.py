"""``compute``: where training runs, selected by ``kind``."""

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import Field

from dbspec.spec.sections.base import SpecModel, d, section

GpuChoice = Union[bool, Literal["auto"]]


class LocalCompute(SpecModel):
    """One process on this machine."""

    kind: Literal["local"] = d("One process; CUDA when present (device: auto).")
    device: Literal["auto", "cpu", "cuda", "mps"] = d("Device; auto picks CUDA when present.",
                                                      default="auto")


class SingleGpuCompute(SpecModel):
    """One process on one CUDA GPU; fails clearly when there is none."""

    kind: Literal["single_gpu"] = d("One process on one GPU.")
    device_index: int = d("Which CUDA device.", default=0, ge=0)


class TorchDistributorCompute(SpecModel):
    """DistributedDataParallel launched by pyspark's TorchDistributor."""

    kind: Literal["torch_distributor"] = d("DDP through pyspark.ml.torch.distributor.TorchDistributor.")
    num_processes: int = d("Training processes (one per GPU when use_gpu).", default=2, ge=1)
    use_gpu: GpuChoice = d("Use GPUs (nccl) or CPUs (gloo); auto: GPUs when present.",
                           default="auto")
    local_mode: bool = d("Run the processes on the driver instead of on Spark executors.",
                         default=True)
    backend: Literal["auto", "gloo", "nccl"] = d("Process-group backend; auto: nccl on GPU, "
                                                 "gloo on CPU.", default="auto")


class Offload(SpecModel):
    """Where DeepSpeed ZeRO keeps optimizer state and parameters."""

    optimizer: Literal["none", "cpu", "nvme"] = d("Optimizer-state offload (ZeRO stage >= 1).",
                                                  default="none")
    params: Literal["none", "cpu", "nvme"] = d("Parameter offload (ZeRO stage 3 only).",
                                               default="none")
    nvme_path: str = d("Directory for nvme offload.", default="/local_disk0/deepspeed")


class DeepspeedCompute(SpecModel):
    """DeepSpeed launched by pyspark's DeepspeedTorchDistributor."""

    kind: Literal["deepspeed"] = d("DeepSpeed through DeepspeedTorchDistributor.")
    num_gpus: int = d("GPUs per node (processes on CPU when use_gpu is false).", default=1, ge=1)
    num_nodes: int = d("Nodes.", default=1, ge=1)
    use_gpu: bool = d("Train on GPUs; false trains on CPU with gloo (for tests).", default=True)
    local_mode: bool = d("Run on the driver instead of on Spark executors.", default=True)
    zero_stage: Literal[0, 1, 2, 3] = d("ZeRO optimization stage.", default=2)
    offload: Offload = section("ZeRO offload targets.")
    config: dict[str, Any] = d("Extra DeepSpeed config merged over the generated one; checked "
                               "with DeepSpeed's config classes before launch.",
                               default={})


class RayCompute(SpecModel):
    """DistributedDataParallel on Ray Train workers, in a Ray cluster started on Spark."""

    kind: Literal["ray"] = d("DDP through Ray Train's TorchTrainer on a Ray-on-Spark cluster "
                             "(ray.util.spark.setup_ray_cluster); needs 'dbspec[ray]'.")
    num_workers: int = d("Ray Train workers: training processes (one GPU each when use_gpu).",
                         default=2, ge=1)
    use_gpu: GpuChoice = d("Use GPUs (nccl) or CPUs (gloo); auto: GPUs when present.",
                           default="auto")
    cpus_per_worker: int = d("CPUs each training worker reserves.", default=1, ge=1)
    backend: Literal["auto", "gloo", "nccl"] = d("Process-group backend; auto: nccl on GPU, "
                                                 "gloo on CPU.", default="auto")


#: AI Runtime (serverless GPU) accelerator types, as databricks-sdk's
#: ``jobs.ComputeSpecAcceleratorType`` names them (a test keeps the two equal); the number
#: after ``GPU_`` is the GPUs per node.
AI_RUNTIME_ACCELERATORS = ("GPU_1xA10", "GPU_1xH100", "GPU_8xB300", "GPU_8xH100")


class ServerlessGpuCompute(SpecModel):
    """Databricks AI Runtime (serverless GPU): an ``ai_runtime_task`` in jobs; here, one process
    on this machine's GPU when there is one, else the CPU (as ``kind: local``)."""

    kind: Literal["serverless_gpu"] = d("AI Runtime serverless GPU compute.")
    accelerator: Literal["GPU_1xA10", "GPU_1xH100", "GPU_8xB300", "GPU_8xH100"] = d(
        "Accelerator type; GPU_8x... means eight GPUs per node.", default="GPU_1xA10")
    count: int = d("Total accelerators across all nodes; a multiple of the GPUs per node.",
                   default=1, ge=1)
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


Compute = Annotated[
    Union[LocalCompute, SingleGpuCompute, TorchDistributorCompute, DeepspeedCompute,
          RayCompute, ServerlessGpuCompute],
    Field(discriminator="kind"),
]
