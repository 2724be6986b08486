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
             "parameters", "trained_parameters",
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
    deployment_job: Optional[str] = None  # the job a ``deferred`` promotion was left to

    @classmethod
    def of(cls, record: RunRecord) -> "RunSummary":
        """The summary of a run's record."""
        train, tune = record.output(TrainOutput), record.output(TuneOutput)
        evaluate, register = record.output(EvaluateOutput), record.output(RegisterOutput)
        promote = record.output(PromoteOutput)
        batch, serve = record.output(BatchPredictOutput), record.output(ServeOutput)
        trained = train.to_json() if train else {}
        search = {k: v for k, v in tune.to_json().items() if k in _SEARCH} if tune else {}
        if tune is not None:
            search["study_run_id"] = tune.run_id
        return cls(
            spec=record.spec, target=record.target, run_id=trained.get("run_id"),
            experiment_id=trained.get("experiment_id"),
            tracking_uri=trained.get("tracking_uri"), model_uri=trained.get("model_uri"),
            model_name=register.name if register else None,
            model_version=register.version if register else None,
            aliases_set=promote.aliases_set() if promote else {},
            previous_alias_holder=promote.previous if promote else None,
            promotion=promote.decision if promote else None,
            deployment_job=promote.deployment_job if promote else None,
            gates=list(promote.gates) if promote else [],
            metrics=dict(evaluate.metrics) if evaluate else {}, search=search,
            training={k: v for k, v in trained.items() if k in _TRAINING},
            diagnosis=list(trained.get("diagnosis", [])),
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
        ran = [s.name for s in self.stages if s.action == "ran"]
        cached = [s.name for s in self.stages if s.action == "cached"]
        rows = [("stages run", ", ".join(ran) or "none (all unchanged)")]
        rows += [("stages cached", ", ".join(cached))] if cached else []
        rows += [(label, value) for label, value in (
            ("MLflow run", self.run_id), ("experiment", self.experiment_id),
            ("tracking URI", self.tracking_uri)) if value]
        if self.model_name:
            rows.append(("model version", f"{self.model_name} v{self.model_version}"))
        if self.promotion:
            moved = ", ".join(f"@{a} -> v{v}" for a, v in self.aliases_set.items())
            job = f" to deployment job {self.deployment_job}" if self.deployment_job else ""
            rows.append(("promotion", self.promotion + job + (f" ({moved})" if moved else "")))
            rows += [("  gate", gate) for gate in self.gates]
        rows += self._outcome_rows()
        if self.training:
            rows.append(("training", _training_row(self.training)))
        curve = self.learning_curve
        if curve:
            rows.append(("learning curves", f"{curve['label']}: {curve['reason']}"
                         + "".join(f"; {note}" for note in curve.get("notes", []))))
        rows += [("" if i else "diagnosis", finding) for i, finding in enumerate(self.diagnosis)]
        rows += [(name, f"{value:.6g}") for name, value in sorted(self.metrics.items())
                 if name.startswith("test_")]
        width = max(len(label) for label, _ in rows)
        title = f"dbspec run {self.spec}" + (f" --target {self.target}" if self.target else "")
        return "\n".join([title] + [f"  {label.ljust(width)}  {value}" for label, value in rows])

    def _outcome_rows(self) -> list[tuple[str, str]]:
        """What the run left behind besides the model: predictions, serving, search."""
        rows: list[tuple[str, str]] = []
        batch, serve, search = self.batch_predict, self.serve, self.search
        if batch:
            written = f"Delta v{batch['output_version']}" \
                if batch.get("output_version") is not None else batch["format"]
            rows.append(("predictions", f"{batch['rows']:,} rows -> {batch['output']} "
                                        f"({written}) with {batch['model_uri']} "
                                        f"(v{batch['model_version']})"))
        if serve.get("problem"):
            rows.append(("serving", serve["problem"]))
        elif serve:
            rows.append(("serving", f"{serve['model_uri']} (v{serve['model_version']}) answers; "
                                    f"start it with: {serve['command']}"))
        if search:
            trials = ", ".join(f"{v} {k}" for k, v in search["trials"].items())
            params = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                               for k, v in search["best_params"].items())
            rows += [("search", f"study {search['study_name']} ({trials}; "
                                f"{search['epochs_trained']} epochs trained)"),
                     ("  storage", search["storage"]),
                     ("  best", f"{search['metric']}={search['best_value']:.6g} (trial "
                                f"{search['best_trial']}): {params}")]
        return rows


def _training_row(training: dict[str, Any]) -> str:
    """Epochs, throughput, device; the batch size and ranks when they are recorded."""
    text = (f"{training.get('epochs_run')} epochs (best {training.get('best_epoch')}), "
            f"{training.get('train_samples_per_second', 0):,.0f} samples/s on "
            f"{training.get('device')} x{training.get('threads')} threads")
    if training.get("batch_size"):
        text += f", batch size {training['batch_size']}"
    if training.get("trained_parameters"):
        text += (f", trained {training['trained_parameters']:,} of "
                 f"{training['parameters']:,} parameters")
    if training.get("world_size"):
        placement = f", {training['placement']}" if training.get("placement") else ""
        text += f", {training['world_size']} ranks ({training['backend']}{placement})"
    return text
