"""tune: an Optuna study over the spec's search space; trials are nested MLflow runs."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from dbspec.stages.base import StageContext
from dbspec.stages.outputs import LoadDataOutput, TuneOutput
from dbspec.tuning.records import TrialFailed, TrialRecord
from dbspec.tuning.storage import GRACE_SECONDS, fail_stale_trials, open_storage, storage_url
from dbspec.tuning.study import default_study_name, direction, make_pruner, make_sampler

#: Trials a ``--smoke`` run makes, whatever ``n_trials`` says.
SMOKE_TRIALS = 3


@dataclass(frozen=True)
class TrialBudget:
    """How a run of the stage makes its trials: ``n_trials`` the study should hold,
    ``parallelism`` at a time, each trained for at most ``epochs``; worker ``i`` samples with
    ``seed + i``."""

    n_trials: int
    parallelism: int
    epochs: int
    seed: int
    timeout: Optional[float]
    smoke: bool

    @classmethod
    def of(cls, spec, smoke: bool) -> "TrialBudget":
        """The budget of ``spec``'s search; a smoke run makes at most :data:`SMOKE_TRIALS`
        trials of one epoch, one at a time."""
        search = spec.search
        return cls(n_trials=min(search.n_trials, SMOKE_TRIALS) if smoke else search.n_trials,
                   parallelism=1 if smoke else search.parallelism,
                   epochs=1 if smoke else spec.training.epochs,
                   seed=search.sampler.seed if search.sampler.seed is not None
                   else spec.training.seed,
                   timeout=search.timeout, smoke=smoke)


class TuneStage:
    """Run (or continue) the study; hand the best parameters to ``train``."""

    name = "tune"

    def __init__(self, fingerprint: str = ""):
        self.fingerprint = fingerprint

    def run(self, ctx: StageContext) -> TuneOutput:
        from dbspec.spark.placement import is_local_master
        from dbspec.tuning.objective import StudySetup

        spec, search = ctx.spec, ctx.spec.search
        budget = TrialBudget.of(spec, ctx.options.smoke)
        name = default_study_name(spec, ctx.loaded.target, self.fingerprint, budget.smoke)
        remote = ctx.spark is not None and not is_local_master(ctx.spark.sparkContext.master)
        trial_models = str(trials_dir(ctx, name, remote).resolve())
        studies = (Path(ctx.options.shared_dir) / "studies") if remote else None
        storage = storage_url(search, ctx.project_dir, studies)
        opened = open_storage(storage)  # one for the stage: each takes ~0.3 s to open
        study = self._open_study(search, name, storage, budget, opened)
        remaining = _report_recorded(ctx, study, name, budget)
        tracker = ctx.tracker
        with tracker.run(tags={"dbspec.spec": spec.name, "dbspec.study": name,
                               "dbspec.target": ctx.loaded.target or "",
                               "dbspec.smoke": str(budget.smoke).lower()}) as run_id:
            _log_search(tracker, search, storage, budget.n_trials)
            setup = StudySetup(
                source=ctx.loaded.source, target=ctx.loaded.target,
                # absolute: workers (Spark tasks above all) may run in another directory
                data_dirs=_trial_data_dirs(ctx, remote),
                table_meta=ctx.output(LoadDataOutput).to_json(),
                tune_dir=trial_models,
                tracking_uri=tracker.tracking_uri, experiment_id=tracker.experiment_id,
                parent_run_id=run_id, study_name=name, storage=storage,
                epochs=budget.epochs if budget.smoke else None, seed=budget.seed,
                save_models=search.final_model == "best_trial")
            _run_trials(ctx, setup, remaining, budget, opened)
            summary = _close_study(tracker, name, opened, search.metric, ctx.directory / "plots")
        ctx.reporter.line(f"  best {search.metric} {summary['best_value']:.6g} in trial "
                          f"{summary['best_trial']}: {summary['best_params']}")
        return TuneOutput(study_name=name, storage=storage, run_id=run_id,
                          final_model=search.final_model,
                          trials_dir=trial_models, **summary)

    def _open_study(self, search, name: str, storage: str, budget: TrialBudget, opened):
        """The study, created or continued, in ``opened`` (the storage at ``storage``).

        Raises:
            TrialFailed: a study of that name was made for a different search.
        """
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        study = optuna.create_study(study_name=name, storage=opened,
                                    load_if_exists=True,
                                    direction=direction(search),
                                    sampler=make_sampler(search, budget.seed),
                                    pruner=make_pruner(search, budget.epochs))
        recorded = study.user_attrs.get("dbspec.search")
        if recorded is None:
            study.set_user_attr("dbspec.search", self.fingerprint)
        elif recorded != self.fingerprint:
            raise TrialFailed(f"study '{name}' in {storage} was made for a different search; "
                              "give search.study_name a new name, or remove it to let dbspec "
                              "name the study")
        return study


def _report_recorded(ctx: StageContext, study, name: str, budget: TrialBudget) -> int:
    """Fail the trials of dead workers, say what the study holds; returns the trials to run."""
    interrupted, elsewhere = fail_stale_trials(study)
    done = len(study.trials)
    remaining = max(0, budget.n_trials - done)
    notes = [f"{interrupted} of dead workers, marked failed"] if interrupted else []
    notes += [f"{elsewhere} running elsewhere, left alone"] if elsewhere else []
    ctx.reporter.line(f"  study {name}: {done} trial(s) recorded"
                      + (f" ({'; '.join(notes)})" if notes else "")
                      + f", {remaining} to run, {budget.parallelism} at a time")
    return remaining


def _log_search(tracker, search, storage: str, n_trials: int) -> None:
    """The search's settings as the study run's parameters."""
    tracker.log_params({"search.n_trials": str(n_trials), "search.storage": storage,
                        "search.sampler": search.sampler.name,
                        "search.pruner": search.pruner.name,
                        "search.metric": search.metric,
                        "search.direction": direction(search),
                        "search.space": json.dumps(search.model_dump(
                            mode="json", by_alias=True)["space"])})


def _close_study(tracker, name: str, storage, metric: str, plots: Path) -> dict[str, Any]:
    """The finished study's summary (from the opened ``storage``), logged to the study run
    with its plots."""
    import optuna

    study = optuna.load_study(study_name=name, storage=storage)
    # one whose worker died before it named itself: old by now, or given the rest of
    # its second (a rerun that follows a kill at once can finish within it)
    fail_stale_trials(study, settle=True)
    summary = _summarize(study, metric)
    tracker.log_metrics({"best_value": summary["best_value"],
                         "epochs_trained": summary["epochs_trained"],
                         **{f"trials_{k}": v for k, v in summary["trials"].items()}})
    tracker.set_tags({"dbspec.best_params": json.dumps(summary["best_params"])})
    for path in _plots(study, plots):
        tracker.log_artifact(path, "search")
    return summary


def trials_dir(ctx: StageContext, study: str, remote: bool = False) -> Path:
    """Trial models live with the study, not the stage: a study outlives reruns of the stage.
    Trials on other machines write theirs to the shared dir."""
    root = Path(ctx.options.shared_dir) if remote else ctx.project_dir
    return root / "studies" / study / "trials"


def _trial_data_dirs(ctx: StageContext, remote: bool) -> dict[str, str]:
    """The prepared data every trial reads: the stage dirs here, or a copy of them in the
    shared dir when trials run on executors that cannot read this machine's disk."""
    import shutil

    stages = ("load_data", "split", "preprocess")
    if not remote:  # absolute: local Spark tasks run in another working directory
        return {s: str(ctx.dir_of(s).resolve()) for s in stages}
    base = ctx.shared_stage_dir() / "data"
    copies = {}
    for stage in stages:
        target = base / stage
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(ctx.dir_of(stage), target)
        copies[stage] = str(target.resolve())
    return copies


def _run_trials(ctx: StageContext, setup, remaining: int, budget: TrialBudget,
                storage: Any = None) -> None:
    """Split the remaining trials over this process (in the opened ``storage``) and
    ``parallelism - 1`` spawned workers."""
    import multiprocessing

    from dbspec.tuning.objective import optimize, run_worker

    if remaining == 0:
        return
    seed, timeout = budget.seed, budget.timeout
    workers = min(budget.parallelism, remaining)
    quotas = [remaining // workers + (1 if i < remaining % workers else 0) for i in range(workers)]
    if ctx.spark is not None:
        _run_trials_on_spark(ctx, setup, quotas, seed, timeout)
        return
    finished = [0]

    def report(record: TrialRecord) -> None:
        finished[0] += 1
        ctx.reporter.line("  " + record.describe())
        ctx.reporter.progress("trial", finished[0], quotas[0], "in this process")

    spawn = multiprocessing.get_context("spawn")
    processes = [spawn.Process(target=run_worker, args=(setup, seed + i, quotas[i], timeout),
                               name=f"dbspec-trials-{i}") for i in range(1, workers)]
    for process in processes:
        process.start()
    try:
        optimize(setup, seed, quotas[0], timeout, report, storage=storage)
    except BaseException:
        for process in processes:  # Ctrl-C or SIGTERM: the workers stop with this process
            process.terminate()
        raise
    finally:
        for process in processes:
            process.join()
    crashed = [p.name for p in processes if p.exitcode != 0]
    if crashed:
        ctx.reporter.line(f"  warning: worker(s) {', '.join(crashed)} exited abnormally; their "
                          "unfinished trials are marked failed once their heartbeat is "
                          f"{GRACE_SECONDS} s old (by the next trial or run)")


def _run_trials_on_spark(ctx: StageContext, setup, quotas: list[int], seed: int,
                         timeout) -> None:
    """One Spark task per worker, each running its share of trials on the shared storage.

    Spark schedules the workers (on executors, or in local mode on this machine); the study's
    storage must be reachable from them (a SQLite file is, in local mode; use a database URL
    in search.storage on a cluster).
    """
    from dbspec.tuning.objective import run_worker

    ctx.reporter.line(f"  {len(quotas)} trial worker(s) as Spark tasks")
    jobs = [(setup, seed + i, quota, timeout) for i, quota in enumerate(quotas)]
    rdd = ctx.spark.sparkContext.parallelize(jobs, len(jobs))
    try:
        rdd.foreach(lambda job: run_worker(*job))
    except Exception as exc:  # a task that dies takes the job down; its trials stay recorded
        from dbspec.spark.session import python_cause

        ctx.reporter.line(f"  warning: a Spark trial task failed: {python_cause(exc)[:500]}")


def _summarize(study, metric: str) -> dict[str, Any]:
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    kinds = {TrialState.COMPLETE: "complete", TrialState.PRUNED: "pruned"}
    counts = {"complete": 0, "pruned": 0, "failed": 0}
    for trial in trials:
        counts[kinds.get(trial.state, "failed")] += 1
    epochs = sum(int(t.user_attrs.get("epochs", 0)) for t in trials)
    if not counts["complete"]:
        reasons = sorted({t.user_attrs.get("error", "pruned") for t in trials})[:3]
        raise TrialFailed(f"no trial of the study completed ({counts}); first reasons: "
                          + "; ".join(reasons))
    best = study.best_trial
    return {"best_value": best.value, "best_params": best.params, "best_trial": best.number,
            "trials": counts, "epochs_trained": epochs, "metric": metric}


def _plots(study, directory: Path) -> list[Path]:
    """Optimization history, parameter importances and parallel coordinates, as PNGs."""
    import warnings

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as views

    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, draw in (("optimization_history", views.plot_optimization_history),
                       ("param_importances", views.plot_param_importances),
                       ("parallel_coordinate", views.plot_parallel_coordinate)):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # optuna marks these views experimental
                axes = draw(study)
        except (ValueError, RuntimeError, ZeroDivisionError):
            continue  # e.g. importances need two completed trials with varied parameters
        figure = axes.figure if hasattr(axes, "figure") else axes.flat[0].figure
        path = directory / f"{name}.png"
        figure.set_size_inches(8, 5)
        figure.tight_layout()
        figure.savefig(path, dpi=100)
        plt.close(figure)
        written.append(path)
    return written
