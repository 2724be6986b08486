"""The stage state a run records between invocations (one entry per stage), and what one
invocation did (:class:`RunRecord`, the input of the run summary).

:class:`StageEntry` and :class:`RunState` alone turn the state into JSON and back
(``state.json``, a run key's ``dbspec/state/<stage>.json``, the cache's ``<fingerprint>.json``):
keys an entry lacks read as unset, and unset keys are not written.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, TypeVar

from dbspec.executors.cache import LAYOUT
from dbspec.stages.outputs import StageOutput

O = TypeVar("O", bound=StageOutput)

#: ``status`` of a stage: started and not finished (or killed), finished, raised.
RUNNING, DONE, FAILED = "running", "done", "failed"


@dataclass(frozen=True)
class StageEntry:
    """One stage's recorded state.

    Attributes:
        fingerprint: The plan's fingerprint of the stage when it ran.
        status: ``running``, ``done`` or ``failed``.
        output: The stage's output as JSON, empty until it is done.
        chain: The fingerprint without the executor (a data stage rerun only because the
            executor changed keeps what follows it).
        seconds, finished_at, inputs: Of a done entry: how long it ran, when it finished
            (UTC; part of the entry's identity), the identities of the upstream entries it read.
        error: ``Type: message`` of what a failed entry raised.
    """

    fingerprint: str
    status: str
    output: dict[str, Any] = field(default_factory=dict)
    chain: Optional[str] = None
    seconds: Optional[float] = None
    finished_at: Optional[str] = None
    inputs: Optional[dict[str, str]] = None
    error: Optional[str] = None

    @property
    def done(self) -> bool:
        return self.status == DONE

    def to_json(self) -> dict[str, Any]:
        """The JSON object recorded (unset keys left out)."""
        return {key: value for key, value in asdict(self).items() if value is not None}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "StageEntry":
        """An entry as recorded (unknown keys, such as the cache's ``used``, are ignored; a
        missing fingerprint or status reads as empty, which no plan matches)."""
        return cls(fingerprint=str(data.get("fingerprint") or ""),
                   status=str(data.get("status") or ""),
                   output=dict(data.get("output") or {}),
                   chain=data.get("chain"), seconds=data.get("seconds"),
                   finished_at=data.get("finished_at"),
                   inputs=dict(data["inputs"]) if data.get("inputs") is not None else None,
                   error=data.get("error"))


@dataclass
class RunState:
    """The recorded stages of one run directory (or run key)."""

    stages: dict[str, StageEntry] = field(default_factory=dict)

    def entry(self, name: str) -> Optional[StageEntry]:
        return self.stages.get(name)

    def stages_json(self) -> dict[str, dict[str, Any]]:
        """Every entry as JSON, by stage (what the cache's identities are computed from)."""
        return {name: entry.to_json() for name, entry in self.stages.items()}

    def to_json(self) -> dict[str, Any]:
        """``state.json``, with the layout of the stage cache it describes."""
        return {"stages": self.stages_json(), "layout": LAYOUT}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "RunState":
        stages = data.get("stages") or {}
        return cls({name: StageEntry.from_json(entry) for name, entry in stages.items()
                    if isinstance(entry, Mapping)})


@dataclass(frozen=True)
class StageRecord:
    """What happened to one stage in this invocation: ``action`` is ``ran`` or ``cached``
    (skipped, reused from the cache, or recorded, with ``--only``); ``output`` is its record as
    JSON (read it typed with :meth:`RunRecord.output`)."""

    name: str
    action: str
    seconds: float = 0.0
    output: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RunRecord:
    """The outcome of one ``dbspec run``."""

    spec: str
    target: Optional[str]
    run_dir: Path
    stages: list[StageRecord]

    def output(self, kind: type[O]) -> Optional[O]:
        """The output of the stage that makes ``kind``; None when it is not in this run."""
        found = next((s for s in self.stages if s.name == kind.stage and s.output), None)
        return kind.from_json(found.output) if found is not None else None
