"""train: build the network, train it, log the run and the served model to MLflow.

A resumed training logs each epoch once to its MLflow run: epochs MLflow has are not logged
again when retrained after the checkpoint, and epochs it lost (a killed run's metric buffer) are
logged from the checkpoint's history (flushing at each checkpoint would cost a ``log_batch`` per
epoch).
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np

from dbspec.errors import DbspecError, redact_data
from dbspec.faults import pause_point
from dbspec.seams.compute import compute_kind, trains_on_ranks
from dbspec.stages.base import StageContext, write_json
from dbspec.data import store
from dbspec.stages.data import load_data_access
from dbspec.stages.outputs import LoadDataOutput, TrainOutput, TuneOutput


class TrainStage:
    """Train the network and log the run, its metrics and the served model."""

    name = "train"

    @staticmethod
    def check(spec) -> None:
        """Refuse what cannot run or travel before any stage runs: a compute kind that cannot
        run here, a custom network whose module cannot ship with the model."""
        if spec.model.custom is not None:
            from dbspec.models.portable import custom_code

            custom_code(spec.model)  # after training would be an hour too late
        compute_kind(spec).check_runnable(spec, quick=True)  # before any stage runs

    def run(self, ctx: StageContext) -> TrainOutput:
        from dbspec.observability.observer import TrainingObserver

        job = _prepare(ctx)
        tracker = ctx.tracker
        observer = TrainingObserver(job.spec, log_dir=ctx.directory / "tensorboard",
                                    say=ctx.reporter.line)
        tags = {"dbspec.spec": job.spec.name, "dbspec.target": ctx.loaded.target or "",
                "dbspec.smoke": str(ctx.options.smoke).lower(),
                "dbspec.data_version": ctx.output(LoadDataOutput).data_version}
        with tracker.run(job.previous_run, tags=tags,
                         system_metrics=job.spec.tracking.system_metrics) as run_id, observer:
            write_json(ctx.directory / "run.json", {"run_id": run_id})
            if job.previous_run is not None:
                tracker.resume_epochs()  # the epochs after the checkpoint: MLflow may have them
            result = _fit(job, tracker, run_id, observer)
            _report_trained(ctx, tracker, result)
            diagnosis = _log_after_fit(job, tracker, run_id, observer, result)
            model_uri = _log_served_model(job, tracker, result)
        return _output(job, tracker, model_uri, result, diagnosis, observer)


@dataclass(frozen=True)
class _TrainingJob:
    """What one run of the stage trains on and where (the steps of :meth:`TrainStage.run`)."""

    ctx: StageContext
    spec: Any  # the spec with the search's best parameters applied
    data: Any  # an InMemoryData or StreamedData (dbspec.data.access)
    fitted: Any
    files: Path  # where ranks read shards and write checkpoints (see _rank_files_dir)
    checkpoints: Any  # a CheckpointStore, or None
    epochs: int
    previous_run: Optional[str]  # the MLflow run a --resume continues
    reused: bool  # the best trial's model is taken instead of training


def _prepare(ctx: StageContext) -> _TrainingJob:
    """The data, the checkpoints (cleared unless resuming) and the run to continue."""
    from dbspec.spec.loader import apply_values
    from dbspec.training.checkpoints import CheckpointStore

    spec = ctx.spec  # with the search's best parameters applied when a study ran before
    if ctx.has_output(TuneOutput):
        spec = apply_values(ctx.loaded, ctx.output(TuneOutput).best_params).spec
    files = _rank_files_dir(ctx, spec)
    checkpoints = None
    if spec.training.checkpointing.enabled:
        checkpoints = CheckpointStore(files / "checkpoints",
                                      every=spec.training.checkpointing.every_n_epochs,
                                      keep=spec.training.checkpointing.keep_last)
        if not ctx.options.resume:
            checkpoints.clear()
    run_file = ctx.directory / "run.json"
    previous_run = json.loads(run_file.read_text())["run_id"] \
        if ctx.options.resume and run_file.exists() else None
    reused = ctx.has_output(TuneOutput) and ctx.output(TuneOutput).final_model == "best_trial"
    return _TrainingJob(ctx, spec, load_data_access(ctx),
                        store.read_preprocessing(ctx.dir_of("preprocess")),
                        files, checkpoints, 1 if ctx.options.smoke else spec.training.epochs,
                        previous_run, reused)


def _fit(job: _TrainingJob, tracker, run_id: str, observer):
    """The trained model: the best trial's, from ranks on Spark, or trained in process."""
    from dbspec.training.fit import FitOptions

    ctx, spec = job.ctx, job.spec
    if job.reused:
        return _best_trial(ctx)
    if trains_on_ranks(spec):
        return _fit_distributed(job, tracker, run_id)

    def log_epoch(*, epoch: int, metrics: dict[str, float], **_: Any) -> None:
        tracker.log_epoch(metrics, epoch)
        pause_point(f"train.epoch.{epoch}")
        ctx.reporter.epoch(epoch=epoch, epochs=job.epochs, metrics=metrics)

    return _fit_data(job, FitOptions(
        epochs=job.epochs, checkpoints=job.checkpoints, resume=ctx.options.resume,
        callbacks=[log_epoch], observer=observer))


def _fit_data(job: _TrainingJob, options):
    """``fit_spec`` on the job's data, in memory or streamed."""
    from dbspec.training.fit import fit_spec, fit_streamed

    data = job.data
    if data.streamed:
        stats = json.loads((job.ctx.dir_of("preprocess") / "stats.json").read_text())
        return fit_streamed(job.spec, data, stats, job.fitted, options)
    return fit_spec(job.spec, data.table, data.splits, job.fitted, options)


def _fit_distributed(job: _TrainingJob, tracker, run_id: str):
    """Ranks launched on Spark by the compute kind; rank 0 logs the epochs."""
    from dbspec.spark.session import spark_session
    from dbspec.tracking.metrics import TrackingTarget
    from dbspec.training.fit import FitOptions

    ctx, spec = job.ctx, job.spec
    tracker.flush()
    spark = spark_session(spec, ctx.options.master, say=ctx.reporter.line) \
        if compute_kind(spec).spark_launched else contextlib.nullcontext()
    with spark as session:
        if ctx.spark is None and session is not None:  # the spark executor checked them
            from dbspec.spark.probe import check_executors

            check_executors(session, spec, shared_dir=ctx.options.shared_dir,
                            executor="local", say=ctx.reporter.line)
        result = _fit_data(job, FitOptions(
            epochs=job.epochs, checkpoints=job.checkpoints, resume=ctx.options.resume,
            work_dir=job.files / "distributed",
            tracking=TrackingTarget(tracker.tracking_uri, run_id),
            say=ctx.reporter.line))
    extra = result.outcome.extra
    if "placement" not in extra:  # a launcher may word its own
        extra["placement"] = _placement(spec, session, job.files)
    tracker.log_params({"dbspec.world_size": str(extra["world_size"]),
                        "dbspec.backend": extra["backend"]})
    tracker.log_metrics({f"rank_{r['rank']}_samples_per_second": r["samples_per_second"]
                         for r in extra["ranks"]})
    # a ZeRO-3 rank's partition of the network (else the whole), as it was built
    tracker.log_metrics({f"rank_{r['rank']}_held_parameters": r["held_parameters"]
                         for r in extra["ranks"] if r.get("held_parameters") is not None})
    return result


def _log_after_fit(job: _TrainingJob, tracker, run_id: str, observer, result) -> list[str]:
    """Epochs a killed run lost, the diagnosis, TensorBoard events and (for a new run) the
    inputs; returns the diagnosis."""
    ctx = job.ctx
    if job.previous_run is not None and not job.reused:
        tracker.log_missing_epochs(result.outcome.history)  # lost with a killed run's buffer
    findings = observer.finish(device=result.device.type, threads=result.threads,
                               batch_size=result.batch_size or job.spec.training.batch_size)
    diagnosis = result.outcome.extra.get("diagnosis") or [f.text() for f in findings]
    tracker.set_tags({"dbspec.bottlenecks": " | ".join(diagnosis)[:5000]})
    for events in (ctx.directory / "tensorboard", job.files / "distributed" / "tensorboard"):
        if events.is_dir():
            tracker.client.log_artifacts(run_id, str(events), "tensorboard")
    if job.previous_run is None:
        _log_inputs(ctx, job.spec, tracker, job.data, result)
    return diagnosis


def _log_served_model(job: _TrainingJob, tracker, result) -> str:
    """Save the served model and its history here, log it and the summary metrics to MLflow;
    returns the logged model's URI."""
    from dbspec.models.served import save_served_model

    served, outcome = result.served, result.outcome
    served_dir = save_served_model(served, job.ctx.directory / "served", onnx=True)
    write_json(job.ctx.directory / "history.json", outcome.history)
    example = _example_frame(job.data)
    setting = job.spec.serving.out_of_range
    model_uri = tracker.log_model(served_dir, example, served.predict_frame(example),
                                  out_of_range=(setting.action, setting.tolerance))
    tracker.log_metrics({"best_epoch": outcome.best_epoch + 1, "epochs_run": outcome.epochs_run,
                         "train_samples_per_second": outcome.samples_per_second})
    return model_uri


def _output(job: _TrainingJob, tracker, model_uri: str, result, diagnosis: list[str],
            observer) -> TrainOutput:
    """The stage's output; the run is the tracker's (still named after its ``run`` ended)."""
    outcome, extra = result.outcome, result.outcome.extra
    distributed = "world_size" in extra
    return TrainOutput(
        run_id=tracker.run_id, experiment_id=tracker.experiment_id,
        tracking_uri=tracker.tracking_uri, model_uri=model_uri,
        resumed_from_epoch=outcome.resumed_from,
        stopped_early=outcome.stopped_early, device=str(result.device),
        threads=result.threads, parameters=result.parameters,
        best_epoch=outcome.best_epoch + 1, epochs_run=outcome.epochs_run,
        train_samples_per_second=outcome.samples_per_second, diagnosis=diagnosis,
        gpu_monitoring=(observer.monitor.gpu_unavailable or "available")
        if observer.monitor is not None else "off",
        batch_size=result.batch_size
        if result.batch_size not in (None, job.spec.training.batch_size) else None,
        world_size=extra["world_size"] if distributed else None,
        backend=extra["backend"] if distributed else None,
        placement=extra["placement"] if distributed else None,
        trained_parameters=result.trained if result.trained != result.parameters else None)


def _report_trained(ctx: StageContext, tracker, result) -> None:
    """How many of the network's parameters the training updated, when not all (LoRA
    adapters, frozen layers): a line, a param and the share as a metric."""
    trained, total = result.trained, result.parameters
    if trained is None or trained == total or not total:
        return
    ctx.reporter.line(f"  trained {trained:,} of {total:,} parameters "
                      f"({100 * trained / total:.2f}%)")
    tracker.log_params({"dbspec.trained_parameters": str(trained)})
    tracker.log_metrics({"trained_parameter_share": trained / total})


def _rank_files_dir(ctx: StageContext, spec) -> Path:
    """Where ranks read their shards and write checkpoints and results: the shared dir when
    they run on other machines' executors, else this stage's own directory."""
    from dbspec.spark.session import master_url
    from dbspec.spark.placement import is_local_master, ranks_on_executors

    if ranks_on_executors(spec) and not compute_kind(spec).spark_launched:
        return ctx.shared_stage_dir()  # ranks on other nodes, by their own launcher
    master = ctx.spark.sparkContext.master if ctx.spark is not None \
        else master_url(spec, ctx.options.master)
    if ranks_on_executors(spec) and not is_local_master(master):
        return ctx.shared_stage_dir()
    return ctx.directory


def _placement(spec, session, files: Path) -> str:
    """In words, where the ranks ran: ``on the driver``, or on executors with the shared dir."""
    if compute_kind(spec).remote_ranks(spec.compute) is None:
        return "on the driver"
    return f"on the executors of {session.sparkContext.master}, files in {files}"


def _example_frame(data):
    """The input example: the first training rows as the model takes them (raw columns for a
    model with typed features)."""
    import pandas as pd

    raw = data.raw_head("train", 5)
    if raw is not None:
        return raw
    return pd.DataFrame(data.head("train", 5).astype(np.float64), columns=data.feature_names)


def _best_trial(ctx: StageContext):
    """The best trial's model and training record, reused instead of training again."""
    import torch

    from dbspec.models.served import load_served_model
    from dbspec.training.fit import Fitted
    from dbspec.training.loop import TrainOutcome

    tune = ctx.output(TuneOutput)
    trial = tune.best_trial
    directory = Path(tune.trials_dir) / str(trial)
    if not (directory / "served").exists():
        raise DbspecError(f"the model of trial {trial} is not at {directory} (the study ran "
                          "before its models were kept); set search.final_model: retrain")
    served = load_served_model(directory / "served")
    outcome = TrainOutcome(**json.loads((directory / "outcome.json").read_text()))
    ctx.reporter.line(f"  reusing the model of trial {trial} (search.final_model: best_trial)")
    return Fitted(served, outcome, torch.device("cpu"), torch.get_num_threads(),
                  sum(p.numel() for p in served.network.parameters()))


#: Rows of a streamed training split logged as the run's dataset (MLflow profiles the frame).
DATASET_ROWS_STREAMED = 10_000


def _log_inputs(ctx: StageContext, spec, tracker, data, result) -> None:
    """Params (the flattened resolved spec), the spec files and the dataset of a new run."""
    import pandas as pd
    import yaml

    from dbspec.tracking.mlflow_tracking import flatten

    parameters, threads, device = result.parameters, result.threads, result.device
    dumped = spec.model_dump(mode="json", by_alias=True, exclude={"targets"})
    params = flatten(dumped)
    params.update({"dbspec.parameters": str(parameters), "dbspec.threads": str(threads),
                   "dbspec.device": str(device), "dbspec.target": ctx.loaded.target or ""})
    tracker.log_params(params)
    spec_dir = ctx.directory / "spec"
    spec_dir.mkdir(exist_ok=True)
    (spec_dir / "resolved.yaml").write_text(yaml.safe_dump(redact_data(dumped), sort_keys=False))
    source = Path(ctx.loaded.file)
    (spec_dir / source.name).write_text(source.read_text())
    tracker.log_artifact(spec_dir / "resolved.yaml", "spec")
    tracker.log_artifact(spec_dir / source.name, "spec")
    load = ctx.output(LoadDataOutput)
    if data.streamed:  # the source's first training rows; the version names the rest
        rows = min(DATASET_ROWS_STREAMED, data.size("train"))
        frame = pd.DataFrame(data.head("train", rows), columns=data.feature_names)
        frame[spec.data.target] = data.targets("train")[:rows]
    elif data.raw is not None:  # typed features: the columns as read, not their encoding
        frame = data.raw_head("train", DATASET_ROWS_STREAMED).drop(
            columns=[i["name"] for i in data.table.inputs if i["type"] == "image"])
        frame[spec.data.target] = data.targets("train")[:len(frame)]
    else:
        table = data.table
        frame = pd.DataFrame(table.features, columns=table.feature_names)
        frame[spec.data.target] = table.target
    tracker.log_dataset(frame, source=load.uri, target=spec.data.target,
                        version=load.data_version, name=f"{spec.name}-data")
