"""What the driver of a distributed training and its ranks exchange, as typed records.

The driver writes a :class:`RankJob`; each rank a :class:`RankReport`, rank 0 a
:class:`RankResult`, a failed rank its traceback. These JSON files in the work directory are
all that crosses the process boundary: the launchers pickle just the rank function and the
work directory's path.
"""

from __future__ import annotations

import json
import sys
import traceback
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Optional

from pydantic import TypeAdapter

from dbspec.errors import DbspecError
from dbspec.models.card import ModelCard
from dbspec.spec.sections import Spec
from dbspec.tracking.metrics import TrackingTarget
from dbspec.training.loop import TrainOutcome

JOB_FILE = "job.json"
RESULT_FILE = "result.json"


class DistributedError(DbspecError):
    """A rank failed or the distributor could not start."""


def _write(record: Any, path: Path, **dump: Any) -> None:
    """``record`` as JSON (pydantic's dump of the dataclass; NaN kept, as metrics may be)."""
    data = TypeAdapter(type(record)).dump_python(record, mode="json", by_alias=True, **dump)
    path.write_text(json.dumps(data))


def _read(cls: type, path: Path) -> Any:
    return TypeAdapter(cls).validate_python(json.loads(path.read_text()))


@dataclass(frozen=True)
class RankJob:
    """Everything a rank needs besides its shard of the data.

    Attributes:
        backend: The process group's backend, resolved by the driver (as is ``use_gpu``).
        epochs: Epoch override (smoke runs).
        tracking: The MLflow run rank 0 logs each epoch to, or None.
        deepspeed: The DeepSpeed config (``compute.kind: deepspeed``), else None.
        checkpoint_dir: Where the ranks checkpoint (absolute: ranks may run in another
            working directory); DeepSpeed's own format when ``deepspeed`` is set.
        shards: The shard set ranks stream from (``data.streaming``), else None (each rank
            reads its ``shard-<rank>.pt``).
    """

    spec: Spec
    card: ModelCard
    backend: str
    use_gpu: bool
    epochs: Optional[int] = None
    resume: bool = False
    tracking: Optional[TrackingTarget] = None
    deepspeed: Optional[dict[str, Any]] = None
    checkpoint_dir: Optional[Path] = None
    shards: Optional[Path] = None

    @property
    def zero3(self) -> bool:
        """DeepSpeed ZeRO-3: the parameters are partitioned between the ranks."""
        return (self.deepspeed or {}).get("zero_optimization", {}).get("stage") == 3

    def write(self, work_dir: Path) -> Path:
        """Write the job to ``work_dir/job.json``; returns the file."""
        path = Path(work_dir) / JOB_FILE
        _write(self, path)
        return path

    @classmethod
    def read(cls, work_dir: Path) -> "RankJob":
        """The job the driver wrote to ``work_dir``.

        Raises:
            DistributedError: no job there, or one this dbspec cannot read (written by
                another version on a node with a different installation).
        """
        path = Path(work_dir) / JOB_FILE
        try:
            return _read(cls, path)
        except FileNotFoundError:
            raise DistributedError(f"{path}: no job file (the driver writes it before the "
                                   "ranks start; is the work directory shared?)") from None
        except ValueError as exc:  # pydantic's ValidationError (its first problem), bad JSON
            first = " ".join(line.strip() for line in str(exc).splitlines()[:3])
            raise DistributedError(f"{path}: not a job this dbspec can read "
                                   f"({type(exc).__name__}: {first}); driver and ranks must run "
                                   "the same dbspec") from None


@dataclass(frozen=True)
class RankReport:
    """What one rank did: rows, speed, time, a checksum of its final weights (equal on every
    rank when DDP kept them in step), and how many of the network's parameters it held once
    built (under ZeRO-3, its partition; else all of them)."""

    rank: int
    rows: int
    samples_per_second: float
    seconds: float
    checksum: float
    held_parameters: Optional[int] = None

    def write(self, work_dir: Path) -> None:
        """Write ``work_dir/rank-N.json``."""
        _write(self, Path(work_dir) / f"rank-{self.rank}.json")

    @classmethod
    def read_all(cls, work_dir: Path) -> list["RankReport"]:
        """Every rank's report in ``work_dir``, by rank."""
        reports = [_read(cls, path) for path in Path(work_dir).glob("rank-*.json")]
        return sorted(reports, key=lambda report: report.rank)


@dataclass(frozen=True)
class RankResult:
    """Rank 0's account of the training: the loop's outcome and where it ran.

    Attributes:
        outcome: The training loop's outcome (its ``extra`` is left empty).
        diagnosis: Rank 0's monitor findings, in words.
        placement: Where the ranks ran, in words, when the launcher says (Ray); else None.
    """

    outcome: TrainOutcome
    world_size: int
    backend: str
    diagnosis: tuple[str, ...] = ()
    placement: Optional[str] = None

    def write(self, work_dir: Path) -> None:
        """Write ``work_dir/result.json``: the marker of a training that succeeded."""
        _write(self, Path(work_dir) / RESULT_FILE, exclude={"outcome": {"extra"}})

    @classmethod
    def read(cls, work_dir: Path) -> Optional["RankResult"]:
        """Rank 0's result in ``work_dir``, or None when it wrote none."""
        path = Path(work_dir) / RESULT_FILE
        return _read(cls, path) if path.exists() else None

    def with_placement(self, placement: Optional[str]) -> "RankResult":
        """The same result, saying where the ranks ran."""
        return replace(self, placement=placement)


def rank_errors(work_dir: Path) -> str:
    """Each failed rank's Python error, one ``rank-N: Type: message`` per rank ('' if none)."""
    errors = sorted(Path(work_dir).glob("rank-*.error"))
    return "; ".join(f"{p.stem}: {p.read_text().strip().splitlines()[-1]}" for p in errors)


def record_rank_failure(work_dir: Path, rank: int, exc: BaseException) -> None:
    """The rank's traceback into ``rank-N.error``, one line on its stderr."""
    record = Path(work_dir) / f"rank-{rank}.error"
    record.write_text("".join(traceback.format_exception(exc)))
    # one line on the rank's output (streamed to the driver), the traceback in the file:
    # the driver words the failure from these files, so a Python stack per rank is noise
    print(f"rank {rank} failed: {type(exc).__name__}: {str(exc)[:300]} (traceback in "
          f"{record})", file=sys.stderr, flush=True)

