"""What each stage hands to the stages after it: one frozen record per stage kind.

The executor stores a stage's record as JSON in its state entry; later stages and the run
summary read it back typed. :meth:`StageOutput.to_json` and :meth:`StageOutput.from_json` are
the only place a record becomes JSON or is read from it. Re-recording a record read from JSON
must not change it: the stage cache identifies an entry by a digest of its output.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar, Mapping, Optional, TypeVar

from dbspec.errors import DbspecError

O = TypeVar("O", bound="StageOutput")


class OutputError(DbspecError):
    """A recorded stage output lacks what this version of dbspec needs from it."""


def _omitted_when_none() -> Any:
    """A field left out of the JSON while it is None."""
    return field(default=None, metadata={"omit_none": True})


@dataclass(frozen=True)
class StageOutput:
    """The base of every stage's record; ``stage`` names the stage that writes it."""

    stage: ClassVar[str] = ""

    def to_json(self) -> dict[str, Any]:
        """The JSON object recorded for the stage (fields in order, unset optional keys out)."""
        return {item.name: getattr(self, item.name) for item in fields(self)
                if getattr(self, item.name) is not None or not item.metadata.get("omit_none")}

    @classmethod
    def from_json(cls: type[O], data: Mapping[str, Any]) -> O:
        """The record of a recorded output; keys this version does not know are ignored.

        Raises:
            OutputError: a key without a default is missing (an output this version cannot
                use): the message says how to make it again.
        """
        known = {item.name: item for item in fields(cls)}
        missing = [name for name, item in known.items() if name not in data
                   and item.default is MISSING and item.default_factory is MISSING]
        if missing:
            raise OutputError(f"the recorded output of stage '{cls.stage}' has no "
                              f"{', '.join(missing)} (recorded by another version of dbspec?); "
                              f"run the stage again: dbspec run SPEC --from {cls.stage}")
        return cls(**{name: data[name] for name in known if name in data})


@dataclass(frozen=True)
class LoadDataOutput(StageOutput):
    """``load_data``: the table's shape and where it came from.

    Attributes:
        classes: Original labels (index = encoded class); None for regression.
        data_version: The source's version (``delta-v3``, a file digest...).
        shards: The shard set's directory when the data streams (``data.streaming``), else
            None (the rows are in the stage's ``table.npz``).
        features: With typed features (text, images...): every feature's spec, its type
            resolved (``raw.parquet`` holds their columns); None when all are numeric.
    """

    stage: ClassVar[str] = "load_data"
    rows: int
    feature_names: list[str]
    classes: Optional[list[Any]]
    data_version: str
    uri: str
    shards: Optional[str] = _omitted_when_none()
    features: Optional[list[dict[str, Any]]] = _omitted_when_none()


@dataclass(frozen=True)
class SplitOutput(StageOutput):
    """``split``: rows in each split."""

    stage: ClassVar[str] = "split"
    train: int
    validation: int
    test: int


@dataclass(frozen=True)
class PreprocessOutput(StageOutput):
    """``preprocess``: the kinds of the fitted steps, in order."""

    stage: ClassVar[str] = "preprocess"
    steps: list[str]


@dataclass(frozen=True)
class TuneOutput(StageOutput):
    """``tune``: the Optuna study (``storage`` is its URL, ``run_id`` its parent MLflow run)
    and its best trial.

    Attributes:
        best_params: The best trial's parameters, as ``--set`` paths.
        trials: Counts of complete, pruned and failed trials.
        final_model: ``retrain`` or ``best_trial`` (train reuses the trial's model, kept in
            ``trials_dir``).
    """

    stage: ClassVar[str] = "tune"
    study_name: str
    storage: str
    run_id: str
    best_value: float
    best_params: dict[str, Any]
    best_trial: int
    trials: dict[str, int]
    metric: str
    # recorded since search.final_model (a study recorded before read as "retrain")
    final_model: str = "retrain"
    trials_dir: str = ""
    epochs_trained: int = 0


@dataclass(frozen=True)
class TrainOutput(StageOutput):
    """``train``: the MLflow run and logged model, and how training went.

    Attributes:
        model_uri: The logged model (``models:/m-...``).
        resumed_from_epoch: The checkpoint's epoch a resumed training started from.
        threads: Torch intra-op threads.
        best_epoch: The epoch kept (1-based).
        diagnosis: Findings about the run (bottlenecks, advice).
        gpu_monitoring: ``available``, ``off``, or why GPUs are not monitored.
        batch_size: The batch size, when it differs from the spec's (an automatic retry).
        world_size, backend, placement: Of a distributed training: its ranks, process-group
            backend and where the ranks ran, in words.
    """

    stage: ClassVar[str] = "train"
    run_id: str
    experiment_id: str
    tracking_uri: str
    model_uri: str
    resumed_from_epoch: Optional[int]
    stopped_early: bool
    device: str
    threads: int
    parameters: int
    best_epoch: int
    epochs_run: int
    train_samples_per_second: float
    diagnosis: list[str] = field(default_factory=list)
    gpu_monitoring: str = "off"
    batch_size: Optional[int] = _omitted_when_none()
    world_size: Optional[int] = _omitted_when_none()
    backend: Optional[str] = _omitted_when_none()
    placement: Optional[str] = _omitted_when_none()
    #: Parameters training updated, when fewer than ``parameters`` (LoRA, frozen layers)
    trained_parameters: Optional[int] = _omitted_when_none()


@dataclass(frozen=True)
class EvaluateOutput(StageOutput):
    """``evaluate``: metrics (``val_*``, ``test_*``), plot file names, confusion matrix."""

    stage: ClassVar[str] = "evaluate"
    metrics: dict[str, float]
    plots: list[str] = field(default_factory=list)
    confusion_matrix: Optional[list[list[int]]] = _omitted_when_none()
    #: The learning-curve label (``overfitting``, ``underfitting``, ``converged``...).
    diagnosis: Optional[str] = _omitted_when_none()
    #: :meth:`dbspec.evaluation.curves.CurveDiagnosis.to_json` of the run.
    learning_curve: Optional[dict[str, Any]] = _omitted_when_none()


@dataclass(frozen=True)
class RegisterOutput(StageOutput):
    """``register``: the registry version made, or adopted from an interrupted register."""

    stage: ClassVar[str] = "register"
    name: str
    version: str
    adopted: bool = False


@dataclass(frozen=True)
class PromoteOutput(StageOutput):
    """``promote``: the gates' verdict on the version and where the alias went.

    Attributes:
        alias: The promotion alias (with stages: the last stage entered).
        decision: ``promoted``, ``rejected``, ``awaiting_approval`` (stopped at a stage that
            requires approval), or ``deferred`` (left to the model's deployment job).
        previous: The holder the alias moved from, when it moved.
        gates: Each gate's result in words (every stage entered).
        passed: Whether every gate passed.
        stages: Per stage entered, in order: ``{alias, outcome, moved, previous, gates}``,
            ``outcome`` one of ``promoted`` (the alias is the version's), ``awaiting_approval``,
            ``rejected``.
    """

    stage: ClassVar[str] = "promote"
    name: str
    version: str
    alias: str
    decision: str
    previous: Optional[str]
    gates: list[str]
    passed: bool
    stages: Optional[list[dict[str, Any]]] = _omitted_when_none()
    deployment_job: Optional[str] = _omitted_when_none()  # the job id, when ``deferred``

    def aliases_set(self) -> dict[str, str]:
        """``{alias: version}`` of every alias this promotion gave the version."""
        if not self.stages:
            return {self.alias: self.version} if self.decision == "promoted" else {}
        return {s["alias"]: self.version for s in self.stages if s["outcome"] == "promoted"}


@dataclass(frozen=True)
class BatchPredictOutput(StageOutput):
    """``batch_predict``: what was scored with which version, and where it was written."""

    stage: ClassVar[str] = "batch_predict"
    rows: int
    output: str
    format: str
    model_uri: str
    model_version: str
    output_version: Optional[int] = None
    input_version: Optional[str] = None
    out_of_range_rows: int = 0  # recorded since the training-range check


@dataclass(frozen=True)
class ServeOutput(StageOutput):
    """``serve``: the version an endpoint would serve and the command that starts it, or,
    when nothing can be served (a rejected first model), why."""

    stage: ClassVar[str] = "serve"
    model_uri: Optional[str]
    model_version: Optional[str]
    command: str
    checked_rows: Optional[int] = _omitted_when_none()
    problem: Optional[str] = _omitted_when_none()


#: Every stage's record, by stage name.
OUTPUTS: dict[str, type[StageOutput]] = {
    kind.stage: kind for kind in (LoadDataOutput, SplitOutput, PreprocessOutput, TuneOutput,
                                  TrainOutput, EvaluateOutput, RegisterOutput, PromoteOutput,
                                  BatchPredictOutput, ServeOutput)}
