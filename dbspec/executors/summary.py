"""The end-of-run summary: a table for people, JSON for scripts and CI."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from dbspec.executors.records import RunRecord
from dbspec.stages.outputs import (BatchPredictOutput, EvaluateOutput, PromoteOutput,
                                   RegisterOutput, ServeOutput, TrainOutput, TuneOutput)

_SEARCH = ("study_name", "storage", "best_value", "best_params", "best_trial", "trials",
           "epochs_trained", "metric")
_TRAINING = ("epochs_run", "best_epoch", "train_samples_per_second", "device", "threads",
             "batch_size", "world_size", "backend", "placement")


@dataclass(frozen=True)
class StageSummary:
    """One stage in the summary: ``ran`` or ``cached``, and for how long."""

    name: str
    action: str
    seconds: float


@dataclass(frozen=True)
class RunSummary:
    """The end-of-run summary; :meth:`to_json` is ``--summary-json``, :meth:`render` the table.

    The search, training, batch_predict and serve parts are those stages' own outputs (or
    the part of them shown), as JSON; empty when the stage is not in the run.
    """

    spec: str
    target: Optional[str]
    run_id: Optional[str] = None
    experiment_id: Optional[str] = None
    tracking_uri: Optional[str] = None
    model_uri: Optional[str] = None
    model_name: Optional[str] = None
    model_version: Optional[str] = None
    aliases_set: dict[str, str] = field(default_factory=dict)
    previous_alias_holder: Optional[str] = None
    promotion: Optional[str] = None
    gates: list[str] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    search: dict[str, Any] = field(default_factory=dict)
    training: dict[str, Any] = field(default_factory=dict)
    diagnosis: list[str] = field(default_factory=list)
    learning_curve: dict[str, Any] = field(default_factory=dict)
    batch_predict: dict[str, Any] = field(default_factory=dict)
    serve: dict[str, Any] = field(default_factory=dict)
    stages: tuple[StageSummary, ...] = ()
    state_dir: str = ""

    @classmethod
    def of(cls, record: RunRecord) -> "RunSummary":
        """run_id, experiment_id, model name and version, aliases set, gates, metrics,
        stages."""
        train, tune = record.output(TrainOutput), record.output(TuneOutput)
        evaluate, register = record.output(EvaluateOutput), record.output(RegisterOutput)
        promote = record.output(PromoteOutput)
        batch, serve = record.output(BatchPredictOutput), record.output(ServeOutput)
        search: dict[str, Any] = {}
        if tune is not None:
            search = {k: v for k, v in tune.to_json().items() if k in _SEARCH}
            search["study_run_id"] = tune.run_id
        return cls(
            spec=record.spec, target=record.target,
            run_id=train.run_id if train else None,
            experiment_id=train.experiment_id if train else None,
            tracking_uri=train.tracking_uri if train else None,
            model_uri=train.model_uri if train else None,
            model_name=register.name if register else None,
            model_version=register.version if register else None,
            aliases_set=promote.aliases_set() if promote else {},
            previous_alias_holder=promote.previous if promote else None,
            promotion=promote.decision if promote else None,
            gates=list(promote.gates) if promote else [],
            metrics=dict(evaluate.metrics) if evaluate else {},
            search=search,
            training={k: v for k, v in train.to_json().items() if k in _TRAINING}
            if train else {},
            diagnosis=list(train.diagnosis) if train else [],
            learning_curve=dict(evaluate.learning_curve or {}) if evaluate else {},
            batch_predict=batch.to_json() if batch else {},
            serve=serve.to_json() if serve else {},
            stages=tuple(StageSummary(s.name, s.action, round(s.seconds, 3))
                         for s in record.stages),
            state_dir=str(record.run_dir))

    def to_json(self) -> dict[str, Any]:
        """The summary as ``--summary-json`` writes it."""
        return asdict(self)

    def render(self) -> str:
        """An aligned text table."""
        return render_summary(self.to_json())


def render_summary(summary: dict[str, Any]) -> str:
    """An aligned text table of the summary."""
    rows: list[tuple[str, str]] = []
    ran = [s["name"] for s in summary["stages"] if s["action"] == "ran"]
    cached = [s["name"] for s in summary["stages"] if s["action"] == "cached"]
    rows.append(("stages run", ", ".join(ran) or "none (all unchanged)"))
    if cached:
        rows.append(("stages cached", ", ".join(cached)))
    for key, label in (("run_id", "MLflow run"), ("experiment_id", "experiment"),
                       ("tracking_uri", "tracking URI")):
        if summary.get(key):
            rows.append((label, str(summary[key])))
    if summary.get("model_name"):
        rows.append(("model version", f"{summary['model_name']} v{summary['model_version']}"))
    if summary.get("promotion"):
        moved = ", ".join(f"@{a} -> v{v}" for a, v in summary["aliases_set"].items())
        rows.append(("promotion", summary["promotion"] + (f" ({moved})" if moved else "")))
        for gate in summary["gates"]:
            rows.append(("  gate", gate))
    rows += _outcome_rows(summary)
    training = summary.get("training", {})
    if training:
        rows.append(("training", f"{training.get('epochs_run')} epochs (best "
                                 f"{training.get('best_epoch')}), "
                                 f"{training.get('train_samples_per_second', 0):,.0f} samples/s "
                                 f"on {training.get('device')} x{training.get('threads')} "
                                 "threads" + (f", batch size {training['batch_size']}"
                                              if training.get("batch_size") else "")
                                 + (f", {training['world_size']} ranks ({training['backend']}"
                                    f"{', ' + training['placement'] if training.get('placement') else ''})"
                                    if training.get("world_size") else "")))
    curve = summary.get("learning_curve") or {}
    if curve:
        rows.append(("learning curves", f"{curve['label']}: {curve['reason']}"
                     + "".join(f"; {note}" for note in curve.get("notes", []))))
    for i, finding in enumerate(summary.get("diagnosis") or []):
        rows.append(("diagnosis" if i == 0 else "", finding))
    for name, value in sorted(summary.get("metrics", {}).items()):
        if name.startswith("test_"):
            rows.append((name, f"{value:.6g}"))
    width = max(len(label) for label, _ in rows)
    title = f"dbspec run {summary['spec']}" + (f" --target {summary['target']}"
                                               if summary.get("target") else "")
    return "\n".join([title] + [f"  {label.ljust(width)}  {value}" for label, value in rows])


def _outcome_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """The rows of what the run left behind besides the model: predictions, serving, search."""
    rows: list[tuple[str, str]] = []
    batch = summary.get("batch_predict") or {}
    if batch:
        written = f"Delta v{batch['output_version']}" if batch.get("output_version") is not None \
            else batch["format"]
        rows.append(("predictions", f"{batch['rows']:,} rows -> {batch['output']} ({written}) "
                                    f"with {batch['model_uri']} (v{batch['model_version']})"))
    serve = summary.get("serve") or {}
    if serve.get("problem"):
        rows.append(("serving", serve["problem"]))
    elif serve:
        rows.append(("serving", f"{serve['model_uri']} (v{serve['model_version']}) answers; "
                                f"start it with: {serve['command']}"))
    search = summary.get("search") or {}
    if search:
        trials = ", ".join(f"{v} {k}" for k, v in search["trials"].items())
        rows.append(("search", f"study {search['study_name']} ({trials}; "
                               f"{search['epochs_trained']} epochs trained)"))
        rows.append(("  storage", search["storage"]))
        params = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                           for k, v in search["best_params"].items())
        rows.append(("  best", f"{search['metric']}={search['best_value']:.6g} (trial "
                               f"{search['best_trial']}): {params}"))
    return rows
