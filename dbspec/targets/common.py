"""What serving targets share: defaults (:class:`Target`) and the batch targets' spec checks
(:class:`BatchTarget`). A target overrides only what differs."""

from __future__ import annotations

from typing import ClassVar, Iterable, Optional

from dbspec.seams.targets import Finding


class Target:
    """Defaults: no plan stage, no job task, no checks beyond the section's types."""

    name: ClassVar[str]
    mode: ClassVar[str]
    engine: ClassVar[str]
    reads_table_names: ClassVar[bool] = False
    summary: ClassVar[str]
    stage: ClassVar[Optional[str]] = None
    job_task: ClassVar[Optional[str]] = None

    def check(self, spec) -> Iterable[Finding]:
        return ()

    def job_warnings(self, spec) -> Iterable[str]:
        return ()


class BatchTarget(Target):
    """A batch engine: the plan's ``batch_predict`` stage scores ``serving.batch.input``."""

    mode = "batch"
    stage = "batch_predict"

    def check(self, spec) -> Iterable[Finding]:
        if spec.serving.batch is None:
            yield Finding(("serving",), "mode batch needs a 'batch' section with input and output")

    def job_warnings(self, spec) -> Iterable[str]:
        """An input on this machine's disk, which a job's cluster does not see."""
        batch = spec.serving.batch
        if batch is not None and batch.input.startswith((".", "/tmp")):
            yield (f"serving.batch.input '{batch.input}' is a local path; a job needs a table "
                   "name, a /Volumes path or cloud storage")
