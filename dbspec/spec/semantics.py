"""Checks across fields that types alone cannot express.

Each check reads the validated :class:`Spec` and reports findings by dotted path; the loader
positions them in the file. Every finding says what is wrong and what to write instead.
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Optional

from dbspec.errors import did_you_mean, one_of
from dbspec.seams.compute import ComputeFinding as Finding, compute_kind
from dbspec.seams.sources import source_kind
from dbspec.seams.targets import serving_findings
from dbspec.spec.checkpoints import pretrained_findings
from dbspec.spec.clusters import check_clusters
from dbspec.spec.locations import is_local_master, is_local_store
from dbspec.spec.sections.jobs import check_shared_dir
from dbspec.spec.sections import Spec
from dbspec.spec.sections.monitoring import check_monitoring
from dbspec.spec.sections.search import FloatDistribution
from dbspec.spec.sections.lifecycle import (CLASSIFICATION_METRICS, CLASSIFICATION_PLOTS,
                                            REGRESSION_METRICS, REGRESSION_PLOTS)
from dbspec.spec.sections.training import TASK_LOSSES
# lower_is_better is re-exported: training, tuning and monitoring import it from here
from dbspec.spec.metrics import gate_metric_problems, lower_is_better, metric_names
from dbspec.spec.layout import LayoutError, has_typed_features, head_input
from dbspec.spec.shapes import ShapeError, fixed_output_width, format_shape, infer_shapes


class _Findings(list[Finding]):
    """Findings at dotted paths of the spec; a kind's own (``check``) are added with ``extend``."""

    def error(self, path: tuple, message: str, *, at_key: bool = False) -> None:
        self.append(Finding(path, message, False, at_key))

    def warning(self, path: tuple, message: str, *, at_key: bool = False) -> None:
        self.append(Finding(path, message, True, at_key))


def input_width(spec: Spec) -> Optional[int]:
    """Features per row when known without reading data, else None."""
    data = spec.data
    if data.features is not None:
        return sum(1 for f in data.features if isinstance(f, str) or f.type == "numeric")
    return source_kind(data).known_width(data.source)


def output_classes(spec: Spec) -> Optional[int]:
    """Classes of a classification task when known without reading data."""
    known = source_kind(spec.data).known_classes(spec.data.source)
    if known is not None:
        return known
    return 2 if spec.data.task == "binary" else None


def check_spec(spec: Spec) -> list[Finding]:
    """Every semantic finding for a type-valid spec."""
    found = _Findings()
    defaults = [name for name, target in spec.targets.items() if target.default]
    if len(defaults) > 1:
        found.error(("targets", defaults[1], "default"), f"only one target can be the default; "
                    f"'{defaults[0]}' already is")
    _check_data(spec, found)
    _check_model(spec, found)
    _check_training(spec, found)
    found.extend(compute_kind(spec).check(spec))
    _check_search(spec, found)
    _check_evaluation(spec, found)
    found.extend(serving_findings(spec))  # the serving mode's targets' checks
    _check_spark(spec, found)
    found.extend(check_clusters(spec))
    for path, message in check_monitoring(spec):
        found.error(path, message)
    return found


def _check_data(spec: Spec, found: _Findings) -> None:
    data = spec.data
    found.extend(source_kind(data).check(spec))  # the source kind's own checks
    for index, step in enumerate(data.preprocessing):
        if step.key == "clip" and step.args.lower_quantile >= step.args.upper_quantile:
            found.error(("data", "preprocessing", index, "clip"), "lower_quantile must be below "
                        "upper_quantile")
    _check_unique(("data", "features"), data.feature_names or [], found)
    if data.target in (data.feature_names or ()):
        found.error(("data", "features"), f"the target '{data.target}' is also a feature")
    split = data.split
    if split.validation + split.test >= 1:
        found.error(("data", "split"), f"validation ({split.validation}) + test ({split.test}) "
                    "leave no rows to train on; keep their sum below 1")
    if split.stratify and data.task == "regression":
        found.error(("data", "split", "stratify"), "stratified splits need a classification task")
    _check_streaming(spec, found)
    _check_typed(spec, found)


def _check_typed(spec: Spec, found: _Findings) -> None:
    """Typed features: where they can go, and encoders only for them."""
    data, model = spec.data, spec.model
    typed = {name: f for name, f in data.declared_types.items() if f.type != "numeric"}
    if typed and data.streaming is not None:
        found.error(("data", "streaming"), "typed features ("
                    + ", ".join(f"{n}: {f.type}" for n, f in list(typed.items())[:4])
                    + ") are encoded in memory; data.streaming takes numeric features only")
    for name, feature in typed.items():
        if getattr(feature, "tokenizer", None) == "checkpoint" and model.pretrained is None:
            found.error(("data", "features"), f"'{name}' takes the checkpoint's tokenizer; "
                        "that needs model.pretrained (or use word, char, bpe or wordpiece)")
    if typed and model.custom is not None:
        found.error(("model", "custom"), "a custom class takes numeric features only; use "
                    "model.encoders and model.layers for typed features ("
                    + ", ".join(typed) + ")")
    for index, step in enumerate(data.preprocessing):
        named = step.args.columns if step.args.columns != "all" else ()
        for position, name in enumerate(named):
            if name in typed:
                found.error(("data", "preprocessing", index, step.key, "columns", position),
                            f"'{name}' is a {typed[name].type} feature; preprocessing steps "
                            "apply to numeric features (typed features are encoded by their "
                            "type)")
    for name in model.encoders:
        if name not in typed:
            declared = data.declared_types.get(name)
            reason = (f"'{name}' is a numeric feature (numeric features go to the combiner as "
                      "they are)" if declared is not None or name in (data.feature_names or ())
                      else f"no typed feature '{name}'{did_you_mean(name, list(typed))}")
            found.error(("model", "encoders", name), reason + "; encoders are for the "
                        "categorical, text, sequence and image features of data.features"
                        + (f" ({', '.join(typed)})" if typed else ""))


def _check_streaming(spec: Spec, found: _Findings) -> None:
    data, streaming = spec.data, spec.data.streaming
    steps = spec.training.checkpointing.every_n_steps
    if streaming is None:
        if steps is not None:
            found.error(("training", "checkpointing", "every_n_steps"), "mid-epoch checkpoints "
                        "need data.streaming (in-memory epochs resume from their start)")
        return
    if data.split.stratify:
        found.error(("data", "split", "stratify"), "data.streaming splits rows by a hash of "
                    "their key or position, which cannot stratify; leave stratify out")
    if streaming.key is not None and streaming.key == data.target:
        found.error(("data", "streaming", "key"), f"the key '{streaming.key}' is the target; "
                    "use a row ID column")
    if streaming.enabled is False and streaming.in_memory_limit_mb is not None:
        found.warning(("data", "streaming", "in_memory_limit_mb"), "ignored: enabled is false")


def _check_unique(path: tuple, items: list, found: _Findings) -> None:
    seen = set()
    for index, item in enumerate(items):
        if item in seen:
            found.error(path + (index,), f"'{item}' is listed twice")
        seen.add(item)


def _check_model(spec: Spec, found: _Findings) -> None:
    model, task = spec.model, spec.data.task
    loss = spec.training.loss_for(task)
    if model.pretrained is not None:
        for path, message in pretrained_findings(spec, output_width(task, loss,
                                                                    output_classes(spec))):
            found.error(path, message)
        return
    if model.custom is not None:
        top = model.custom.class_.split(":")[0].split(".")[0]
        try:
            importable = top in sys.modules or importlib.util.find_spec(top) is not None
        except (ImportError, ValueError):  # a module without a spec (``__main__`` of a script)
            importable = False
        if not importable:
            found.warning(("model", "custom", "class"), f"module '{top}' is not importable here; "
                          "it must be installed where the spec runs")
        return
    layers = model.layers or []
    width = input_width(spec) if _check_layer_settings(layers, found) else None
    if has_typed_features(spec.data.features):
        try:
            width = head_input(spec.data.features, model, width)
        except LayoutError as exc:
            found.error(exc.path, exc.message)
            return
    last = ("model", "layers", len(layers) - 1)
    # without the input width (the data decides it), what the spec alone fixes: a final linear
    # layer's width; the rest is checked when the run loads the data
    width_out = fixed_output_width(layers) if width is None else None
    if width is not None:
        try:
            final = infer_shapes(layers, (width,))[-1]
        except ShapeError as exc:
            found.error(("model", "layers", exc.index), exc.message)
            return
        if len(final) != 1:
            found.error(last, f"the network ends with shape {format_shape(final)}; a "
                        "prediction is a flat vector: add '- flatten' and a linear layer")
            return
        width_out = final[0]
    expected = output_width(spec.data.task, loss, output_classes(spec))
    if expected is not None and width_out is not None and width_out != expected:
        found.error(last, f"the network outputs {_count(width_out, 'value')} per row; {task} "
                    f"with loss '{loss}' needs {expected}")
    final_layer = layers[-1].key
    if loss in ("bce", "cross_entropy") and final_layer in ("sigmoid", "softmax"):
        applies = "a sigmoid" if loss == "bce" else "a softmax"
        found.warning(last, f"the '{loss}' loss applies {applies} itself and expects raw "
                      f"scores; remove the final {final_layer} layer")
    if loss == "nll" and final_layer != "log_softmax":
        found.warning(last, "the nll loss expects log-probabilities; end with '- log_softmax' "
                      "or use the cross_entropy loss")


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'s' * (number != 1)}"


_ONE_D = ("conv1d", "maxpool1d", "avgpool1d", "adaptive_avgpool1d")


def _check_layer_settings(layers, found: _Findings) -> bool:
    """1-d layers take single numbers; a pair would be silently half-ignored."""
    clean = True
    for index, layer in enumerate(layers):
        if layer.key == "embedding" and layer.args.vocabulary is None:
            found.error(("model", "layers", index, "embedding"), "an embedding in model.layers "
                        "needs 'vocabulary' (the number of indices its input holds); a typed "
                        "feature's encoder (model.encoders) gets it from the fitted vocabulary")
            clean = False
        if layer.key not in _ONE_D:
            continue
        for name, value in layer.args:
            if isinstance(value, tuple):
                found.error(("model", "layers", index, layer.key, name),
                            f"{layer.key} takes one number for {name}, not a pair")
                clean = False
    return clean


def output_width(task: str, loss: str, classes: Optional[int]) -> Optional[int]:
    """Network outputs per row for the task and loss (``classes``: how many, for multiclass)."""
    if task == "regression":
        return 1
    if task == "binary":
        return 1 if loss == "bce" else 2
    return classes


def _check_training(spec: Spec, found: _Findings) -> None:
    training, task = spec.training, spec.data.task
    if training.loss != "auto" and training.loss not in TASK_LOSSES[task]:
        found.error(("training", "loss"), f"loss '{training.loss}' does not fit a {task} task; "
                    f"use {one_of(TASK_LOSSES[task])}")
    optimizer = training.optimizer
    if optimizer.name == "sgd" and optimizer.nesterov and optimizer.momentum <= 0:
        found.error(("training", "optimizer", "nesterov"), "nesterov needs momentum > 0")
    names = metric_names(spec)
    if training.early_stopping is not None:
        _check_metric(("training", "early_stopping", "monitor"),
                      training.early_stopping.monitor, names, found)
        if spec.data.split.validation == 0 and training.early_stopping.monitor.startswith("val_"):
            found.error(("training", "early_stopping"), "early stopping on a validation metric "
                        "needs data.split.validation > 0")
    scheduler = training.scheduler
    if scheduler is not None and scheduler.name == "plateau":
        _check_metric(("training", "scheduler", "monitor"), scheduler.monitor, names, found)
        if spec.data.split.validation == 0 and scheduler.monitor.startswith("val_"):
            found.error(("training", "scheduler", "monitor"), "a validation metric needs "
                        "data.split.validation > 0")
    if scheduler is not None and scheduler.name == "multistep" and \
            max(scheduler.milestones) > training.epochs:
        found.warning(("training", "scheduler", "milestones"), f"milestones past the last epoch "
                      f"({training.epochs}) never fire")


def _check_metric(path: tuple, metric: str, names: list[str], found: _Findings) -> None:
    candidates = [n for n in names if not n.startswith("test_")]
    if metric not in candidates:
        found.error(path, f"unknown metric '{metric}'{did_you_mean(metric, candidates)}; this "
                    f"spec logs {', '.join(candidates)}")


def _check_search(spec: Spec, found: _Findings) -> None:
    search = spec.search
    if search is None:
        return
    _check_metric(("search", "metric"), search.metric, metric_names(spec), found)
    if search.direction != "auto":
        natural = "minimize" if lower_is_better(search.metric) else "maximize"
        if search.direction != natural:
            found.warning(("search", "direction"), f"'{search.metric}' is usually {natural}d, "
                          f"not {search.direction}d")
    if search.parallelism > search.n_trials:
        found.warning(("search", "parallelism"), f"parallelism {search.parallelism} exceeds "
                      f"n_trials {search.n_trials}; only {search.n_trials} run at once")
    if spec.data.split.validation == 0:
        found.error(("search",), "a search scores trials on the validation split; set "
                    "data.split.validation > 0")
    for path, dist in search.space.items():
        where = ("search", "space", path)
        if path.split(".")[0] not in ("vars", "model", "training"):
            found.error(where, f"'{path}': a search can change vars, model and training; the "
                        "data is prepared once per study and the rest does not train",
                        at_key=True)
        for choice in getattr(dist, "choices", ()):
            if not isinstance(choice, (str, int, float, bool)) and choice is not None:
                found.error(where, f"categorical choices must be plain values (text, numbers, "
                            f"true/false), not {type(choice).__name__}s")
                break
        bounds = getattr(dist, "low_high", None)
        if bounds is not None:
            low, high = bounds
            if low > high:
                found.error(where, f"low ({low}) is greater than high ({high})")
            if dist.log and low <= 0:
                found.error(where, f"a log scale needs low > 0, got {low}")
            if dist.log and dist.step not in (None, 1):
                found.error(where, "log and step cannot be combined")
        if search.sampler.name == "grid" and isinstance(dist, FloatDistribution) and \
                dist.step is None:
            found.error(where, "the grid sampler needs finite choices: give a step, or use "
                        "int or categorical")


def _check_spark(spec: Spec, found: _Findings) -> None:
    if spec.spark.shared_dir:
        try:
            check_shared_dir(spec.spark.shared_dir)
        except ValueError as exc:
            found.error(("spark", "shared_dir"), str(exc))
    master = spec.spark.master
    storage = spec.search.storage if spec.search is not None else None
    if master and not is_local_master(master) and spec.executor == "spark" and storage and \
            is_local_store(storage):
        found.error(("search", "storage"), f"{storage} is a file on the driver; trials on the "
                    f"executors of {master} cannot open it: use a database URL every node "
                    "reaches, or leave search.storage unset (a journal file in the shared dir)")


def _check_evaluation(spec: Spec, found: _Findings) -> None:
    task, regression = spec.data.task, spec.data.task == "regression"
    for field, fits in (("metrics", REGRESSION_METRICS if regression else CLASSIFICATION_METRICS),
                        ("plots", REGRESSION_PLOTS if regression else CLASSIFICATION_PLOTS)):
        chosen = getattr(spec.evaluation, field) or []
        _check_unique(("evaluation", field), chosen, found)
        for index, name in enumerate(chosen):
            if name not in fits:
                found.error(("evaluation", field, index), f"'{name}' is not a {task} "
                            f"{field[:-1]}; use {one_of(fits)}")
    for path, message in gate_metric_problems(spec):
        found.error(path, message)

