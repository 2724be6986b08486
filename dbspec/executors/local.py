"""Run a plan's stages in order in this process, with stage state on disk.

Each stage's outputs and fingerprint are kept under ``.dbspec/runs/<spec>/``. A rerun skips
stages whose fingerprint is unchanged; a change reruns what depends on it; ``--from`` forces a
stage and its dependents; ``--only`` runs one stage on recorded inputs; ``--resume`` continues
an interrupted training from its last checkpoint.
"""

from __future__ import annotations

import json
import shutil
import time
import traceback
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Optional

from dbspec.errors import DbspecError, UsageError, did_you_mean
from dbspec.plan import Plan, compile_plan
from dbspec.spec.loader import LoadedSpec
from dbspec.stages import build_stage
from dbspec.stages.base import Reporter, RunOptions, StageContext, write_json


class StageFailed(DbspecError):
    """A stage raised; the run stopped there and can be resumed."""


@dataclass
class StageRecord:
    """What happened to one stage in this invocation."""

    name: str
    action: str  # ran | cached | failed
    seconds: float = 0.0
    output: dict[str, Any] = field(default_factory=dict)


@dataclass
class RunRecord:
    """The outcome of one ``dbspec run``."""

    spec: str
    target: Optional[str]
    run_dir: Path
    stages: list[StageRecord]

    def output(self, stage: str) -> dict[str, Any]:
        return next((s.output for s in self.stages if s.name == stage), {})


class LocalExecutor:
    """Runs stages in order; template method: :meth:`run` checks, :meth:`_run` works."""

    def __init__(self, project_dir: Path, *, options: RunOptions = RunOptions(),
                 reporter: Optional[Reporter] = None, resume_command: str = ""):
        self.project_dir = Path(project_dir)
        self.options = options
        self.reporter = reporter or Reporter(enabled=options.show_progress)
        self.resume_command = resume_command
        self.spark = None

    def run(self, loaded: LoadedSpec, *, only: Optional[str] = None,
            from_stage: Optional[str] = None) -> RunRecord:
        """Run the spec's plan.

        Raises:
            UsageError: ``only``/``from_stage`` names no stage of the plan, or ``only`` lacks
                recorded inputs.
            StageFailed: a stage raised; its error is recorded and the run can resume.
        """
        version = self.data_version(loaded)
        plan = compile_plan(loaded.spec, data_version=version)
        for name in (only, from_stage):
            if name is not None and name not in plan.names:
                raise UsageError(f"no stage '{name}' in this plan{did_you_mean(name, plan.names)}"
                                 f"; stages: {', '.join(plan.names)}")
        for planned in plan:  # fail before any work when a stage cannot run here
            stage = build_stage(planned)
            if hasattr(stage, "check"):
                stage.check(loaded.spec)
        run_dir = self.run_dir(loaded)
        state = _load_state(run_dir)
        if only is not None:
            self._check_inputs(plan, only, state)
        return self._run(loaded, plan, run_dir, state, only=only, from_stage=from_stage)

    def data_version(self, loaded: LoadedSpec) -> str:
        """The version of the spec's data, resolved without reading the rows."""
        from dbspec.data.sources import resolve_version

        return resolve_version(loaded.spec.data, base=Path.cwd())

    def run_dir(self, loaded: LoadedSpec) -> Path:
        """``.dbspec/runs/<spec>[@target][-smoke]``."""
        name = loaded.spec.name + (f"@{loaded.target}" if loaded.target else "")
        return self.project_dir / "runs" / (name + ("-smoke" if self.options.smoke else ""))

    def _check_inputs(self, plan: Plan, only: str, state: dict[str, Any]) -> None:
        for dep in plan.ancestors(only):
            recorded = state["stages"].get(dep, {})
            if recorded.get("status") != "done" or recorded.get("fingerprint") != \
                    plan[dep].fingerprint:
                raise UsageError(f"--only {only}: the output of '{dep}' is missing or stale for "
                                 f"this spec; run without --only (or --from {dep}) first")

    def _run(self, loaded: LoadedSpec, plan: Plan, run_dir: Path, state: dict[str, Any], *,
             only: Optional[str], from_stage: Optional[str]) -> RunRecord:
        forced = set(plan.downstream(from_stage)) if from_stage else set()
        records: list[StageRecord] = []
        tracker = None
        for planned in plan:
            recorded = state["stages"].get(planned.name, {})
            current = recorded.get("fingerprint") == planned.fingerprint
            if only is not None and planned.name != only:
                if current and recorded.get("status") == "done":  # for the summary only
                    records.append(StageRecord(planned.name, "cached", 0.0, recorded["output"]))
                continue
            if only is None and planned.name not in forced and current and \
                    recorded.get("status") == "done" and \
                    not getattr(build_stage(planned), "always_runs", False):
                self.reporter.line(f"= {planned.name:<11} unchanged, skipped")
                records.append(StageRecord(planned.name, "cached", 0.0, recorded["output"]))
                continue
            directory = run_dir / "stages" / planned.name
            resume = self.options.resume and current and recorded.get("status") != "done"
            if not resume and directory.exists():
                shutil.rmtree(directory)
            directory.mkdir(parents=True, exist_ok=True)
            ctx = StageContext(
                loaded=loaded, directory=directory, project_dir=self.project_dir,
                upstream={d: state["stages"][d]["output"] for d in plan.ancestors(planned.name)},
                upstream_dirs={d: run_dir / "stages" / d for d in plan.ancestors(planned.name)},
                options=replace(self.options, resume=resume), reporter=self.reporter,
                _tracker=tracker, spark=self.spark)
            state["stages"][planned.name] = {"fingerprint": planned.fingerprint,
                                             "status": "running", "output": {}}
            for later in plan.downstream(planned.name)[1:]:
                state["stages"].pop(later, None)  # their inputs are about to change
            _save_state(run_dir, state)
            self.reporter.line(f"> {planned.name}" + (" (resuming)" if resume else ""))
            started = time.perf_counter()
            try:
                output = build_stage(planned).run(ctx)
            except BaseException as exc:
                self._fail(run_dir, state, planned.name, directory, exc)
                if isinstance(exc, KeyboardInterrupt):
                    raise
                raise StageFailed(self._failure_message(loaded, planned.name, exc, directory)) \
                    from None if isinstance(exc, DbspecError) else exc
            tracker = ctx._tracker
            seconds = time.perf_counter() - started
            state["stages"][planned.name] = {"fingerprint": planned.fingerprint,
                                             "status": "done", "output": output,
                                             "seconds": seconds, "finished_at": _now()}
            _save_state(run_dir, state)
            self.reporter.line(f"  {planned.name} done in {seconds:.1f}s")
            records.append(StageRecord(planned.name, "ran", seconds, output))
        return RunRecord(loaded.spec.name, loaded.target, run_dir, records)

    def _fail(self, run_dir, state, name, directory, exc) -> None:
        detail = "".join(traceback.format_exception(exc))
        (directory / "error.txt").write_text(detail)
        entry = state["stages"][name]
        entry.update(status="failed", error=f"{type(exc).__name__}: {exc}")
        _save_state(run_dir, state)

    def _failure_message(self, loaded, name, exc, directory) -> str:
        if isinstance(exc, DbspecError):
            cause = str(exc)
        else:
            cause = f"{type(exc).__name__}: {exc} (traceback in {directory / 'error.txt'})"
        hint = f"\n  resume with: {self.resume_command} --resume" if self.resume_command else ""
        return f"stage '{name}' failed: {cause}{hint}"


class SparkExecutor(LocalExecutor):
    """The local executor with a Spark session: data stages read through Spark, and the
    distributors use the same session. The session is started and stopped here, once."""

    def __init__(self, project_dir: Path, *, master: Optional[str] = None, **kwargs: Any):
        super().__init__(project_dir, **kwargs)
        self.master = master

    def run(self, loaded: LoadedSpec, *, only: Optional[str] = None,
            from_stage: Optional[str] = None) -> RunRecord:
        from dbspec.spark import master_url, spark_session

        self.reporter.line(f"> spark session on {master_url(loaded.spec, self.master)}")
        with spark_session(loaded.spec, self.master) as session:
            self.spark = session
            try:
                return super().run(loaded, only=only, from_stage=from_stage)
            finally:
                self.spark = None

    def data_version(self, loaded: LoadedSpec) -> str:
        from dbspec.data.spark_sources import spark_version

        return spark_version(self.spark, loaded.spec.data, base=Path.cwd())


def _load_state(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "state.json"
    if path.exists():
        try:
            return json.loads(path.read_text())
        except json.JSONDecodeError:
            pass  # a state file from a crash mid-write: start over rather than guess
    return {"stages": {}}


def _save_state(run_dir: Path, state: dict[str, Any]) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json(run_dir / "state.json", state)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
