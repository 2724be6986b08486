"""``build_stage``: a planned stage to its implementation (one small module per stage kind)."""

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
    from dbspec.stages.serving import BatchPredictStage, ServeStage
    from dbspec.stages.train import TrainStage
    from dbspec.stages.tune import TuneStage

    kinds = {cls.name: cls for cls in (LoadDataStage, SplitStage, PreprocessStage, TuneStage,
                                       TrainStage, EvaluateStage, RegisterStage, PromoteStage,
                                       BatchPredictStage, ServeStage)}
    if planned.name not in kinds:
        raise DbspecError(f"stage '{planned.name}' has no implementation in this version of "
                          "dbspec")
    return TuneStage(planned.fingerprint) if planned.name == TuneStage.name \
        else kinds[planned.name]()
