"""What several compute kinds share: the GPU-choice type, and two bases that give a kind the
defaults of training in this process (:class:`InProcessKind`) or on launcher ranks
(:class:`RankKind`). A kind overrides only what differs; nothing here names a kind."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, ClassVar, Iterable, Literal, Mapping, Optional, Union

from dbspec.errors import DbspecError
from dbspec.seams.compute import ComputeFinding, RankSettings
from dbspec.spec.databricks import Resources

#: ``use_gpu``: true, false, or ``auto`` (GPUs when this process sees one).
GpuChoice = Union[bool, Literal["auto"]]
#: A process group's backend; ``auto``: nccl on GPUs, gloo on CPUs.
Backend = Literal["auto", "gloo", "nccl"]
NO_RESOURCES = Resources(0, 0, False)


def torch_device(wanted: str):
    """The torch device called ``wanted`` (``auto``: CUDA when present); a clear error when
    it is not there."""
    import torch

    if wanted == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if wanted == "cuda" and not torch.cuda.is_available():
        raise DbspecError("compute.device cuda: no CUDA GPU is visible; use device: auto or cpu")
    if wanted == "mps" and not torch.backends.mps.is_available():
        raise DbspecError("compute.device mps: Apple's MPS backend is not available here")
    return torch.device(wanted)


def resolve_gpu(choice: GpuChoice) -> bool:
    """``use_gpu`` with ``auto`` decided by whether this process sees a CUDA GPU."""
    if choice == "auto":
        import torch

        return torch.cuda.is_available()
    return bool(choice)


def resolve_backend(backend: str, use_gpu: bool) -> str:
    """``auto``: nccl on GPUs, gloo on CPUs."""
    return backend if backend != "auto" else ("nccl" if use_gpu else "gloo")


class _Kind:
    """Defaults every kind shares: no checks, nothing extra to install, no job GPUs."""

    name: ClassVar[str]
    model: ClassVar[type]
    serverless: ClassVar[bool] = False
    #: Its ranks are started through Spark (a session is opened for the launcher).
    spark_launched: ClassVar[bool] = False
    extras: ClassVar[Mapping[str, str]] = {}

    def check(self, spec) -> Iterable[ComputeFinding]:
        return ()

    def check_runnable(self, spec, *, quick: bool) -> None:
        pass

    def gpu_expected(self, compute) -> bool:
        return False

    def resources(self, compute) -> Resources:
        return NO_RESOURCES

    def trains_on_gpu(self, compute) -> bool:
        return self.resources(compute).gpus_per_node > 0


class InProcessKind(_Kind):
    """A kind that trains in this process, on the device :meth:`device` picks."""

    distributed: ClassVar[bool] = False

    def device(self, compute):
        return torch_device(getattr(compute, "device", "auto"))

    def world_size(self, compute) -> int:
        return 1

    def remote_ranks(self, compute) -> Optional[str]:
        return None

    def rank_settings(self, spec) -> RankSettings:
        raise DbspecError(f"compute.kind {self.name} trains in this process, not on ranks")

    def start_ranks(self, spec, settings: RankSettings, work_dir: Path,
                    say: Callable[[str], None]) -> Optional[str]:
        raise DbspecError(f"compute.kind {self.name} trains in this process, not on ranks")


class RankKind(_Kind):
    """A kind whose training runs on a launcher's ranks (DDP): the ranks train on the device
    their rank owns, so the driver keeps the CPU."""

    distributed: ClassVar[bool] = True
    spark_launched: ClassVar[bool] = True

    def device(self, compute):
        """The driver's: the CPU (the ranks pick their own)."""
        import torch

        return torch.device("cpu")

    def gpu_expected(self, compute) -> bool:
        """``use_gpu: true`` asks for GPUs; ``auto`` is content with CPUs."""
        return compute.use_gpu is True

    def remote_ranks(self, compute) -> Optional[str]:
        """With ``local_mode: false`` the ranks are Spark tasks."""
        return None if compute.local_mode else "training ranks (compute.local_mode: false)"

    def rank_settings(self, spec) -> RankSettings:
        use_gpu = resolve_gpu(spec.compute.use_gpu)
        return RankSettings(use_gpu, resolve_backend(spec.compute.backend, use_gpu))

    def start_ranks(self, spec, settings: RankSettings, work_dir: Path,
                    say: Callable[[str], None]) -> Optional[str]:
        from dbspec.training.distributed import run_distributor

        distributor = self.distributor(spec.compute, settings)
        run_distributor(distributor, work_dir, watch_executors=not spec.compute.local_mode)
        return None

    def distributor(self, compute, settings: RankSettings) -> Any:
        """The pyspark distributor that starts the ranks."""
        raise NotImplementedError

