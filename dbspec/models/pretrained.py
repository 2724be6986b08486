"""A pretrained Transformers checkpoint as a dbspec network (``model.pretrained``).

The checkpoint's tokenizer (its ``tokenizers`` JSON) is fitted into the text feature's input
like a trained subword model, so the served model tokenizes raw text as every other text
model does; the network reads those ids (padding masked out) and returns the logits of the
checkpoint's sequence-classification model, sized for the task.

Training builds it from the checkpoint's weights, with frozen prefixes, gradient
checkpointing and LoRA adapters (peft); when training ends :meth:`PretrainedNetwork.finish`
merges the adapters into the weights, so the logged model is a plain Transformers model
rebuilt from the checkpoint's config stored in the input (no checkpoint, no peft needed to
serve it).
"""

from __future__ import annotations

import contextlib
import warnings
from pathlib import Path
from typing import Any, Iterator, Optional

import torch
from torch import nn

from dbspec.errors import DbspecError
from dbspec.spec.checkpoints import RENAMED, is_hub_id
from dbspec.spec.sections.pretrained import PretrainedSpec

_AT = "model.pretrained"


class PretrainedError(DbspecError):
    """The checkpoint cannot be fetched, read or fitted to the task."""


class PretrainedNetwork(nn.Module):
    """Token ids (float columns, as every text input is encoded), or an image's normalised
    pixels, -> the model's logits."""

    def __init__(self, model: nn.Module, pad_id: int, image: Optional[list[int]] = None):
        super().__init__()
        self.model = model
        self.pad_id = pad_id
        self.image = image  # (channels, height, width) of an image model's pixels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not len(x):  # a probe for the output's columns (Spark): no empty batch in BERT, ViT
            fill = float(self.pad_id) if self.image is None else 0.0
            return self(torch.full((1, x.shape[1]), fill))[:0]
        if self.image is not None:
            return self.model(pixel_values=x.view(-1, *self.image)).logits
        ids = x.long()
        return self.model(input_ids=ids, attention_mask=(ids != self.pad_id).long()).logits

    def parameter_counts(self) -> tuple[int, int]:
        """``(trained, total)`` parameters (adapters included in the total)."""
        params = list(self.parameters())
        return (sum(p.numel() for p in params if p.requires_grad),
                sum(p.numel() for p in params))

    def finish(self) -> None:
        """After training: adapters merged into the weights, leaving the plain model."""
        from peft import PeftModel

        if isinstance(self.model, PeftModel):
            self.model = self.model.merge_and_unload()


def resolve_checkpoint(pretrained: PretrainedSpec) -> Path:
    """The local directory of the checkpoint: the path as it is, or a hub id fetched (or
    found in the local cache).

    Raises:
        PretrainedError: no such directory, or a hub id that cannot be fetched (offline).
    """
    where = pretrained.checkpoint
    if not is_hub_id(where):
        path = Path(where).expanduser()
        if not path.is_dir():
            raise PretrainedError(f"{_AT}.checkpoint: {path} is not a directory")
        return path
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(where, revision=pretrained.revision))
    except Exception as exc:  # offline, unknown repository, gated: one line, no traceback
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise PretrainedError(
            f"{_AT}.checkpoint: cannot fetch the hub id '{where}' ({type(exc).__name__}: "
            f"{first[:300]}); where the hub is not reachable, download it elsewhere and give "
            "its directory (a local path or a /Volumes path)") from None


def checkpoint_input(pretrained: PretrainedSpec, max_length: int) -> dict[str, Any]:
    """What a text feature with ``tokenizer: checkpoint`` fits: the checkpoint's tokenizer
    (``tokenizers`` JSON), its padding token and id, the vocabulary size and the model config.

    Raises:
        PretrainedError: the checkpoint has no fast tokenizer or no readable config.
    """
    from transformers import AutoConfig, AutoTokenizer

    path = resolve_checkpoint(pretrained)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, use_fast=True)
        config = AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as exc:
        raise PretrainedError(f"{_AT}.checkpoint: cannot read the tokenizer and config in "
                              f"{path}: {exc}") from None
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise PretrainedError(f"{_AT}.checkpoint: {path} has no fast tokenizer "
                              "(tokenizer.json); save one with the checkpoint")
    pad_token = tokenizer.pad_token or tokenizer.eos_token or tokenizer.unk_token
    pad_id = backend.token_to_id(pad_token) if pad_token is not None else None
    if max_length > (tokenizer.model_max_length or max_length):
        raise PretrainedError(f"data.features: max_length {max_length} is longer than the "
                              f"checkpoint takes ({tokenizer.model_max_length} tokens)")
    backend.no_padding()
    backend.no_truncation()
    return {"tokenizer": backend.to_str(), "indices": len(tokenizer), "pad_id": pad_id or 0,
            "pad_token": pad_token or "", "config": config.to_dict()}


def image_checkpoint_input(pretrained: PretrainedSpec, spec: dict) -> dict[str, Any]:
    """What an image feature fed to ``model.pretrained`` fits: the checkpoint's model config,
    and its image processor's mean and deviation (preprocessor_config.json) in ``spec``'s
    normalisation, so training and serving scale pixels as the checkpoint was trained.

    Raises:
        PretrainedError: no readable config or image processor settings.
    """
    import json

    from transformers import AutoConfig

    path = resolve_checkpoint(pretrained)
    try:
        config = AutoConfig.from_pretrained(path)
        processor = json.loads((path / "preprocessor_config.json").read_text())
    except (OSError, ValueError) as exc:
        raise PretrainedError(f"{_AT}.checkpoint: cannot read the config and image processor "
                              f"(preprocessor_config.json) in {path}: {exc}") from None
    # the processor scales pixels by rescale_factor, then normalises: the same as dbspec's
    # pixels / 255 normalised with mean and std divided by 255 * rescale_factor
    k = 255 * processor.get("rescale_factor", 1 / 255) if processor.get("do_rescale", True) else 255
    normalize = processor.get("do_normalize", True)
    mean = processor.get("image_mean", [0.5] * spec["channels"]) if normalize else [0.0]
    std = processor.get("image_std", [0.5] * spec["channels"]) if normalize else [1.0]
    spec = dict(spec, normalize={"mean": [v / k for v in mean] * (spec["channels"] // len(mean)),
                                 "std": [v / k for v in std] * (spec["channels"] // len(std))})
    return {"spec": spec, "config": config.to_dict(), "pad_id": 0,
            "image": [spec["channels"], spec["height"], spec["width"]]}


def build_pretrained(pretrained: PretrainedSpec, out_features: int, inputs: list[dict],
                     load_weights: bool) -> PretrainedNetwork:
    """The network: from the checkpoint's weights, made ready to train (``load_weights``),
    or from the config stored in the fitted input, to load a state dict into.

    Raises:
        PretrainedError: a frozen prefix or LoRA target the model lacks, or an unreadable
            checkpoint.
    """
    from transformers import (AutoConfig, AutoModelForImageClassification,
                              AutoModelForSequenceClassification)

    entry = next((i for i in inputs if "config" in i), None)
    if entry is None:
        raise PretrainedError(f"{_AT}: the text input holds no checkpoint config; the feature "
                              "needs tokenizer: checkpoint")
    image = entry.get("image")
    auto = AutoModelForSequenceClassification if image is None else AutoModelForImageClassification
    if not load_weights:
        stored = dict(entry["config"])
        config = AutoConfig.for_model(stored.pop("model_type"), **stored)
        config.num_labels = out_features
        return PretrainedNetwork(auto.from_config(config), entry["pad_id"], image)
    path = resolve_checkpoint(pretrained)
    try:
        with _quiet():  # its load report lists the new head's weights as missing: expected
            model, loading = auto.from_pretrained(
                path, num_labels=out_features, ignore_mismatched_sizes=pretrained.new_head,
                output_loading_info=True)
    except (OSError, ValueError, RuntimeError) as exc:
        kind = "a sequence" if image is None else "an image"
        raise PretrainedError(f"{_AT}.checkpoint: cannot load {path} as {kind} classifier "
                              f"with {out_features} output(s): {str(exc).splitlines()[0]}") \
            from None
    model.config.pad_token_id = entry["pad_id"]
    _freeze(model, pretrained.freeze)
    if pretrained.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if pretrained.finetune.method == "lora":
        # what the checkpoint lacks is new (the head; a pooler an MLM checkpoint has not):
        # trained in full, since adapters on random weights leave them random
        new = [key if isinstance(key, str) else key[0]
               for key in [*loading.get("missing_keys", ()), *loading.get("mismatched_keys", ())]]
        model = _with_lora(model, pretrained.finetune,
                           sorted({key.rpartition(".")[0] for key in new} - {""}), image is None)
    return PretrainedNetwork(model, entry["pad_id"], image)


def _freeze(model: nn.Module, prefixes: list[str]) -> None:
    """Parameters under ``prefixes`` (the model's names, or with its base-model prefix left
    out) stop training."""
    base = getattr(model, "base_model_prefix", "") + "."
    for index, prefix in enumerate(prefixes):
        matched = False
        for name, param in model.named_parameters():
            short = name[len(base):] if name.startswith(base) else name
            if any(n == prefix or n.startswith(prefix + ".") for n in (name, short)):
                param.requires_grad_(False)
                matched = True
        if not matched:
            raise PretrainedError(f"{_AT}.freeze.{index}: no parameter starts with '{prefix}'")


def _with_lora(model: nn.Module, lora, new_modules: list[str], text: bool) -> nn.Module:
    from peft import LoraConfig, TaskType, get_peft_model

    names = {name.rpartition(".")[2] for name, _ in model.named_modules()}
    targets = [t if t in names or text else RENAMED.get(t, t) for t in lora.target_modules]
    # peft's sequence-classification wrapper passes input_ids; an image model gets the plain one
    config = LoraConfig(task_type=TaskType.SEQ_CLS if text else None, r=lora.rank, lora_alpha=lora.alpha,
                        lora_dropout=lora.dropout, modules_to_save=new_modules or None,
                        target_modules=targets[0] if targets == ["all-linear"] else targets)
    try:
        with _quiet():
            return get_peft_model(model, config)
    except ValueError as exc:
        raise PretrainedError(f"{_AT}.finetune.target_modules: {str(exc).splitlines()[0]}") \
            from None



@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Transformers' load reports, progress bars and deprecation warnings held back."""
    from transformers.utils import logging as hf_logging

    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
