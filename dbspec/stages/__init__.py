"""One small module per stage kind; ``build_stage`` maps a planned stage to its implementation."""

from __future__ import annotations

from dbspec.errors import DbspecError
from dbspec.plan import PlannedStage
from dbspec.stages.base import Stage


def build_stage(planned: PlannedStage) -> Stage:
    """The implementation of a planned stage.

    Raises:
        DbspecError: the stage kind has no local implementation yet.
    """
    from dbspec.stages.data import LoadDataStage, PreprocessStage, SplitStage
    from dbspec.stages.lifecycle import EvaluateStage, PromoteStage, RegisterStage
    from dbspec.stages.train import TrainStage
    from dbspec.stages.tune import TuneStage

    if planned.name == "tune":
        return TuneStage(planned.fingerprint)
    kinds = {cls.name: cls for cls in (LoadDataStage, SplitStage, PreprocessStage, TrainStage,
                                       EvaluateStage, RegisterStage, PromoteStage)}
    if planned.name not in kinds:
        raise DbspecError(f"stage '{planned.name}' is not available in this version of dbspec "
                          f"(it comes with the {_COMING[planned.name]})")
    return kinds[planned.name]()


_COMING = {"serve": "serving work (set serving.mode: none)",
           "batch_predict": "batch inference work (set serving.mode: none)"}
