"""What ``dbspec validate`` can tell about a pretrained checkpoint without loading it: its
``config.json`` and the parameter names in its safetensors headers. No torch, no transformers.

A safetensors file starts with 8 bytes (little-endian unsigned length) and that many bytes of
JSON mapping each tensor's name to its dtype, shape and offsets; a sharded checkpoint lists
every name in ``model.safetensors.index.json``.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

#: A hub id: ``name`` or ``org/name`` (letters, digits, '-', '_', '.')
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*(/[A-Za-z0-9][\w.\-]*)?$")
#: Architecture suffixes of models that do not read text
_NOT_TEXT = ("ForImageClassification", "ForObjectDetection", "ForSemanticSegmentation",
             "ForInstanceSegmentation", "ForDepthEstimation", "ForAudioClassification",
             "ForAudioFrameClassification", "ForCTC", "ForSpeechSeq2Seq",
             "ForVideoClassification")
#: The header of a safetensors file is at most this long (the format's own limit)
_MAX_HEADER = 100_000_000
#: Attention projections that Transformers 5 renames when it loads a ViT-like image model (its
#: files name them query/key/value, the loaded model q_proj/k_proj/v_proj): an image model's
#: LoRA target may use either name
RENAMED = {"query": "q_proj", "key": "k_proj", "value": "v_proj"}
RENAMED.update({new: old for old, new in RENAMED.items()})
#: Files up to this size enter :func:`checkpoint_version` by content, larger ones by mtime
_READ_WHOLE = 4 << 20
#: peft's target_modules value for every linear layer but the output
ALL_LINEAR = "all-linear"


class CheckpointError(Exception):
    """The checkpoint cannot be read as a Transformers checkpoint."""


@dataclass(frozen=True)
class CheckpointInfo:
    """What a local checkpoint says about itself.

    Attributes:
        architecture: The first of ``config.json``'s ``architectures`` (or its model_type).
        labels: The head's label count, when the architecture is a sequence classifier.
        parameters: Every parameter name in its weights, None when they are not safetensors.
    """

    directory: Path
    architecture: str
    labels: Optional[int]
    parameters: Optional[frozenset[str]]
    config: Optional[dict] = None

    @property
    def reads_text(self) -> bool:
        """Whether the architecture is one a sequence classifier can be built on."""
        return not self.architecture.endswith(_NOT_TEXT)

    def modules(self) -> set[str]:
        """Every module name that holds parameters (a name less its last part)."""
        return {name.rpartition(".")[0] for name in self.parameters or ()}


def is_hub_id(checkpoint: str) -> bool:
    """Whether ``checkpoint`` names a hub repository rather than a path (no such path exists
    here and it reads as ``org/name``)."""
    return bool(_HUB_ID.match(checkpoint)) and not Path(checkpoint).exists()


def is_unmounted_volume(checkpoint: str) -> bool:
    """A Unity Catalog Volume path on a machine without ``/Volumes`` (off Databricks)."""
    return checkpoint.startswith("/Volumes/") and not Path("/Volumes").is_dir()


def checkpoint_version(spec) -> Optional[str]:
    """What a run's plan holds of a local checkpoint's contents, so that a checkpoint rewritten
    in place (the same path) re-encodes the text and retrains: a hash of every file's name, size
    and modification time, and of the whole content of the small ones (config, tokenizer).
    None without ``model.pretrained``, for a hub id or a Volume this machine cannot see (the id
    and revision in the spec stand for it there), and for a path that is no directory (the run
    fails on it with a located error)."""
    pretrained = spec.model.pretrained
    if pretrained is None or is_hub_id(pretrained.checkpoint) \
            or is_unmounted_volume(pretrained.checkpoint):
        return None
    directory = Path(pretrained.checkpoint).expanduser()
    if not directory.is_dir():
        return None
    digest = hashlib.sha256()
    for file in sorted(path for path in directory.rglob("*") if path.is_file()):
        stat = file.stat()
        digest.update(f"{file.relative_to(directory)}\0{stat.st_size}\0".encode())
        if stat.st_size <= _READ_WHOLE:
            digest.update(file.read_bytes())
        else:  # weights: gigabytes are not read to plan a run
            digest.update(str(stat.st_mtime_ns).encode())
    return digest.hexdigest()[:16]


def read_checkpoint(directory: Path) -> CheckpointInfo:
    """The :class:`CheckpointInfo` of a local checkpoint directory.

    Raises:
        CheckpointError: no such directory, no readable config.json naming an architecture,
            or a weights header that is not safetensors JSON.
    """
    if not directory.is_dir():
        raise CheckpointError(f"{directory} is not a directory (a checkpoint directory holds "
                              "config.json, model.safetensors and tokenizer.json)")
    config_file = directory / "config.json"
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"cannot read {config_file}: {exc}") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{config_file} holds no JSON object")
    names = config.get("architectures") or ([config["model_type"]] if "model_type" in config
                                            else [])
    if not isinstance(names, list) or not names or not isinstance(names[0], str):
        raise CheckpointError(f"{config_file} names no architecture (neither 'architectures' "
                              "nor 'model_type')")
    labels = None
    if names[0].endswith(("ForSequenceClassification", "ForImageClassification")):
        labels = len(config["id2label"]) if isinstance(config.get("id2label"), dict) \
            else int(config.get("num_labels", 2))
    return CheckpointInfo(directory, names[0], labels, _parameter_names(directory), config)


def _parameter_names(directory: Path) -> Optional[frozenset[str]]:
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        try:
            return frozenset(json.loads(index.read_text())["weight_map"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(f"cannot read the weight map of {index}: {exc}") from None
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        return None
    names: set[str] = set()
    for file in files:
        names.update(_header(file))
    return frozenset(names)


def _header(file: Path) -> list[str]:
    """The tensor names in a safetensors file's header."""
    try:
        with open(file, "rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            if length > _MAX_HEADER:
                raise ValueError(f"a header of {length} bytes")
            header = json.loads(handle.read(length))
    except (OSError, ValueError, struct.error) as exc:
        raise CheckpointError(f"{file} is not a safetensors file: {exc}") from None
    return [name for name in header if name != "__metadata__"]


def has_prefix(names: frozenset[str], prefix: str) -> bool:
    """Whether a parameter starts with ``prefix`` (a whole name part), in the checkpoint's
    naming or in the classifier's, which puts the base model under a prefix of its own
    (``bert.``); the head is the classifier's alone."""
    stripped = prefix.partition(".")[2]
    return prefix in ("classifier", "score") or any(
        name == candidate or name.startswith(candidate + ".")
        for candidate in (prefix, stripped) if candidate for name in names)


def missing_targets(info: CheckpointInfo, targets: list[str]) -> list[int]:
    """Positions of the LoRA ``targets`` no module of the checkpoint is named (peft matches a
    target against a module's whole name or its last parts)."""
    if info.parameters is None or targets == [ALL_LINEAR]:
        return []
    modules, image = info.modules(), info.architecture.endswith("ForImageClassification")
    return [index for index, target in enumerate(targets) if not any(
        module == name or module.endswith("." + name) for module in modules
        for name in (target, RENAMED.get(target, target) if image else target))]


def pretrained_findings(spec, outputs: Optional[int]) -> list[tuple[tuple, str]]:
    """Errors about ``model.pretrained`` (by dotted path) that the spec and the local checkpoint
    show; ``outputs``: the network outputs the task needs, when known without data."""
    pretrained, at = spec.model.pretrained, ("model", "pretrained")
    found = _feature_findings(spec)
    if spec.model.encoders:
        found.append((("model", "encoders"), "a pretrained checkpoint reads its own tokens; "
                      "leave model.encoders out"))
    if is_hub_id(pretrained.checkpoint) or is_unmounted_volume(pretrained.checkpoint):
        return found  # checked when the run fetches or reads it
    try:
        info = read_checkpoint(Path(pretrained.checkpoint).expanduser())
    except CheckpointError as exc:
        return found + [(at + ("checkpoint",), str(exc))]
    image = next((f for f in spec.data.features or [] if getattr(f, "type", "") == "image"), None)
    if image is not None:
        found += [(at + ("checkpoint",), message) for message in _image_findings(info, image)]
    elif not info.reads_text:
        found.append((at + ("checkpoint",), f"the checkpoint is a {info.architecture}, which "
                      "does not read text; a text task needs a text model (a base model or a "
                      "...ForSequenceClassification)"))
    if info.labels is not None and outputs is not None and info.labels != outputs \
            and not pretrained.new_head:
        found.append((at + ("checkpoint",), f"the checkpoint's {info.architecture} head has "
                      f"{info.labels} label(s); {spec.data.task} with loss "
                      f"'{spec.training.loss_for(spec.data.task)}' needs {outputs} output(s): "
                      "set model.pretrained.new_head: true to train a new head"
                      + (", or training.loss: cross_entropy for two outputs"
                         if spec.data.task == "binary" and info.labels == 2 else "")))
    names = info.parameters or frozenset()
    for index, prefix in enumerate(pretrained.freeze):
        if info.parameters is not None and not has_prefix(names, prefix):
            found.append((at + ("freeze", index), f"no parameter of the checkpoint starts with "
                          f"'{prefix}'"))
    targets = getattr(pretrained.finetune, "target_modules", None)
    if targets is not None:
        modules = sorted({m.rpartition(".")[2] for m in info.modules()} - {""})
        for index in missing_targets(info, targets):
            found.append((at + ("finetune", "target_modules", index), f"the checkpoint has no "
                          f"module '{targets[index]}' for a LoRA adapter; its modules are named "
                          f"{', '.join(modules[:30])}"))
    return found


def _image_findings(info: CheckpointInfo, image) -> list[str]:
    """An image feature needs an image classifier whose image size and channels it has."""
    if not info.architecture.endswith("ForImageClassification"):
        return [f"the checkpoint is a {info.architecture}; an image feature needs an image "
                "classifier (a ...ForImageClassification, such as ViTForImageClassification)"]
    config = info.config or {}
    size = config.get("image_size")
    found = []
    if isinstance(size, int) and (image.height, image.width) != (size, size):
        found.append(f"the checkpoint takes {size} x {size} images; data.features."
                     f"{image.name} is resized to {image.height} x {image.width}: set height "
                     f"and width to {size}")
    if config.get("num_channels", image.channels) != image.channels:
        found.append(f"the checkpoint takes {config['num_channels']} channel(s); data.features."
                     f"{image.name} has channels: {image.channels}")
    if not (info.directory / "preprocessor_config.json").is_file():
        found.append(f"{info.directory} has no preprocessor_config.json (the image processor's "
                     "size, mean and deviation); save the checkpoint's image processor with it")
    return found


def _feature_findings(spec) -> list[tuple[tuple, str]]:
    """A pretrained model reads one text feature, tokenized by the checkpoint's tokenizer, or
    one image feature."""
    features = spec.data.features or []
    ok = [i for i, f in enumerate(features) if getattr(f, "type", None) == "image" or (
        getattr(f, "type", None) == "text" and f.tokenizer == "checkpoint")]
    if len(ok) == 1 and len(features) == 1:
        return []
    return [(("data", "features"), "model.pretrained reads one text feature with the "
             "checkpoint's tokenizer, or one image feature, and nothing else: data.features: "
             "[{name: <column>, type: text, tokenizer: checkpoint}] or [{name: <column>, "
             "type: image, height: ..., width: ...}]")]
