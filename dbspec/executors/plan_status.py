"""``dbspec plan`` against a state dir: what a run would do with each stage (cached, stale,
resumable, new), read without changing anything and without importing torch, MLflow or Spark."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from dbspec.errors import UsageError
from dbspec.executors.cache import (RERUN_FROM_CACHE, StageCache, inputs_of,
                                    read_state, run_dir_for)
from dbspec.executors.records import RunState


def stage_statuses(run_dir: Path, plan) -> dict[str, str]:
    """What ``dbspec run`` would do with each stage of ``plan`` given ``run_dir``'s state,
    read without changing anything: ``cached`` (reused), ``stale`` (recorded at another
    fingerprint, or a stage that always runs again), ``resumable`` (interrupted at this
    fingerprint: ``--resume`` continues it) or ``new`` (never ran here)."""
    from dbspec.stages.serving import BatchPredictStage  # light: its heavy imports are in run()

    run_dir = Path(run_dir)
    state, cache = RunState.from_json(read_state(run_dir)), StageCache(run_dir)
    statuses: dict[str, str] = {}
    would: dict[str, dict] = {}  # the entries the run would use (a stage that runs: none yet)
    for planned in plan:
        name, fingerprint = planned.name, planned.fingerprint
        recorded = state.entry(name)
        here = recorded is not None and recorded.fingerprint == fingerprint and (
            cache.holds(name, fingerprint))
        fresh = all(d in would for d in planned.depends_on)
        found = cache.lookup(name, fingerprint, inputs_of(planned.depends_on, would)) \
            if fresh else None
        ran_here = recorded is not None or (run_dir / "cache" / name).is_dir()
        statuses[name] = "stale" if ran_here else "new"  # also what a stage that always runs is
        if name == BatchPredictStage.name and BatchPredictStage.always_runs:
            continue
        if here and recorded is not None and recorded.done:
            statuses[name], would[name] = "cached", recorded.to_json()
        elif found is not None and name not in RERUN_FROM_CACHE:
            statuses[name], would[name] = "cached", found
        elif here and found is None:
            statuses[name] = "resumable"
    return statuses


def plan_with_statuses(loaded, state_dir: Optional[Path], *, smoke: bool = False):
    """The plan ``dbspec run`` would compile (with the data version it would resolve) and each
    stage's status against ``state_dir`` (None: ``.dbspec``, if it exists), for ``dbspec plan``.

    Returns:
        ``(plan, statuses, note)``: without a state dir the plain plan, ``None`` and ``None``;
        when the data version cannot be resolved here (a missing file, a Spark-only source)
        every status is ``unknown`` and ``note`` says why.

    Raises:
        UsageError: ``state_dir`` was given and is not a directory.
    """
    from dbspec.data.sources import DataError
    from dbspec.plan import compile_plan
    from dbspec.seams.sources import source_kind
    from dbspec.spec.checkpoints import checkpoint_version

    if state_dir is not None and not Path(state_dir).is_dir():
        raise UsageError(f"--state-dir {state_dir}: no such directory; give the --state-dir "
                         "that `dbspec run` used (default: .dbspec)")
    state_dir = Path(".dbspec") if state_dir is None else Path(state_dir)
    if not state_dir.is_dir():
        return compile_plan(loaded.spec), None, None
    try:
        version = source_kind(loaded.spec.data).version(loaded.spec.data, base=Path.cwd())
    except DataError as exc:
        plan = compile_plan(loaded.spec)
        return plan, {s.name: "unknown" for s in plan}, \
            f"status unknown: the data version is needed and cannot be resolved here: {exc}"
    plan = compile_plan(loaded.spec, data_version=version, executor=loaded.spec.executor,
                        checkpoint_version=checkpoint_version(loaded.spec))
    run_dir = run_dir_for(Path(state_dir), loaded.spec.name, loaded.target, smoke)
    return plan, stage_statuses(run_dir, plan), None
