"""evaluate, register and promote: metrics of the served model, a registry version, gates."""

from __future__ import annotations

import json
import math
from typing import Any, Optional

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


def _score(served, x: np.ndarray) -> np.ndarray:
    import torch

    with torch.inference_mode():
        return served(tensor_of(x)).numpy()


class EvaluateStage:
    """Metrics on the validation and test splits, and plots, logged to the training run."""

    name = "evaluate"

    def run(self, ctx: StageContext) -> EvaluateOutput:
        from dbspec.evaluation.metrics import confusion, predicted_labels, task_metrics
        from dbspec.evaluation.plots import write_plots
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
                                ctx.directory / "plots", task=task, history=history,
                                y_true=truth[plot_split], predictions=predictions[plot_split],
                                classes=data.classes, threshold=threshold)
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
    for features, target in data.blocks(split):
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

        spec = ctx.spec
        train, evaluate = ctx.output(TrainOutput), ctx.output(EvaluateOutput)
        name = registry_name(spec, ctx.options)
        tags = {"dbspec.spec": spec.name, "dbspec.run_id": train.run_id,
                "dbspec.data_version": ctx.output(LoadDataOutput).data_version,
                **{f"metric.{k}": f"{v:.6g}" for k, v in evaluate.metrics.items()},
                **spec.registry.tags}
        if evaluate.diagnosis is not None:
            tags["dbspec.diagnosis"] = evaluate.diagnosis
        tags.update(_promotion_tags(spec))
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


def _gates_of(spec) -> list[dict[str, Any]]:
    """The first promotion stage's gates as recorded (``dbspec.gates``)."""
    return _stage_record(spec.registry.promotion_stages()[0])["gates"]


def _stage_record(stage) -> dict[str, Any]:
    return {"alias": stage.alias, "approval": stage.approval,
            "gates": [g.model_dump(mode="json", exclude_none=True) for g in stage.gates]}


def _promotion_tags(spec) -> dict[str, str]:
    """Version tags of the promotion: its (first stage's) gates, and every stage where there
    are several or one needs approval (a single promotion records what it always did)."""
    from dbspec.registry import GATES_TAG
    from dbspec.registry.lifecycle import STAGES_TAG

    stages = spec.registry.promotion_stages()
    if not stages:
        return {}
    tags = {GATES_TAG: json.dumps(_gates_of(spec))}
    if spec.registry.staged() or any(s.approval == "required" for s in stages):
        tags[STAGES_TAG] = json.dumps([_stage_record(s) for s in stages])
    return tags


class PromoteStage:
    """Walk the promotion stages in order: each stage's gates are checked as the version enters
    it; a stage that passes moves its alias and the walk goes on; a stage with approval records
    the version as awaiting approval and stops; a failing stage stops (rejected there). The
    single form of ``registry.promotion`` is one stage.

    Gates are checked and an alias moved in :meth:`Registry.guarded_move`, so a concurrent run
    or ``dbspec promote`` cannot slip a worse champion in between: when the holder changed
    since the champion was scored, it is scored again. ``better_than`` re-scores the stage's
    holder on this run's test split.
    """

    name = "promote"

    def run(self, ctx: StageContext) -> PromoteOutput:
        from mlflow.exceptions import MlflowException

        from dbspec.registry import Registry
        from dbspec.registry.errors import unavailable
        from dbspec.registry.lifecycle import MODEL_STAGES_TAG

        spec = ctx.spec
        stages = spec.registry.promotion_stages()
        registered = ctx.output(RegisterOutput)
        name, version = registered.name, str(registered.version)
        registry = Registry(ctx.tracker.client)
        evaluate = ctx.output(EvaluateOutput)
        try:
            for key, value in _promotion_tags(spec).items():
                registry.client.set_model_version_tag(name, version, key, value)
            registry.client.set_registered_model_tag(name, MODEL_STAGES_TAG,
                                                     json.dumps([s.alias for s in stages]))
        except MlflowException as exc:
            raise unavailable(exc, f"the promotion records of {name} v{version}") from None
        walk = _StageWalk(self, ctx, registry, name, version, evaluate)
        reports = []
        for index, stage in enumerate(stages):
            report = walk.enter(stage, last=index == len(stages) - 1,
                                label=stage.alias if spec.registry.staged() else "")
            reports.append(report)
            if report["outcome"] != "promoted":
                break
        results = walk.results
        passed = all(r.passed for r in results)
        registry.record_gates(name, version, results, "promoted" if passed else "rejected")
        for result in results:
            ctx.reporter.line(f"  gate {result.describe()}")
        for report in reports:
            ctx.reporter.line(f"  @{report['alias']}: {_said(report, name, version)}")
        last = reports[-1]
        decision = "rejected" if not passed else last["outcome"]
        return PromoteOutput(name=name, version=version, alias=last["alias"],
                             decision=decision, previous=last["previous"],
                             gates=[r.describe() for r in results], passed=passed,
                             stages=reports)

    @staticmethod
    def _rescore(ctx: StageContext, registry, name: str, holder: str,
                 metric: str) -> Optional[float]:
        """Version ``holder``'s ``metric`` on this run's own split (champion vs challenger).

        Raises:
            RegistryUnavailable: the champion cannot be loaded (its gate then fails).
        """
        import mlflow
        from mlflow.exceptions import MlflowException

        from dbspec.evaluation.metrics import task_metrics
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
            logged = (registry.version(name, holder).tags or {}).get(f"metric.{metric}")
            return float(logged) if logged is not None else None  # cannot score this data
        if base == "loss":
            return _loss(served, data, split)
        found = task_metrics(ctx.spec.data.task, data.targets(split),
                             score_split(served, data, split), [base],
                             threshold=ctx.spec.evaluation.threshold)
        return found[base]


def _said(report: dict[str, Any], name: str, version: str) -> str:
    """What happened at one stage, in words."""
    outcome = report["outcome"]
    if outcome == "awaiting_approval":
        return (f"v{version} awaits approval: dbspec approve {name} {version} "
                f"--alias {report['alias']}")
    if outcome == "rejected":
        return f"v{version} rejected by the gates; the alias stays"
    was = f" (was v{report['previous']})" if report["previous"] else ""
    return f"-> v{version}{was}" if report["moved"] else f"v{version} holds it already"


class _StageWalk:
    """One promote stage's walk through the promotion stages, with the champions it scored
    (one re-score per holder and metric, whichever stage asks) and every gate result."""

    def __init__(self, stage: PromoteStage, ctx: StageContext, registry, name: str,
                 version: str, evaluate: EvaluateOutput):
        self.stage, self.ctx, self.registry = stage, ctx, registry
        self.name, self.version = name, version
        self.metrics = evaluate.metrics
        self.diagnosis = getattr(evaluate, "diagnosis", None)
        self.run_id = ctx.output(TrainOutput).run_id
        self.scores: dict[tuple[str, str], Optional[float]] = {}
        self.results: list = []

    def champion(self, seen, alias: str, metric: str):
        """The holder of ``alias`` re-scored on this run's split (for a version that holds it
        already, a promotion resumed after its move: the version it replaced)."""
        from dbspec.registry.gates import Champion

        holder, note = seen.reference(alias, self.version), ""
        if seen.holder(alias) == self.version:
            if holder is None:
                return Champion(None, note=f"v{self.version} holds @{alias} already and "
                                           "replaced no version there")
            note = f"the version v{self.version} replaced"
        if holder is None:
            return Champion(None)
        if (holder, metric) not in self.scores:
            self.scores[holder, metric] = self.stage._rescore(self.ctx, self.registry,
                                                              self.name, holder, metric)
        return Champion(holder, self.scores[holder, metric], note)

    def enter(self, stage, *, last: bool, label: str) -> dict[str, Any]:
        """Check ``stage``'s gates; move its alias, or ask for approval. Returns the stage's
        report: ``{alias, outcome, moved, previous, gates}``."""
        from dbspec.registry import AliasDecision, check_gates
        from dbspec.registry.lifecycle import record_final_move, request_approval

        def decide(seen) -> AliasDecision:
            results = check_gates(stage.gates, self.metrics,
                                  lambda alias, metric: self.champion(seen, alias, metric),
                                  diagnosis=self.diagnosis, stage=label)
            move = all(r.passed for r in results) and stage.approval != "required"
            return AliasDecision(self.version if move else None,
                                 f"gates passed in run {self.run_id}", detail=results)

        seen = self.registry.snapshot(self.name)
        first = decide(seen)  # score the champion before taking the lock (slow)
        report = {"alias": stage.alias, "moved": False, "previous": None}
        if stage.approval == "required":
            results = first.detail
            passed = all(r.passed for r in results)
            if passed and seen.holder(stage.alias) != self.version:
                request_approval(self.registry.client, self.name, self.version, stage.alias,
                                 [r.describe() for r in results], self.run_id)
            outcome = "rejected" if not passed else "promoted" \
                if seen.holder(stage.alias) == self.version else "awaiting_approval"
        else:
            moved = self.registry.guarded_move(self.name, stage.alias, decide)
            results = moved.decision.detail
            outcome = "promoted" if all(r.passed for r in results) else "rejected"
            report.update(moved=moved.moved, previous=moved.previous if moved.moved else None)
            if moved.moved and last:
                warning = record_final_move(self.registry.client, self.name, moved.previous,
                                            self.version, stage.alias, moved.decision.reason)
                if warning:
                    self.ctx.reporter.line(f"  warning: {warning}")
        self.results.extend(results)
        return {**report, "outcome": outcome, "gates": [r.describe() for r in results]}
