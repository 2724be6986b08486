"""Checkpoints written atomically, so a crash mid-write never leaves a broken newest file."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any, Optional

import torch
import torch.distributed as dist

from dbspec.atomic import atomic_file

#: ``epoch-N`` or, mid-epoch, ``epoch-N-step-K``: a ``.pt`` file, or DeepSpeed's directory.
_NAME = re.compile(r"^epoch-(\d+)(?:-step-(\d+))?(\.pt)?$")


class CheckpointStore:
    """``epoch-N.pt`` files in one directory; the newest ``keep`` are kept. Of the mid-epoch
    ``epoch-N-step-K.pt`` (streamed data) only the newest is kept, until its epoch ends.
    Every rank reads the store (to resume); only the one with ``writer=True`` writes."""

    suffix = ".pt"

    def __init__(self, directory: Path, *, every: int = 1, keep: int = 2, writer: bool = True):
        self.directory = Path(directory)
        self.every, self.keep, self.writer = every, keep, writer

    def due(self, epoch: int, *, last: bool) -> bool:
        """Whether ``epoch`` (0-based) gets a checkpoint."""
        return last or (epoch + 1) % self.every == 0

    def save(self, epoch: int, state: dict[str, Any]) -> Path:
        """Write ``state`` for ``epoch``; older epochs beyond ``keep`` and its steps go."""
        path = self._write(f"epoch-{epoch}", state)
        if self.writer:
            found = self._found()
            epochs = [entry for entry in found if entry[1] == float("inf")]
            steps = [entry for entry in found if entry[1] != float("inf") and entry[0] <= epoch]
            for _, _, old in epochs[:-self.keep] + steps:
                _remove(old)
        return path

    def save_step(self, epoch: int, step: int, state: dict[str, Any]) -> Path:
        """Write a checkpoint after ``step`` batches of ``epoch``; older step checkpoints go."""
        path = self._write(f"epoch-{epoch}-step-{step}", state)
        if self.writer:
            for _, found_step, old in self._found():
                if found_step != float("inf") and old != path:
                    _remove(old)
        return path

    def _write(self, tag: str, state: dict[str, Any]) -> Path:
        """To a temporary name, fsync, then rename: a crash leaves the old file or the new."""
        path = self.directory / f"{tag}{self.suffix}"
        if self.writer:
            self.directory.mkdir(parents=True, exist_ok=True)
            with atomic_file(path) as handle:
                torch.save(state, handle)
        return path

    def _found(self) -> list[tuple[int, float, Path]]:
        """``(epoch, step or inf, path)`` of every complete checkpoint, oldest first."""
        if not self.directory.is_dir():
            return []
        found = []
        for path in self.directory.iterdir():
            match = _NAME.match(path.name)
            if match and (match.group(3) or "") == self.suffix and self._complete(path):
                step = float(match.group(2)) if match.group(2) else float("inf")
                found.append((int(match.group(1)), step, path))
        return sorted(found)

    def _complete(self, path: Path) -> bool:
        return path.is_file()

    def epochs(self) -> list[int]:
        """Epochs that have a complete checkpoint, oldest first."""
        return [epoch for epoch, step, _ in self._found() if step == float("inf")]

    def load_latest(self) -> Optional[dict[str, Any]]:
        """The newest checkpoint's state, or None when there is none."""
        found = self._found()
        if not found:
            return None
        return torch.load(found[-1][2], map_location="cpu", weights_only=False)

    def clear(self) -> None:
        """Remove every checkpoint, DeepSpeed's directories too (a fresh, non-resumed run)."""
        if not self.writer or not self.directory.is_dir():
            return
        for path in self.directory.glob("epoch-*"):
            if _NAME.match(path.name):
                _remove(path)
        (self.directory / "latest").unlink(missing_ok=True)


class DeepspeedCheckpoints(CheckpointStore):
    """Checkpoints through ``engine.save_checkpoint``: every rank writes its ZeRO partition to
    the tag's directory, which counts once the writer marks it ``.complete``.

    The loop's own state (epoch, history, early stopping, random generators) travels as
    DeepSpeed's client state; the engine restores weights and optimizer partitions itself.
    """

    suffix = ""

    def __init__(self, engine, directory: Path, *, every: int, keep: int, writer: bool):
        super().__init__(directory, every=every, keep=keep, writer=writer)
        self.engine = engine

    def _write(self, tag: str, state: dict[str, Any]) -> Path:
        client = {k: v for k, v in state.items() if k not in ("network", "optimizer")}
        self.engine.save_checkpoint(str(self.directory), tag=tag, client_state=client)
        dist.barrier()  # every partition is on disk before the checkpoint counts as complete
        if self.writer:
            (self.directory / tag / ".complete").touch()
        return self.directory / tag

    def _complete(self, path: Path) -> bool:
        return (path / ".complete").exists()

    def load_latest(self) -> Optional[dict[str, Any]]:
        found = self._found()
        if not found:
            return None
        _, client = self.engine.load_checkpoint(str(self.directory), tag=found[-1][2].name)
        return client

    def clear(self) -> None:
        """Cleared by the driver before launch, like the single-process store."""


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
