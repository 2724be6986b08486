"""Checkpoints written atomically, so a crash mid-write never leaves a broken newest file."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Optional

import torch

from dbspec.atomic import atomic_file

_NAME = re.compile(r"^epoch-(\d+)\.pt$")
_STEP = re.compile(r"^epoch-(\d+)-step-(\d+)\.pt$")


class CheckpointStore:
    """``epoch-N.pt`` files in one directory; the newest ``keep`` are kept.

    A mid-epoch checkpoint (streamed data) is ``epoch-N-step-K.pt``: only the newest is kept,
    and the end of its epoch removes it.

    In distributed training every rank reads the store (to resume) and only the one created
    with ``writer=True`` writes to it.
    """

    def __init__(self, directory: Path, *, every: int = 1, keep: int = 2, writer: bool = True):
        self.directory = Path(directory)
        self.every, self.keep, self.writer = every, keep, writer

    def due(self, epoch: int, *, last: bool) -> bool:
        """Whether ``epoch`` (0-based) gets a checkpoint."""
        return last or (epoch + 1) % self.every == 0

    def save(self, epoch: int, state: dict[str, Any]) -> Path:
        """Write ``state`` for ``epoch``: to a temporary name, fsync, then rename."""
        final = self.directory / f"epoch-{epoch}.pt"
        if not self.writer:
            return final
        self._write(final, state)
        for old in self.epochs()[:-self.keep]:
            (self.directory / f"epoch-{old}.pt").unlink(missing_ok=True)
        for old_epoch, step in self.steps():
            if old_epoch <= epoch:
                (self.directory / f"epoch-{old_epoch}-step-{step}.pt").unlink(missing_ok=True)
        return final

    def save_step(self, epoch: int, step: int, state: dict[str, Any]) -> Path:
        """Write a checkpoint after ``step`` batches of ``epoch``; older step files go."""
        final = self.directory / f"epoch-{epoch}-step-{step}.pt"
        if not self.writer:
            return final
        self._write(final, state)
        for old in self.steps():
            if old != (epoch, step):
                (self.directory / f"epoch-{old[0]}-step-{old[1]}.pt").unlink(missing_ok=True)
        return final

    def _write(self, final: Path, state: dict[str, Any]) -> None:
        """To a temporary name, fsync, then rename: a crash leaves the old file or the new."""
        self.directory.mkdir(parents=True, exist_ok=True)
        with atomic_file(final) as handle:
            torch.save(state, handle)

    def steps(self) -> list[tuple[int, int]]:
        """``(epoch, step)`` of the mid-epoch checkpoints, oldest first."""
        if not self.directory.is_dir():
            return []
        found = (_STEP.match(p.name) for p in self.directory.iterdir())
        return sorted((int(m.group(1)), int(m.group(2))) for m in found if m)

    def epochs(self) -> list[int]:
        """Epochs that have a complete checkpoint, oldest first."""
        if not self.directory.is_dir():
            return []
        found = (_NAME.match(p.name) for p in self.directory.iterdir())
        return sorted(int(m.group(1)) for m in found if m)

    def load_latest(self) -> Optional[dict[str, Any]]:
        """The newest checkpoint's state, or None when there is none."""
        epochs, steps = self.epochs(), self.steps()
        newest = [(epoch, float("inf"), f"epoch-{epoch}.pt") for epoch in epochs[-1:]]
        newest += [(epoch, step, f"epoch-{epoch}-step-{step}.pt") for epoch, step in steps[-1:]]
        if not newest:
            return None
        name = max(newest)[2]
        return torch.load(self.directory / name, map_location="cpu", weights_only=False)

    def clear(self) -> None:
        """Remove every checkpoint (a fresh, non-resumed run)."""
        if not self.writer:
            return
        for epoch in self.epochs():
            (self.directory / f"epoch-{epoch}.pt").unlink(missing_ok=True)
        for epoch, step in self.steps():
            (self.directory / f"epoch-{epoch}-step-{step}.pt").unlink(missing_ok=True)
        if self.directory.is_dir():  # DeepSpeed's checkpoints: a directory per tag
            import shutil

            for tag in self.directory.glob("epoch-*"):
                if tag.is_dir() and re.match(r"^epoch-\d+(-step-\d+)?$", tag.name):
                    shutil.rmtree(tag, ignore_errors=True)
            (self.directory / "latest").unlink(missing_ok=True)
