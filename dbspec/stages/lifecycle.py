"""evaluate, register and promote: metrics of the served model, a registry version, gates."""

from __future__ import annotations

import functools
import json
import math
from typing import Optional

import numpy as np

from dbspec.spec.sections.lifecycle import DEFAULT_METRICS, DEFAULT_PLOTS
from dbspec.stages.base import StageContext, registry_name, write_json
from dbspec.data.stream import tensor_of
from dbspec.stages.data import load_data_access
from dbspec.stages.outputs import (EvaluateOutput, LoadDataOutput, PromoteOutput,
                                   RegisterOutput, TrainOutput)


def score_split(served, data, split: str) -> np.ndarray:
    """The served model's predictions (values or probabilities) on a split's raw rows, block
    by block (:mod:`dbspec.data.access`: in memory or streamed)."""
    return np.concatenate([_score(served, x) for x, _ in data.blocks(split)] or
                          [np.zeros((0, served.card.out_features), dtype=np.float32)])


#: Rows per forward pass when scoring: a block's activations (rows x widest layer, twice)
#: stay tens of MiB (a 200,000-row profile sample through 256 units took 400 MiB at once).
SCORE_ROWS = 16_384


def _score(served, x: np.ndarray) -> np.ndarray:
    import torch

    with torch.inference_mode():
        return np.concatenate([served(tensor_of(x[start:start + SCORE_ROWS])).numpy()
                               for start in range(0, max(len(x), 1), SCORE_ROWS)])


class EvaluateStage:
    """Metrics on the validation and test splits, and plots, logged to the training run."""

    name = "evaluate"

    def run(self, ctx: StageContext) -> EvaluateOutput:
        from dbspec.evaluation.metrics import confusion, predicted_labels, task_metrics
        from dbspec.evaluation.plots import PlotData, write_plots
        from dbspec.models.served import load_served_model
        from dbspec.evaluation.curves import (DIAGNOSIS_DETAIL_TAG, DIAGNOSIS_TAG,
                                              diagnose_curves)

        spec, task = ctx.spec, ctx.spec.data.task
        data = load_data_access(ctx)
        served = load_served_model(ctx.dir_of("train") / "served")
        names = list(spec.evaluation.metrics or DEFAULT_METRICS[task])
        threshold = spec.evaluation.threshold
        metrics: dict[str, float] = {}
        predictions: dict[str, np.ndarray] = {}
        truth: dict[str, np.ndarray] = {}
        for split in ("val", "test"):
            if data.size(split) == 0:
                continue
            predictions[split] = score_split(served, data, split)
            truth[split] = data.targets(split)
            found = task_metrics(task, truth[split], predictions[split], names,
                                 threshold=threshold)
            metrics.update({f"{split}_{k}": v for k, v in found.items()})
            metrics[f"{split}_loss"] = _loss(served, data, split)
        history = json.loads((ctx.dir_of("train") / "history.json").read_text())
        plot_split = "test" if "test" in predictions else "val"
        plots = []
        if plot_split in predictions:
            plots = write_plots(list(spec.evaluation.plots or DEFAULT_PLOTS[task]),
                                ctx.directory / "plots",
                                PlotData(task, history, truth[plot_split],
                                         predictions[plot_split], data.classes, threshold))
        matrix = None
        if task != "regression" and "test" in predictions:
            labels = predicted_labels(task, predictions["test"], threshold)
            matrix = confusion(truth["test"], labels, len(data.classes))
        stopping = spec.training.early_stopping
        kept = ctx.output(TrainOutput).best_epoch \
            if stopping is not None and stopping.restore_best else None
        curve = diagnose_curves(history, _baseline_loss(served, data.targets("train")),
                                kept_epoch=kept)
        ctx.reporter.line(f"  learning curves: {curve.text()}")
        output = EvaluateOutput(metrics=metrics, plots=[p.name for p in plots],
                                confusion_matrix=matrix, diagnosis=curve.label,
                                learning_curve=curve.to_json())
        write_json(ctx.directory / "metrics.json",
                   {k: v for k, v in output.to_json().items() if k != "plots"})
        profile = _reference_profile(served, data, ctx.directory, spec.data)
        tracker = ctx.tracker
        with tracker.run(ctx.output(TrainOutput).run_id):
            tracker.log_artifact(profile, "monitoring")  # what `dbspec monitor` compares with
            # val_loss already has one value per epoch from training; keep its history clean
            tracker.log_metrics({k: v for k, v in metrics.items() if k != "val_loss"})
            tracker.set_tags({DIAGNOSIS_TAG: curve.label,
                              DIAGNOSIS_DETAIL_TAG: curve.text()[:5000]})
            for path in plots:
                tracker.log_artifact(path, "plots")
            tracker.log_artifact(ctx.directory / "metrics.json", "evaluation")
        return output


def _reference_profile(served, data, directory, data_spec):
    """The training split and the served model's predictions on it, binned for drift
    monitoring (:mod:`dbspec.monitoring.profile`); the path of the JSON file written. A
    streamed split is profiled from a uniform sample of ``data.streaming.sample_rows`` rows
    (gathered in one pass); in memory, from every training row."""
    from dbspec.models.card import prediction_columns
    from dbspec.monitoring.profile import build_profile, write_profile

    card = served.card
    rows = data_spec.streaming.sample_rows if data.streamed else data.size("train")
    x = data.sample("train", rows, seed=data_spec.split.seed)
    profile = build_profile(dict(zip(data.feature_names, x.T)),
                            prediction_columns(card, _score(served, x)),
                            task=card.task, classes=card.classes, threshold=card.threshold)
    return write_profile(profile, directory / "reference_profile.json")


def _loss(served, data, split: str) -> float:
    """The training loss of the final model on a split (targets in training form), summed
    block by block and weighted by rows."""
    import torch

    from dbspec.models.card import training_targets
    from dbspec.training.components import build_loss

    card = served.card
    loss_fn = build_loss(card.loss)
    total, rows = 0.0, 0
    for features, target in data.blocks(split, SCORE_ROWS):
        x, y = tensor_of(features), tensor_of(target)
        with torch.inference_mode():
            out = served.network(served.transform(x))
            total += float(loss_fn(out, training_targets(card, y))) * len(x)
        rows += len(x)
    return total / rows if rows else float("nan")


def _baseline_loss(served, targets: np.ndarray) -> Optional[float]:
    """The training loss, on the training ``targets``, of a model that ignores its inputs: the
    training mean for a regression (0 on standardised targets), the class frequencies for a
    classifier. None without rows."""
    import torch

    from dbspec.training.components import build_loss

    if len(targets) == 0:
        return None
    card = served.card
    y = tensor_of(targets)
    if card.task == "regression":
        target = ((y.double() - card.target_mean) / card.target_std).float().unsqueeze(1)
        constant = torch.zeros_like(target)
    elif card.loss == "bce":
        target = y.float().unsqueeze(1)
        share = float(target.mean().clamp(1e-6, 1 - 1e-6))
        constant = torch.full_like(target, math.log(share / (1 - share)))
    else:
        target = y.long()
        counts = torch.bincount(target, minlength=len(card.classes or [])).double()
        logits = torch.log((counts / counts.sum()).clamp_min(1e-12)).float()
        constant = logits.expand(len(target), -1)
    loss_fn, total = build_loss(card.loss), 0.0
    with torch.inference_mode():  # in blocks: a streamed split's rows x classes would not fit
        for start in range(0, len(target), BASELINE_BLOCK):
            block = slice(start, start + BASELINE_BLOCK)
            total += float(loss_fn(constant[block], target[block])) * len(target[block])
    return total / len(target)


#: Rows per block of the baseline loss.
BASELINE_BLOCK = 1_000_000


class RegisterStage:
    """A new registry version of the logged model, tagged with its spec, metrics and gates.

    The version is created ``pending`` (not validated) with the gates it will be checked
    against, so a kill before promote decides leaves nothing silently promotable. A rerun of
    the same training run and model (``--from evaluate``, ``--only register``, ``--resume``
    after a kill) reuses its version instead of registering a duplicate. Without a promotion
    section it is created ``ungated``: nothing will gate it.
    """

    name = "register"

    def run(self, ctx: StageContext) -> RegisterOutput:
        from dbspec.registry import PENDING, UNGATED, Registry
        from dbspec.registry.access import grant_after_register
        from dbspec.registry.candidate import promotion_tags

        spec = ctx.spec
        train, evaluate = ctx.output(TrainOutput), ctx.output(EvaluateOutput)
        name = registry_name(spec, ctx.options)
        tags = {"dbspec.spec": spec.name, "dbspec.run_id": train.run_id,
                "dbspec.data_version": ctx.output(LoadDataOutput).data_version,
                **{f"metric.{k}": f"{v:.6g}" for k, v in evaluate.metrics.items()},
                **spec.registry.tags}
        if evaluate.diagnosis is not None:
            tags["dbspec.diagnosis"] = evaluate.diagnosis
        tags.update(promotion_tags(_stages(spec), staged=spec.registry.staged()))
        registered = Registry(ctx.tracker.client).register(
            name, train.model_uri, train.run_id, tags,
            decision=UNGATED if spec.registry.promotion is None else PENDING)
        for version in registered.abandoned:
            ctx.reporter.line(f"  {name} version {version} tagged abandoned (its run died "
                              "before gating it)")
        how = "reused (same training run and model)" if registered.adopted else "registered"
        ctx.reporter.line(f"  {how} {name} version {registered.version}")
        for line in grant_after_register(ctx.tracker, spec, name):  # roles, on a server with auth
            ctx.reporter.line(line)
        return RegisterOutput(name=name, version=registered.version,
                              adopted=registered.adopted)


def _stages(spec) -> list:
    """The spec's promotion stages, as the promotion service takes them."""
    from dbspec.registry.candidate import StageRecord

    return [StageRecord.from_spec(s) for s in spec.registry.promotion_stages()]


class PromoteStage:
    """The run's promotion, decided by the promotion service
    (:func:`dbspec.registry.promotion.promote_stages`): each stage's gates are checked as the
    version enters it, its alias moved or approval asked for; the single form of
    ``registry.promotion`` is one stage. ``better_than`` re-scores the stage's holder on this
    run's test split (the candidate's :data:`~dbspec.registry.candidate.Score`).
    """

    name = "promote"

    def run(self, ctx: StageContext) -> PromoteOutput:
        from dbspec.registry import Registry
        from dbspec.registry.candidate import Candidate
        from dbspec.registry.promotion import promote_stages

        spec = ctx.spec
        registered, evaluate = ctx.output(RegisterOutput), ctx.output(EvaluateOutput)
        name, version = registered.name, str(registered.version)
        registry = Registry(ctx.tracker.client)
        rescore = functools.cache(functools.partial(_rescore, ctx, registry, name))
        candidate = Candidate(name, version, evaluate.metrics, rescore,
                              diagnosis=evaluate.diagnosis,
                              stages=tuple(_stages(spec)),
                              run_id=ctx.output(TrainOutput).run_id)
        walked = promote_stages(registry, candidate, staged=spec.registry.staged())
        for decision in walked.decisions:
            if decision.warning:
                ctx.reporter.line(f"  warning: {decision.warning}")
        for result in walked.results:
            ctx.reporter.line(f"  gate {result.describe()}")
        for decision in walked.decisions:
            ctx.reporter.line(f"  @{decision.alias}: {_said(decision)}")
        last = walked.decisions[-1]
        return PromoteOutput(name=name, version=version, alias=last.alias,
                             decision=walked.outcome, previous=last.previous,
                             gates=[r.describe() for r in walked.results],
                             passed=walked.passed,
                             stages=[d.stage_report() for d in walked.decisions],
                             deployment_job=walked.deployment_job)


def _said(decision) -> str:
    """What happened at one stage, in words."""
    name, version = decision.name, decision.version
    if decision.outcome == "awaiting_approval":
        return (f"v{version} awaits approval: dbspec approve {name} {version} "
                f"--alias {decision.alias}")
    if decision.outcome == "rejected":
        return f"v{version} rejected by the gates; the alias stays"
    if decision.outcome == "deferred":
        return (f"v{version} is left to the model's deployment job, which MLflow runs on each "
                "new version (gates, approval, aliases, endpoint); nothing moved here")
    was = f" (was v{decision.previous})" if decision.previous else ""
    return f"-> v{version}{was}" if decision.moved else f"v{version} holds it already"


def _rescore(ctx: StageContext, registry, name: str, holder: str,
             metric: str) -> Optional[float]:
    """Version ``holder``'s ``metric`` on this run's split (a champion against the challenger;
    :func:`functools.cache` scores each holder and metric once, whichever stage asks).

    Raises:
        RegistryUnavailable: the champion cannot be loaded (its gate then fails).
    """
    import mlflow
    from mlflow.exceptions import MlflowException

    from dbspec.evaluation.metrics import task_metrics
    from dbspec.registry.candidate import recorded_metrics
    from dbspec.registry.errors import unavailable

    split, _, base = metric.partition("_")
    data = load_data_access(ctx)
    try:
        model = mlflow.pyfunc.load_model(f"models:/{name}/{holder}")
    except (MlflowException, OSError) as exc:
        raise unavailable(exc, f"the champion {name} v{holder}") from None
    served = model.unwrap_python_model().model
    if served.card.feature_names != data.feature_names or served.card.inputs != data.inputs:
        # other columns, or typed features encoded with another vocabulary: the champion
        # cannot score this encoding; its own logged figure stands
        return recorded_metrics(registry.version(name, holder).tags or {}).get(metric)
    if base == "loss":
        return _loss(served, data, split)
    found = task_metrics(ctx.spec.data.task, data.targets(split),
                         score_split(served, data, split), [base],
                         threshold=ctx.spec.evaluation.threshold)
    return found[base]
