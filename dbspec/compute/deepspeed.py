"""``compute.kind: deepspeed``: DeepSpeed ZeRO launched by pyspark's
``DeepspeedTorchDistributor``; the DeepSpeed config is generated from the spec
(:func:`deepspeed_config`) and checked with DeepSpeed's own classes."""

from __future__ import annotations

from typing import Any, ClassVar, Iterator, Literal, Mapping, Optional

from dbspec.compute.common import NO_RESOURCES, RankKind, resolve_backend
from dbspec.errors import DbspecError, did_you_mean
from dbspec.seams.compute import ComputeFinding, RankSettings
from dbspec.spec.databricks import Resources
from dbspec.spec.sections.base import SpecModel, d, section


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


#: Keys of ``compute.config`` that dbspec generates from the spec: set them there instead.
_OWNED = {
    "train_batch_size": "training.batch_size",
    "train_micro_batch_size_per_gpu": "training.batch_size",
    "gradient_accumulation_steps": "training.gradient_accumulation",
    "gradient_clipping": "training.gradient_clipping",
    "fp16": "training.precision", "bf16": "training.precision",
}
_KEYS = (
    "optimizer", "scheduler", "zero_optimization", "activation_checkpointing", "flops_profiler",
    "steps_per_print", "wall_clock_breakdown", "dump_state", "prescale_gradients",
    "gradient_predivide_factor", "sparse_gradients", "communication_data_type",
    "zero_allow_untested_optimizer", "aio", "tensorboard", "csv_monitor", "wandb",
    "comms_logger", "memory_breakdown", "checkpoint", "data_types",
    "seq_parallel_communication_data_type", "zero_force_ds_cpu_optimizer", "amp", "elasticity",
    "autotuning", "compression_training", "data_efficiency", "pipeline", "torch_autocast",
)


class DeepspeedKind(RankKind):
    """``num_gpus`` x ``num_nodes`` DeepSpeed ranks started by ``DeepspeedTorchDistributor``."""

    name = "deepspeed"
    model = DeepspeedCompute
    extras: ClassVar[Mapping[str, str]] = {"deepspeed": "deepspeed"}

    def check(self, spec) -> Iterator[ComputeFinding]:
        """ZeRO stage and offload, fp16 on CPU, the GPUs it needs, ``compute.config``."""
        compute, path = spec.compute, ("compute",)
        if compute.offload.params != "none" and compute.zero_stage != 3:
            yield ComputeFinding(path + ("offload", "params"), f"parameter offload needs "
                                 f"zero_stage 3, not {compute.zero_stage}")
        if compute.offload.optimizer != "none" and compute.zero_stage == 0:
            yield ComputeFinding(path + ("offload", "optimizer"),
                                 "optimizer offload needs zero_stage >= 1")
        if not compute.use_gpu and spec.training.precision == "fp16":
            yield ComputeFinding(("training", "precision"), "DeepSpeed refuses fp16 on CPU; use "
                                 "bf16 or fp32, or compute.use_gpu: true")
        if compute.use_gpu:
            yield ComputeFinding(path + ("kind",), f"DeepSpeed needs "
                                 f"{compute.num_gpus * compute.num_nodes} GPU(s) at run time; set "
                                 "compute.use_gpu: false to train on CPU (ZeRO with gloo) where "
                                 "there is none", warning=True)
        yield from config_findings(compute.config)

    def check_runnable(self, spec, *, quick: bool) -> None:
        """DeepSpeed parses the generated config (before any stage runs)."""
        self.rank_settings(spec)

    def world_size(self, compute) -> int:
        return compute.num_gpus * compute.num_nodes

    def resources(self, compute) -> Resources:
        """``num_gpus`` per node; on executors when more than one node or not local."""
        if not compute.use_gpu:
            return NO_RESOURCES
        if compute.local_mode and compute.num_nodes == 1:
            return Resources(compute.num_gpus, 0, False)
        return Resources(compute.num_gpus, compute.num_nodes, True)

    def rank_settings(self, spec) -> RankSettings:
        """GPUs as the section says; the DeepSpeed config generated and checked."""
        config = deepspeed_config(spec)
        check_deepspeed_config(config)
        use_gpu = spec.compute.use_gpu
        return RankSettings(use_gpu, resolve_backend("auto", use_gpu), config)

    def distributor(self, compute, settings: RankSettings):
        from pyspark.ml.deepspeed.deepspeed_distributor import DeepspeedTorchDistributor

        return DeepspeedTorchDistributor(
            numGpus=compute.num_gpus, nnodes=compute.num_nodes, localMode=compute.local_mode,
            useGpu=settings.use_gpu, deepspeedConfig=settings.engine_config)


def config_findings(config: dict) -> Iterator[ComputeFinding]:
    """Keys dbspec owns, keys DeepSpeed does not know, and HuggingFace's ``auto``."""
    for key, value in config.items():
        path = ("compute", "config", key)
        if key in _OWNED:
            yield ComputeFinding(path, f"dbspec sets '{key}' from {_OWNED[key]}; set it there",
                                 at_key=True)
        elif key not in _KEYS:
            yield ComputeFinding(path, f"unknown DeepSpeed setting '{key}'"
                                 f"{did_you_mean(key, _KEYS)} (DeepSpeed itself would ignore "
                                 "it silently)", at_key=True)
        if value == "auto" or (isinstance(value, dict) and "auto" in value.values()):
            yield ComputeFinding(path, "'auto' is resolved by the HuggingFace integration, not "
                                 "by DeepSpeed; give a concrete value")


def deepspeed_config(spec, use_gpu: Optional[bool] = None) -> dict[str, Any]:
    """ZeRO stage, offload, precision, micro batch and accumulation from the spec (``use_gpu``:
    where the section's own ``use_gpu`` is not what the ranks use).

    ``compute.config`` is merged over the result (validation keeps it off the keys generated
    here). The spec's torch optimizer is handed to DeepSpeed, so no DeepSpeed op has to be
    compiled; ``zero_allow_untested_optimizer`` says that this is intended.
    """
    compute, training = spec.compute, spec.training
    precision = training.precision_on(compute.use_gpu if use_gpu is None else use_gpu)
    zero: dict[str, Any] = {"stage": compute.zero_stage}
    for key, device in (("offload_optimizer", compute.offload.optimizer),
                        ("offload_param", compute.offload.params)):
        if device != "none":
            nvme = {"nvme_path": compute.offload.nvme_path} if device == "nvme" else {}
            zero[key] = {"device": device, **nvme}
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": training.batch_size,
        "gradient_accumulation_steps": training.gradient_accumulation,
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,
        "steps_per_print": 10**9,
        "bf16": {"enabled": precision == "bf16"},
        "fp16": {"enabled": precision == "fp16"},
    }
    if training.gradient_clipping is not None:
        config["gradient_clipping"] = training.gradient_clipping.max_norm
    return _merge(config, compute.config)


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(
            out.get(key), dict) else value
    return out


def check_deepspeed_config(config: dict[str, Any]) -> None:
    """Parse the config with DeepSpeed's classes (they reject unknown ZeRO keys and bad values).

    Raises:
        DbspecError: DeepSpeed refuses the config; its message names the field.
    """
    try:
        from deepspeed.runtime.config import DeepSpeedConfig
    except ImportError:
        raise DbspecError("compute.kind deepspeed needs DeepSpeed: "
                          "pip install 'dbspec[deepspeed]'") from None
    try:
        DeepSpeedConfig(dict(config))
    except Exception as exc:  # pydantic errors and DeepSpeed's own assertions
        first = str(exc).strip().splitlines()
        raise DbspecError(f"compute.config: DeepSpeed refuses the generated config: "
                          f"{' '.join(first[:3])}") from None


KIND = DeepspeedKind()
