"""The compute seam: where training runs.

A compute kind is one module (``dbspec/compute/<kind>.py``, or an installed plugin registering
an entry point in ``dbspec.compute``) holding everything about that kind: its spec section,
its checks at validate, where and how it trains, the Databricks job cluster it asks for and
what it needs installed. Callers ask the kind (``COMPUTE.get(spec.compute.kind)``); they never
switch on its name.

Adding a kind: write its module with a spec model (``kind: Literal["name"]``) and a ``KIND``
object implementing :class:`ComputeKind` (:mod:`dbspec.compute.common` has bases for in-process
and rank-launched training), then either add one line to ``COMPUTE`` below (built-in) or
register it as an entry point in the ``dbspec.compute`` group of your own package (plugin; see
``tests/plugins/toy_compute``). Validate, plan, schema, run and jobs pick it up unchanged.
"""

from __future__ import annotations

from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Iterable,
    Mapping,
    NamedTuple,
    Optional,
    Protocol,
    runtime_checkable,
)

from dbspec.plugins import KindRegistry

if TYPE_CHECKING:
    from pathlib import Path

    from dbspec.spec.databricks import Resources
    from dbspec.spec.sections import Spec


class ComputeFinding(NamedTuple):
    """A problem a compute kind finds at validate, at a dotted path of the spec."""

    path: tuple
    message: str
    warning: bool = False
    at_key: bool = False


@runtime_checkable
class ComputeKind(Protocol):
    """What dbspec asks of a compute kind.

    Attributes:
        name: The ``compute.kind`` value.
        model: The pydantic model of its ``compute`` section (``kind: Literal[name]``).
        distributed: Whether training runs on a launcher's ranks (else in this process).
        serverless: Whether the Databricks job runs on AI Runtime (no job clusters).
        spark_launched: Whether its ranks are started through Spark (a session is opened).
        extras: Third-party module -> the dbspec extra that installs it, for what this kind
            imports beyond the ``train`` extra (tasks install them; errors name them).
    """

    @property
    def name(self) -> str: ...

    @property
    def model(self) -> type[Any]: ...

    @property
    def distributed(self) -> bool: ...

    @property
    def serverless(self) -> bool: ...

    @property
    def spark_launched(self) -> bool: ...

    @property
    def extras(self) -> Mapping[str, str]: ...

    def check(self, spec: Spec) -> Iterable[ComputeFinding]:
        """Problems of the spec that types alone cannot express, found at validate."""

    def check_runnable(self, spec: Spec, *, quick: bool) -> None:
        """Refuse before training what cannot run here (a missing package, a bad config)."""

    def device(self, compute: Any) -> Any:
        """The torch device in-process training uses (distributed kinds: the CPU)."""

    def gpu_expected(self, compute: Any) -> bool:
        """Whether the section asks for a GPU outright (``auto`` is content with a CPU)."""

    def world_size(self, compute: Any) -> int:
        """How many ranks train (1 in process)."""

    def remote_ranks(self, compute: Any) -> Optional[str]:
        """Where the ranks run, in words, when they are Spark tasks; None on this machine."""

    def rank_settings(self, spec: Spec) -> RankSettings:
        """GPU use, process-group backend and engine config of the ranks (``auto`` resolved)."""

    def start_ranks(self, spec: Spec, settings: RankSettings, work_dir: Path,
                    say: Callable[[str], None]) -> Optional[str]:
        """Run :func:`dbspec.training.rank.rank_main` on every rank over ``work_dir``; returns
        where they ran in words when the launcher says, else None."""

    def resources(self, compute: Any) -> Resources:
        """GPUs per node and workers of the Databricks training cluster."""

    def trains_on_gpu(self, compute: Any) -> bool:
        """Whether the job trains on GPUs (so the serving endpoint serves on them too)."""


class RankSettings(NamedTuple):
    """How every rank trains, resolved on the driver.

    Attributes:
        use_gpu: Ranks train on their GPU.
        backend: The process group's backend (``gloo``, ``nccl``).
        engine_config: The training engine's config (DeepSpeed's), else None.
    """

    use_gpu: bool
    backend: str
    engine_config: Optional[dict[str, Any]] = None


#: The compute kinds: dbspec's own, plus those of installed plugins.
COMPUTE: KindRegistry[ComputeKind] = KindRegistry("dbspec.compute", "compute kind", {
    "local": "dbspec.compute.local:KIND",
    "single_gpu": "dbspec.compute.single_gpu:KIND",
    "torch_distributor": "dbspec.compute.torch_distributor:KIND",
    "deepspeed": "dbspec.compute.deepspeed:KIND",
    "ray": "dbspec.compute.ray:KIND",
    "serverless_gpu": "dbspec.compute.serverless_gpu:KIND",
})

def compute_kind(spec: Spec) -> ComputeKind:
    """The kind of ``spec.compute``."""
    return COMPUTE.get(spec.compute.kind)


def trains_on_ranks(spec: Spec) -> bool:
    """Whether training runs on launched ranks: a distributed kind, or a kind asking for more
    than one (AI Runtime on several GPUs)."""
    kind = compute_kind(spec)
    return kind.distributed or kind.world_size(spec.compute) > 1
