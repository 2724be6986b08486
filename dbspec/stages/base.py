"""What every stage gets and gives: the context, the protocol, the progress reporter."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Protocol, TypeVar

from dbspec.atomic import write_atomic
from dbspec.errors import DbspecError
from dbspec.paths import inside
from dbspec.spec.loader import LoadedSpec
from dbspec.spec.sections import Spec
from dbspec.stages.outputs import StageOutput

O = TypeVar("O", bound=StageOutput)

#: Rows kept by ``--smoke`` runs; enough for every split and class.
SMOKE_ROWS = 200


@dataclass(frozen=True)
class RunOptions:
    """How this invocation runs its stages."""

    smoke: bool = False
    resume: bool = False
    show_progress: bool = True
    shared_dir: Optional[str] = None  # resolved: --shared-dir, DBSPEC_SHARED_DIR, spark.shared_dir
    master: Optional[str] = None  # --master of the spark executor


class Reporter:
    """Progress for people: an updating line per epoch on a terminal, stage lines otherwise."""

    def __init__(self, stream=None, *, enabled: bool = True):
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self._last = 0.0

    def line(self, text: str) -> None:
        if self.enabled:
            if self.tty:
                self.stream.write("\r\x1b[K")  # over the progress line
            print(text, file=self.stream, flush=True)

    def epoch(self, *, epoch: int, epochs: int, metrics: dict[str, float], **_: Any) -> None:
        """An updating progress bar with the epoch's metrics (terminals only, ~10 per second)."""
        shown = "  ".join(f"{k} {v:.4g}" for k, v in metrics.items()
                          if k in ("train_loss", "val_loss") or k.startswith("val_"))
        if "process_cpu_percent" in metrics:
            shown += f"  cpu {metrics['process_cpu_percent']:.0f}%"
        gpus = [v for k, v in metrics.items() if k.endswith("_utilization_percent")]
        if gpus:
            shown += "  gpu " + "/".join(f"{v:.0f}%" for v in gpus)
        if "samples_per_second" in metrics:
            shown += f"  {metrics['samples_per_second']:,.0f} samples/s"
        if metrics.get("input_stall_seconds", 0.0) >= 0.05:  # streamed data waited for
            shown += f"  stalled {metrics['input_stall_seconds']:.1f} s"
        self.progress("epoch", epoch + 1, epochs, shown)

    def progress(self, unit: str, done: int, total: int, detail: str = "") -> None:
        """``[#####.....] unit done/total  detail`` on one updating line (terminals only)."""
        if not self.tty:
            return
        now = time.monotonic()
        if now - self._last < 0.1 and done < total:
            return
        self._last = now
        filled = int(20 * done / max(total, 1))
        self.stream.write(f"\r  [{'#' * filled}{'.' * (20 - filled)}] {unit} {done}/{total}  "
                          f"{detail}\x1b[K")
        self.stream.flush()


@dataclass
class StageContext:
    """Everything a stage may use; stages read inputs here and write only to ``directory``."""

    loaded: LoadedSpec
    directory: Path
    project_dir: Path
    upstream: dict[str, dict[str, Any]]  # recorded outputs (JSON): read them with output()
    upstream_dirs: dict[str, Path]
    options: RunOptions
    reporter: Reporter
    _tracker: Any = field(default=None, repr=False)
    spark: Any = field(default=None, repr=False)  # the spark executor's session, else None
    run_name: str = ""  # the state slot, ``<spec>[@target][-smoke]``

    @property
    def spec(self) -> Spec:
        return self.loaded.spec

    @property
    def tracker(self):
        """The MLflow tracker, created on first use (MLflow is slow to import)."""
        if self._tracker is None:
            from dbspec.tracking.mlflow_tracking import Tracker

            experiment = experiment_name(self.spec, True) if self.options.smoke else None
            self._tracker = Tracker(self.spec, self.project_dir, experiment=experiment)
        return self._tracker

    def output(self, kind: type[O]) -> O:
        """The recorded output of the upstream stage that makes ``kind``.

        Raises:
            KeyError: that stage is not upstream of this one (a bug in the plan).
            OutputError: the recorded output lacks a field this version needs.
        """
        return kind.from_json(self.upstream[kind.stage])

    def has_output(self, kind: type[StageOutput]) -> bool:
        """Whether the stage that makes ``kind`` is upstream of this one (``tune`` may not be)."""
        return kind.stage in self.upstream

    def dir_of(self, stage: str) -> Path:
        """The directory an upstream stage wrote its files to."""
        return self.upstream_dirs[stage]

    def shared_stage_dir(self) -> Path:
        """This stage's folder in the shared dir, for files that executors read or write.

        Laid out like the state dir (``runs/<spec>[@target][-smoke]/<stage>``), so a rerun
        or a resumed run of the same spec finds its checkpoints there.

        Raises:
            DbspecError: no shared dir is set.
        """
        if not self.options.shared_dir:
            raise DbspecError("spark.shared_dir: this stage's executors need a shared dir; set "
                              "spark.shared_dir, DBSPEC_SHARED_DIR or --shared-dir")
        return inside(Path(self.options.shared_dir) / "runs", self.run_name or self.spec.name,
                      self.directory.name)


class Stage(Protocol):
    """A step of the plan; a small value holding the slice of the spec it reads."""

    name: str

    def run(self, ctx: StageContext) -> StageOutput:
        """Do the work; write files under ``ctx.directory``; return the stage's record."""
        ...


def write_json(path: Path, data: Any) -> None:
    """Write JSON atomically (a crash leaves the old file or the new one, never half)."""
    write_atomic(path, json.dumps(data, indent=2, default=str))


def experiment_name(spec: Spec, smoke: bool) -> str:
    """The MLflow experiment of a run; smoke runs log to ``<experiment>-smoke``."""
    return (spec.tracking.experiment or spec.name) + ("-smoke" if smoke else "")


def registry_name(spec: Spec, options: RunOptions) -> Optional[str]:
    """The registered model name; smoke runs register under ``<name>_smoke``."""
    if spec.registry is None:
        return None
    return spec.registry.name + ("_smoke" if options.smoke else "")
