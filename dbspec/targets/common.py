"""What several serving targets share: defaults every target takes (:class:`Target`) and the
batch targets' spec checks (:class:`BatchTarget`). A target overrides only what differs;
nothing here names a target."""

from __future__ import annotations

from typing import ClassVar, Iterable, Optional

from dbspec.seams.targets import Finding

#: Hosts a server may bind without a token: only this machine reaches them.
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


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
        """No problems beyond the section's types."""
        return ()

    def job_warnings(self, spec) -> Iterable[str]:
        """Nothing breaks in a job."""
        return ()


class BatchTarget(Target):
    """A batch engine: the plan's ``batch_predict`` stage scores ``serving.batch.input``."""

    mode = "batch"
    stage = "batch_predict"

    def check(self, spec) -> Iterable[Finding]:
        """The batch mode needs its section."""
        if spec.serving.batch is None:
            yield Finding(("serving",), "mode batch needs a 'batch' section with input and output")

    def job_warnings(self, spec) -> Iterable[str]:
        """An input on this machine's disk, which a job's cluster does not see."""
        batch = spec.serving.batch
        if batch is not None and batch.input.startswith((".", "/tmp")):
            yield (f"serving.batch.input '{batch.input}' is a local path; a job needs a table "
                   "name, a /Volumes path or cloud storage")
