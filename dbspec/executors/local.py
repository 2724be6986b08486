"""Run a plan's stages in order in this process.

Stage state is kept per run directory (:mod:`.state`), each stage's files per fingerprint
(:mod:`.cache`). A rerun skips stages whose fingerprint has a finished entry (``batch_predict``
always runs: its input lives outside the spec) and reruns what depends on a change; ``--from``
forces a stage and its dependents, ``--only`` runs the named stages on recorded inputs,
``--resume`` continues an interrupted training. One run per run directory at a time
(:mod:`.lock`); dead runs and SIGTERM are :mod:`.recovery`'s.
"""

from __future__ import annotations

import contextlib
import time
import traceback
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

from dbspec.errors import DbspecError, UsageError, did_you_mean
from dbspec.executors.cache import RERUN_FROM_CACHE, inputs_of, keep_from_env, run_dir_for
from dbspec.executors.lock import RunLock, describe_holder
from dbspec.executors.records import (DONE, FAILED, RUNNING, RunRecord, RunState, StageEntry,
                                      StageRecord)
from dbspec.executors.recovery import (RunTerminated, Terminated, end_dead_runs,
                                       failure_message, sigterm_unwinds)
from dbspec.executors.state import LocalState, MlflowState, state_dir_of
from dbspec.faults import pause_point
from dbspec.plan import Plan, compile_plan
from dbspec.spec.checkpoints import checkpoint_version
from dbspec.spec.loader import LoadedSpec
from dbspec.stages import build_stage
from dbspec.stages.base import Reporter, RunOptions, StageContext, experiment_name
from dbspec.tracking.mlflow_tracking import (TrackingError, check_tracking_server,
                                             resolve_tracking_uri)
from dbspec.tracking.stores import check_location, sqlite_path


@dataclass(frozen=True)
class _Pass:
    """One pass over a plan: what every stage of it is run against."""

    loaded: LoadedSpec
    plan: Plan
    store: LocalState
    state: RunState
    only: tuple[str, ...]


class StageFailed(DbspecError):
    """A stage raised; the run stopped there and can be resumed."""


class LocalExecutor:
    """Runs stages in order; template method: :meth:`run` checks, :meth:`_run` works."""

    def __init__(self, project_dir: Path, *, options: RunOptions = RunOptions(),
                 reporter: Optional[Reporter] = None, resume_command: str = ""):
        self.project_dir = Path(project_dir)
        self.options = options
        self.reporter = reporter or Reporter(enabled=options.show_progress)
        self.resume_command = resume_command
        self.spark: Any = None  # the Spark session of a run on Spark (executors.spark)
        self._tracker = None
        self._locked = False
        self._stage_now: Optional[str] = None

    def run(self, loaded: LoadedSpec, *, only: Sequence[str] = (),
            from_stage: Optional[str] = None, run_key: Optional[str] = None) -> RunRecord:
        """Run the spec's plan (``only``: just these stages, on recorded inputs).

        Raises:
            UsageError: ``only``/``from_stage`` names no stage of the plan, or ``only`` lacks
                recorded inputs.
            RunLocked: another process runs this spec in the same run directory.
            StageFailed: a stage raised; its error is recorded and the run can resume.
            RunTerminated: SIGTERM stopped the run (recorded as failed; resumable).
        """
        only = tuple(only)
        version = self.data_version(loaded)
        plan = compile_plan(loaded.spec, data_version=version, executor=self.kind,
                            checkpoint_version=checkpoint_version(loaded.spec))
        for name in (*only, from_stage):
            if name is not None and name not in plan.names:
                raise UsageError(f"no stage '{name}' in this plan{did_you_mean(name, plan.names)}"
                                 f"; stages: {', '.join(plan.names)}")
        for planned in plan:  # fail before any work when a stage cannot run here
            if only and planned.name not in only:
                continue  # another task's stage (a job task runs a few with --only)
            stage = build_stage(planned)
            if hasattr(stage, "check"):
                stage.check(loaded.spec)
        self.check_placement(loaded)
        keep = keep_from_env()  # a bad DBSPEC_CACHE_KEEP fails before any work
        with self.guarded(loaded, run_key):
            store = self.state_store(loaded, run_key)
            state = store.load()
            store.tidy()
            if only:
                self._check_inputs(plan, only, state)
            status = "FAILED"
            try:
                record = self._run(loaded, plan, store, state, only=only, from_stage=from_stage)
                removed = store.evict(state, keep)
                if removed:
                    self.reporter.line(f"  cache: {len(removed)} older entries removed "
                                       f"({sum(r.bytes for r in removed) / 1e6:.1f} MB; at most "
                                       f"{keep} kept per stage, DBSPEC_CACHE_KEEP)")
                status = "FINISHED"
                return record
            except KeyboardInterrupt:
                status = "KILLED"
                raise
            finally:
                store.finish(status)

    @contextlib.contextmanager
    def guarded(self, loaded: LoadedSpec, run_key: Optional[str]) -> Iterator[None]:
        """Hold the run directory's lock, end the MLflow runs dead processes left RUNNING,
        and turn SIGTERM into :class:`RunTerminated` (re-entrant: the spark executor enters
        it before its session starts, and the run again inside)."""
        if self._locked:
            yield
            return
        what = f"dbspec run {loaded.spec.name}" + (f" --target {loaded.target}"
                                                   if loaded.target else "")
        lock = RunLock(state_dir_of(self.run_dir(loaded), run_key))
        self._locked = True
        try:
            with sigterm_unwinds():
                lock.acquire(what)
                try:
                    self._say_lock(lock)
                    if self._after_a_crash(lock, loaded, run_key):
                        self.end_dead_runs(loaded)
                    yield
                except Terminated:
                    stage = f" during stage '{self._stage_now}'" if self._stage_now else ""
                    hint = (f"; resume with: {self.resume_command} --resume"
                            if self.resume_command else "")
                    raise RunTerminated(f"stopped by SIGTERM{stage}: the stage is recorded as "
                                        "failed and the MLflow run it had open ended KILLED, "
                                        f"its metrics flushed{hint}") from None
                finally:
                    lock.release()
        finally:
            self._locked = False
            self._stage_now = None

    def _after_a_crash(self, lock: RunLock, loaded: LoadedSpec, run_key: Optional[str]) -> bool:
        """Whether runs may have been left RUNNING: a dead holder's name in the lock file, a
        stage recorded as running or failed, or a --resume (else a rerun whose stages are all
        cached opens no MLflow store at all)."""
        if lock.previous or not lock.supported or self.options.resume:
            return True
        if run_key:
            return False  # the state is in MLflow: the lock and --resume are the signs
        stages = LocalState(state_dir_of(self.run_dir(loaded), None)).load().stages
        return any(entry.status in (RUNNING, FAILED) for entry in stages.values())

    def _say_lock(self, lock: RunLock) -> None:
        if not lock.supported:
            self._warn(f"warning: {lock.path.parent} is on a file system without file locks: "
                       "this run is not protected from a second run of the same spec there")
        elif lock.previous:
            self._warn(f"warning: taking over {lock.path} from a run that died holding it "
                       f"({describe_holder(lock.previous)})")

    def _warn(self, text: str) -> None:
        print(text, file=self.reporter.stream, flush=True)  # even with -q

    def end_dead_runs(self, loaded: LoadedSpec) -> list[str]:
        """End as KILLED this spec's MLflow runs whose process died on this host."""
        import mlflow
        from mlflow.exceptions import MlflowException

        spec = loaded.spec
        uri = resolve_tracking_uri(spec, self.project_dir)
        database = sqlite_path(uri)
        if database is not None and not database.exists():
            return []  # a new store: nothing ran there yet
        self.open_tracking_store(loaded)
        try:
            client = mlflow.MlflowClient(tracking_uri=uri)
            found = client.get_experiment_by_name(experiment_name(spec, self.options.smoke))
            if found is None:
                return []
            return end_dead_runs(client, found.experiment_id, spec=spec.name,
                                 target=loaded.target, say=self._warn)
        except MlflowException as exc:
            raise TrackingError(f"cannot look for runs of {spec.name} left RUNNING in {uri}: "
                                f"{str(exc).splitlines()[0] if str(exc) else exc!r}") from None

    def open_tracking_store(self, loaded: LoadedSpec) -> None:
        """Check (and create) the tracking store, before the first stage that runs: a run whose
        stages are all cached never imports MLflow."""
        check_tracking_server(resolve_tracking_uri(loaded.spec, self.project_dir),
                              say=self.reporter.line)

    kind = "local"

    def master(self, loaded: LoadedSpec) -> str:
        """The Spark master distributed training connects to."""
        from dbspec.spark.session import master_url

        return master_url(loaded.spec)

    def check_placement(self, loaded: LoadedSpec) -> None:
        """Refuse, before any work, a run whose executors would need this machine's disk."""
        from dbspec.spark.placement import check_placement

        spec = loaded.spec
        if getattr(self, "_placement_checked", None) is loaded:
            return
        self._placement_checked = loaded
        uri = resolve_tracking_uri(spec, self.project_dir)
        for note in check_placement(spec, master=self.master(loaded), executor=self.kind,
                                    shared_dir=self.options.shared_dir, tracking_uri=uri,
                                    study_storage=spec.search.storage if spec.search else None):
            self.reporter.line(f"> {note}")
        check_location(uri)  # before any stage; MLflow waits for a stage that runs

    def state_store(self, loaded: LoadedSpec, run_key: Optional[str]) -> LocalState:
        """Local stage state, or the MLflow run of ``run_key``."""
        run_dir = self.run_dir(loaded)
        if not run_key:
            return LocalState(run_dir)
        spec = loaded.spec
        self.open_tracking_store(loaded)
        return MlflowState(run_dir, tracking_uri=resolve_tracking_uri(spec, self.project_dir),
                           experiment=experiment_name(spec, self.options.smoke), key=run_key,
                           tags={"dbspec.spec": spec.name, "dbspec.target": loaded.target or ""},
                           state_dir=self.project_dir)

    def data_version(self, loaded: LoadedSpec) -> str:
        """The version of the spec's data, resolved without reading the rows."""
        from dbspec.seams.sources import source_kind

        return source_kind(loaded.spec.data).version(loaded.spec.data, base=Path.cwd())

    def run_dir(self, loaded: LoadedSpec) -> Path:
        """``.dbspec/runs/<spec>[@target][-smoke]``."""
        return run_dir_for(self.project_dir, loaded.spec.name, loaded.target, self.options.smoke)

    def _check_inputs(self, plan: Plan, only: tuple[str, ...], state: RunState) -> None:
        needed = {dep for name in only for dep in plan.ancestors(name)} - set(only)
        for dep in (name for name in plan.names if name in needed):
            recorded = state.entry(dep)
            if recorded is None or not recorded.done or \
                    recorded.fingerprint != plan[dep].fingerprint:
                raise UsageError(f"--only {','.join(only)}: the output of '{dep}' is missing or "
                                 f"stale for this spec; run without --only (or --from {dep}) "
                                 "first")

    def _run(self, loaded: LoadedSpec, plan: Plan, store: LocalState, state: RunState, *,
             only: tuple[str, ...], from_stage: Optional[str]) -> RunRecord:
        forced = set(plan.downstream(from_stage)) if from_stage else set()
        records: list[StageRecord] = []
        self._tracker = None  # one tracker for the stages of this run (MLflow is slow to open)
        for planned in plan:
            recorded = state.entry(planned.name)
            current = recorded is not None and recorded.fingerprint == planned.fingerprint \
                and store.holds(planned.name, planned.fingerprint)
            # the current files of a finished run of this stage (what it can be skipped for)
            finished = recorded if current and recorded is not None and recorded.done else None
            if only and planned.name not in only:
                if finished is not None:  # for the summary only
                    store.use(planned.name, planned.fingerprint)
                    records.append(StageRecord(planned.name, "cached", 0.0, finished.output))
                continue
            skip = not only and planned.name not in forced and \
                not getattr(build_stage(planned), "always_runs", False)
            if skip and finished is not None and self._usable(planned, finished.output):
                store.use(planned.name, planned.fingerprint)
                self.reporter.line(f"= {planned.name:<11} unchanged, skipped")
                records.append(StageRecord(planned.name, "cached", 0.0, finished.output))
                continue
            inputs = inputs_of(planned.depends_on, state.stages_json())
            cached = store.reuse(planned.name, planned.fingerprint, inputs) \
                if skip and finished is None and planned.name not in RERUN_FROM_CACHE else None
            if cached is not None and self._usable(planned, cached.output):
                # an earlier spec's run of it, kept at this fingerprint
                pause_point(f"stage.{planned.name}.reused")  # linked, state.json not yet
                state.stages[planned.name] = cached
                store.save(state, changed=(planned.name,))
                self.reporter.line(f"= {planned.name:<11} reused from the cache "
                                   f"({planned.fingerprint})")
                records.append(StageRecord(planned.name, "cached", 0.0, cached.output))
                continue
            resume = self.options.resume and current and finished is None
            if all(record.action == "cached" for record in records):
                self.open_tracking_store(loaded)  # before the first stage that runs
            records.append(self._run_stage(_Pass(loaded, plan, store, state, only), planned,
                                           recorded, inputs=inputs, resume=resume))
        return RunRecord(loaded.spec.name, loaded.target, store.run_dir, records)

    def _usable(self, planned, output: dict) -> bool:
        """Whether a finished output can stand for a run of the stage: not when the files it
        names were damaged or removed since (the stage says why, and runs again)."""
        damaged = getattr(build_stage(planned), "damaged", None)
        why = damaged(output) if damaged is not None else None
        if why:
            self.reporter.line(f"! {planned.name}: {why}; running it again")
        return not why

    def _run_stage(self, run: _Pass, planned, recorded: Optional[StageEntry], *,
                   inputs: dict[str, str], resume: bool) -> StageRecord:
        """Run one stage: record it running, run it, record it done (or failed)."""
        loaded, plan, store, state, only = run.loaded, run.plan, run.store, run.state, run.only
        directory = store.prepare(planned.name, planned.fingerprint, resume=resume)
        ancestors = plan.ancestors(planned.name)
        store.fetch([d for d in ancestors if not store.stage_dir(d).exists() or only
                     and d not in only])
        ctx = StageContext(
            loaded=loaded, directory=directory, project_dir=self.project_dir,
            upstream={d: state.stages[d].output for d in ancestors},
            upstream_dirs={d: store.stage_dir(d) for d in ancestors},
            options=replace(self.options, resume=resume), reporter=self.reporter,
            _tracker=self._tracker, spark=self.spark, run_name=store.run_dir.name)
        # a data stage rerun only because the executor changed (same chain, another
        # fingerprint): it reads the same data, so what follows it stays valid
        same_inputs = recorded is not None and recorded.done and \
            recorded.fingerprint != planned.fingerprint and \
            (recorded.chain or recorded.fingerprint) == planned.chain
        state.stages[planned.name] = StageEntry(planned.fingerprint, RUNNING, chain=planned.chain)
        later = [] if same_inputs else plan.downstream(planned.name)[1:]
        for name in later:
            state.stages.pop(name, None)  # their inputs are about to change
        store.save(state, changed=(planned.name, *later))
        self.reporter.line(f"> {planned.name}" + (" (resuming)" if resume else ""))
        self._stage_now = planned.name
        started = time.perf_counter()
        try:
            output = build_stage(planned).run(ctx).to_json()
        except BaseException as exc:
            (directory / "error.txt").write_text("".join(traceback.format_exception(exc)))
            state.stages[planned.name] = replace(state.stages[planned.name], status=FAILED,
                                                 error=f"{type(exc).__name__}: {exc}")
            store.save(state, changed=(planned.name,))
            if isinstance(exc, KeyboardInterrupt):
                raise
            message = failure_message(loaded.spec, planned.name, exc, directory,
                                      self.resume_command)
            raise StageFailed(message) from None if isinstance(exc, DbspecError) else exc
        self._tracker = ctx._tracker
        self._stage_now = None
        seconds = time.perf_counter() - started
        store.publish(planned.name)
        entry = StageEntry(planned.fingerprint, DONE, output, chain=planned.chain,
                           seconds=seconds, inputs=inputs,
                           finished_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        state.stages[planned.name] = entry
        store.keep(planned.name, entry)  # its files are complete
        pause_point(f"stage.{planned.name}.kept")  # in the cache, state.json not yet
        store.save(state, changed=(planned.name,))
        self.reporter.line(f"  {planned.name} done in {seconds:.1f}s")
        return StageRecord(planned.name, "ran", seconds, output)
