"""ResNet-18 and ResNet-34 bodies (no classifier) with torchvision's parameter names, and the
loading of a weights file into them: a state dict saved from torchvision's ``resnet18`` /
``resnet34`` loads with every key matched once ``fc.*`` is dropped. torchvision itself is not
needed (nor importable beside every torch build: its PyPI wheels need torch's CUDA libraries),
and nothing is ever downloaded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

_BLOCKS = {18: (2, 2, 2, 2), 34: (3, 4, 6, 3)}  # BasicBlocks per stage
_SHOWN_KEYS = 5


class WeightsError(Exception):
    """A weights file that cannot be loaded into the body; the message names the file."""


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with a shortcut (a 1x1 convolution when the shape changes)."""

    def __init__(self, in_channels: int, channels: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.downsample = None
        if stride != 1 or in_channels != channels:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_channels, channels, 1, stride=stride, bias=False),
                nn.BatchNorm2d(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(out)) + shortcut)


class ResNetBody(nn.Module):
    """Images (B, in_channels, H, W) -> (B, 512): the stem, four stages, average pooling."""

    def __init__(self, depth: int = 18, in_channels: int = 3):
        super().__init__()
        self.depth, self.in_channels = depth, in_channels
        self.conv1 = nn.Conv2d(in_channels, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        width = 64
        for stage, (blocks, channels) in enumerate(zip(_BLOCKS[depth], (64, 128, 256, 512))):
            stride = 1 if stage == 0 else 2
            layers = [BasicBlock(width, channels, stride)]
            layers += [BasicBlock(channels, channels) for _ in range(blocks - 1)]
            setattr(self, f"layer{stage + 1}", nn.Sequential(*layers))
            width = channels
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        # He initialisation for the ReLU network, as the ResNet paper trains it (batch norm
        # starts at weight 1, bias 0: torch's default)
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return torch.flatten(self.avgpool(x), 1)

    def extra_repr(self) -> str:
        return f"depth={self.depth}, in_channels={self.in_channels}"


def load_weights(body: ResNetBody, path: str) -> None:
    """Load the state dict in ``path`` (bare, or under ``state_dict`` or ``model``; a
    ``module.`` prefix removed, ``fc.*`` dropped) into ``body``. A 3-channel ``conv1`` loaded
    into a 1-channel body is summed over its channels (grey is RGB with three equal channels).

    Raises:
        WeightsError: a missing or unreadable file, or keys that do not match the body (the
            first few missing, unexpected or misshapen keys are named).
    """
    state = _read_state(path)
    expected = body.state_dict()
    conv1 = state.get("conv1.weight")
    if (isinstance(conv1, torch.Tensor) and conv1.dim() == 4 and conv1.shape[1] == 3
            and body.in_channels == 1):
        state["conv1.weight"] = conv1.sum(dim=1, keepdim=True)
    # BatchNorm's step counter is absent from older files; load_state_dict fills it in
    missing = [k for k in expected if k not in state and not k.endswith("num_batches_tracked")]
    unexpected = [k for k in state if k not in expected]
    misshapen = [f"{k} {tuple(state[k].shape)} (expected {tuple(expected[k].shape)})"
                 for k in state if k in expected and state[k].shape != expected[k].shape]
    problems = [(what, keys) for what, keys in (("missing", missing), ("unexpected", unexpected),
                                                ("of another shape", misshapen)) if keys]
    if problems:
        listed = "; ".join(f"{len(keys)} {what}: {', '.join(keys[:_SHOWN_KEYS])}"
                           + (" ..." if len(keys) > _SHOWN_KEYS else "")
                           for what, keys in problems)
        raise WeightsError(f"the weights in '{path}' do not fit a ResNet-{body.depth} with "
                           f"{body.in_channels} input channel(s): keys {listed}; give a state "
                           f"dict saved from torchvision's resnet{body.depth}")
    body.load_state_dict(state, strict=False)


def _read_state(path: str) -> dict[str, torch.Tensor]:
    """The state dict in ``path``, unwrapped, without ``fc.*`` entries."""
    if not Path(path).is_file():
        raise WeightsError(f"no weights file at '{path}'")
    try:
        loaded: Any = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # pickle, zip and safety errors differ by torch version
        raise WeightsError(f"cannot read the weights file '{path}' as a torch state dict "
                           f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
                           ) from None
    for key in ("state_dict", "model"):
        if isinstance(loaded, dict) and isinstance(loaded.get(key), dict):
            loaded = loaded[key]
            break
    if not isinstance(loaded, dict) or not all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in loaded.items()):
        raise WeightsError(f"the weights file '{path}' holds a {type(loaded).__name__}, not a "
                           "state dict of named tensors")
    unwrapped = ((key.removeprefix("module."), value) for key, value in loaded.items())
    return {key: value for key, value in unwrapped if not key.startswith("fc.")}


def freeze(body: nn.Module) -> None:
    """Fix ``body``'s learned weights (no gradients). Batch norm stays in training mode: it
    normalises with each batch's statistics and updates its running averages as the model
    trains; only the convolution and batch-norm weights stay as loaded."""
    for parameter in body.parameters():
        parameter.requires_grad_(False)
