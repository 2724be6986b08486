"""The Spark executor: the local executor with one Spark session around the whole run, for the
data stages, the distributors and the study's trial tasks. The session starts after the run lock
is taken (a second run is refused before paying for a session).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Sequence

from dbspec.executors.local import LocalExecutor, RunRecord
from dbspec.spec.loader import LoadedSpec


class SparkExecutor(LocalExecutor):
    """The local executor with a Spark session, started and stopped here, once."""

    kind = "spark"

    def __init__(self, project_dir: Path, *, master: Optional[str] = None, **kwargs: Any):
        super().__init__(project_dir, **kwargs)
        self.master_override = master

    def master(self, loaded: LoadedSpec) -> str:
        from dbspec.spark.session import master_url

        return master_url(loaded.spec, self.master_override)

    def run(self, loaded: LoadedSpec, *, only: Sequence[str] = (),
            from_stage: Optional[str] = None, run_key: Optional[str] = None) -> RunRecord:
        from dbspec.spark.session import spark_session
        from dbspec.spark.probe import check_executors

        self.check_placement(loaded)  # before the session: starting one takes seconds
        with self.guarded(loaded, run_key):  # a second run is refused before its session too
            self.reporter.line(f"> spark session on {self.master(loaded)}")
            with spark_session(loaded.spec, self.master_override,
                               say=self.reporter.line) as session:
                self.spark = session
                try:
                    check_executors(session, loaded.spec, shared_dir=self.options.shared_dir,
                                    executor=self.kind, say=self.reporter.line)
                    return super().run(loaded, only=only, from_stage=from_stage,
                                       run_key=run_key)
                finally:
                    self.spark = None

    def data_version(self, loaded: LoadedSpec) -> str:
        from dbspec.seams.sources import source_kind

        data = loaded.spec.data
        return source_kind(data).spark_version(self.spark, data, base=Path.cwd())
