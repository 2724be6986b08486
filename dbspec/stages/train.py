"""train: build the network, train it, log the run and the served model to MLflow.

A resumed training logs each epoch exactly once to its MLflow run: epochs MLflow already has
are not logged again when they are retrained after the checkpoint, and epochs the checkpoint
has but MLflow lost (the metric buffer of a killed run) are logged from the checkpoint's
history. Flushing at each checkpoint instead would cost a ``log_batch`` per epoch at the
default checkpoint interval.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from dbspec.errors import DbspecError
from dbspec.faults import pause_point
from dbspec.stages.base import StageContext, write_json
from dbspec.stages.data import load_preprocessing, load_splits, load_table


class TrainStage:
    """Train the network and log the run, its metrics and the served model."""

    name = "train"

    @staticmethod
    def check(spec) -> None:
        """Refuse what cannot run or travel before any stage runs: compute kinds this
        executor cannot launch, a custom network whose module cannot ship with the model."""
        if spec.model.custom is not None:
            from dbspec.models.portable import custom_code

            custom_code(spec.model)  # after training would be an hour too late
        if spec.compute.kind == "deepspeed":
            from dbspec.training.deepspeed_config import check_deepspeed_config, deepspeed_config

            check_deepspeed_config(deepspeed_config(spec))  # before any stage runs
        if spec.compute.kind == "ray":
            from dbspec.training.ray_launch import require_ray

            require_ray(quick=True)  # before any stage runs

    def run(self, ctx: StageContext) -> dict[str, Any]:
        from dbspec.models.served import save_served_model
        from dbspec.training.checkpoints import CheckpointStore
        from dbspec.training.fit import fit_spec

        spec = tuned_spec(ctx)
        table, splits, fitted = load_table(ctx), load_splits(ctx), load_preprocessing(ctx)
        files = _rank_files_dir(ctx, spec)
        checkpoints = None
        if spec.training.checkpointing.enabled:
            checkpoints = CheckpointStore(files / "checkpoints",
                                          every=spec.training.checkpointing.every_n_epochs,
                                          keep=spec.training.checkpointing.keep_last)
            if not ctx.options.resume:
                checkpoints.clear()
        epochs = 1 if ctx.options.smoke else spec.training.epochs
        run_file = ctx.directory / "run.json"
        previous_run = json.loads(run_file.read_text())["run_id"] \
            if ctx.options.resume and run_file.exists() else None
        tracker = ctx.tracker
        reused = "tune" in ctx.upstream and ctx.output_of("tune")["final_model"] == "best_trial"
        tags = {"dbspec.spec": spec.name, "dbspec.target": ctx.loaded.target or "",
                "dbspec.smoke": str(ctx.options.smoke).lower(),
                "dbspec.data_version": ctx.output_of("load_data")["data_version"]}
        from dbspec.monitoring.observer import TrainingObserver

        observer = TrainingObserver(spec, log_dir=ctx.directory / "tensorboard",
                                    say=ctx.reporter.line)
        with tracker.run(previous_run, tags=tags,
                         system_metrics=spec.tracking.system_metrics) as run_id, observer:
            write_json(run_file, {"run_id": run_id})
            if previous_run is not None:
                tracker.resume_epochs()  # the epochs after the checkpoint: MLflow may have them

            def log_epoch(*, epoch: int, metrics: dict[str, float], **_: Any) -> None:
                tracker.log_epoch(metrics, epoch)
                pause_point(f"train.epoch.{epoch}")
                ctx.reporter.epoch(epoch=epoch, epochs=epochs, metrics=metrics)

            if reused:
                result = _best_trial(ctx)
            elif spec.compute.kind in ("torch_distributor", "deepspeed", "ray"):
                from dbspec.spark import spark_session

                tracker.flush()
                with spark_session(spec, ctx.options.master, say=ctx.reporter.line) as session:
                    if ctx.spark is None:  # the spark executor checked its executors already
                        from dbspec.spark.probe import check_executors

                        check_executors(session, spec, shared_dir=ctx.options.shared_dir,
                                        executor="local", say=ctx.reporter.line)
                    result = fit_spec(spec, table, splits, fitted, epochs=epochs,
                                      checkpoints=checkpoints, resume=ctx.options.resume,
                                      work_dir=files / "distributed",
                                      tracking={"uri": tracker.tracking_uri, "run_id": run_id},
                                      say=ctx.reporter.line)
                if "placement" not in result.outcome.extra:  # ray words its own
                    result.outcome.extra["placement"] = _placement(spec, session, files)
                _log_ranks(tracker, result.outcome.extra)
            else:
                result = fit_spec(spec, table, splits, fitted, epochs=epochs,
                                  checkpoints=checkpoints, resume=ctx.options.resume,
                                  callbacks=[log_epoch], observer=observer)
            served, outcome = result.served, result.outcome
            if previous_run is not None and not reused:
                tracker.log_missing_epochs(outcome.history)  # lost with a killed run's buffer
            findings = observer.finish(device=result.device.type, threads=result.threads,
                                       batch_size=result.batch_size or spec.training.batch_size)
            diagnosis = outcome.extra.get("diagnosis") or [f.text() for f in findings]
            tracker.set_tags({"dbspec.diagnosis": " | ".join(diagnosis)[:5000]})
            for events in (ctx.directory / "tensorboard", files / "distributed" / "tensorboard"):
                if events.is_dir():
                    tracker.client.log_artifacts(run_id, str(events), "tensorboard")
            if previous_run is None:
                _log_inputs(ctx, spec, tracker, table, result)
            served_dir = save_served_model(served, ctx.directory / "served")
            write_json(ctx.directory / "history.json", outcome.history)
            example = _example_frame(table, splits)
            model_uri = tracker.log_model(served_dir, example, served.predict_frame(example))
            summary = {"best_epoch": outcome.best_epoch + 1, "epochs_run": outcome.epochs_run,
                       "train_samples_per_second": outcome.samples_per_second}
            tracker.log_metrics(summary)
        return {"run_id": run_id, "experiment_id": tracker.experiment_id,
                "tracking_uri": tracker.tracking_uri, "model_uri": model_uri,
                "resumed_from_epoch": outcome.resumed_from, "stopped_early": outcome.stopped_early,
                "device": str(result.device), "threads": result.threads,
                "parameters": result.parameters, **summary, "diagnosis": diagnosis,
                "gpu_monitoring": (observer.monitor.gpu_unavailable or "available")
                if observer.monitor is not None else "off",
                **({"batch_size": result.batch_size}
                   if result.batch_size not in (None, spec.training.batch_size) else {}),
                **({"world_size": result.outcome.extra["world_size"],
                    "backend": result.outcome.extra["backend"],
                    "placement": result.outcome.extra["placement"]}
                   if "world_size" in result.outcome.extra else {})}


def _rank_files_dir(ctx: StageContext, spec) -> Path:
    """Where ranks read their shards and write checkpoints and results: the shared dir when
    they run on other machines' executors, else this stage's own directory."""
    from dbspec.spark import master_url
    from dbspec.spark.placement import is_local_master, ranks_on_executors

    master = ctx.spark.sparkContext.master if ctx.spark is not None \
        else master_url(spec, ctx.options.master)
    if ranks_on_executors(spec) and not is_local_master(master):
        return ctx.shared_stage_dir()
    return ctx.directory


def _placement(spec, session, files: Path) -> str:
    """In words, where the ranks ran: ``on the driver``, or on executors with the shared dir."""
    if spec.compute.local_mode:
        return "on the driver"
    return f"on the executors of {session.sparkContext.master}, files in {files}"


def _example_frame(table, splits):
    import pandas as pd

    rows = splits.train[:5]
    return pd.DataFrame(table.features[rows].astype(np.float64), columns=table.feature_names)


def _log_ranks(tracker, extra: dict) -> None:
    """World size, backend and per-rank throughput of a distributed training run."""
    tracker.log_params({"dbspec.world_size": str(extra["world_size"]),
                        "dbspec.backend": extra["backend"]})
    tracker.log_metrics({f"rank_{r['rank']}_samples_per_second": r["samples_per_second"]
                         for r in extra["ranks"]})


def _best_trial(ctx: StageContext):
    """The best trial's model and training record, reused instead of training again."""
    import torch

    from dbspec.models.served import load_served_model
    from dbspec.training.fit import Fitted
    from dbspec.training.loop import TrainOutcome

    trial = ctx.output_of("tune")["best_trial"]
    directory = Path(ctx.output_of("tune")["trials_dir"]) / str(trial)
    if not (directory / "served").exists():
        raise DbspecError(f"the model of trial {trial} is not at {directory} (the study ran "
                          "before its models were kept); set search.final_model: retrain")
    served = load_served_model(directory / "served")
    outcome = TrainOutcome(**json.loads((directory / "outcome.json").read_text()))
    ctx.reporter.line(f"  reusing the model of trial {trial} (search.final_model: best_trial)")
    return Fitted(served, outcome, torch.device("cpu"), torch.get_num_threads(),
                  sum(p.numel() for p in served.network.parameters()))


def tuned_spec(ctx: StageContext):
    """The spec, with the search's best parameters applied when a study ran before."""
    if "tune" not in ctx.upstream:
        return ctx.spec
    from dbspec.spec.loader import apply_values

    return apply_values(ctx.loaded, ctx.output_of("tune")["best_params"]).spec


def _log_inputs(ctx: StageContext, spec, tracker, table, result) -> None:
    """Params (the flattened resolved spec), the spec files and the dataset of a new run."""
    import pandas as pd
    import yaml

    from dbspec.errors import redact_data
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
    load = ctx.output_of("load_data")
    frame = pd.DataFrame(table.features, columns=table.feature_names)
    frame[spec.data.target] = table.target
    tracker.log_dataset(frame, source=load["uri"], target=spec.data.target,
                        version=load["data_version"], name=f"{spec.name}-data")
