"""The DeepSpeed config a spec implies, checked with DeepSpeed's own config classes."""

from __future__ import annotations

from typing import Any

from dbspec.errors import DbspecError


def deepspeed_config(spec, *, use_gpu: bool | None = None) -> dict[str, Any]:
    """ZeRO stage, offload, precision, micro batch and accumulation from the spec.

    ``compute.config`` is merged over the result (validation keeps it off the keys generated
    here). The spec's torch optimizer is handed to DeepSpeed, so no DeepSpeed op has to be
    compiled; ``zero_allow_untested_optimizer`` says that this is intended.
    """
    compute, training = spec.compute, spec.training
    precision = training.precision_on(compute.use_gpu if use_gpu is None else use_gpu)
    zero: dict[str, Any] = {"stage": compute.zero_stage}
    if compute.offload.optimizer != "none":
        zero["offload_optimizer"] = {"device": compute.offload.optimizer,
                                     **_nvme(compute.offload.optimizer, compute)}
    if compute.offload.params != "none":
        zero["offload_param"] = {"device": compute.offload.params,
                                 **_nvme(compute.offload.params, compute)}
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


def _nvme(device: str, compute) -> dict[str, Any]:
    return {"nvme_path": compute.offload.nvme_path} if device == "nvme" else {}


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
