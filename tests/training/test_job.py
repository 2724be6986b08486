"""The records the driver and the ranks of a distributed training exchange, through files."""

from __future__ import annotations

import json

import pytest

from dbspec.models.served import ModelCard
from dbspec.spec.sections import Spec
from dbspec.tracking.metrics import TrackingTarget
from dbspec.training.job import (
    DistributedError,
    RankJob,
    RankReport,
    RankResult,
    rank_errors,
    record_rank_failure,
)
from dbspec.training.loop import TrainOutcome


def spec() -> Spec:
    return Spec.model_validate({
        "name": "job", "data": {"source": {"kind": "sklearn", "name": "diabetes"},
                                "task": "regression"},
        "model": {"layers": [{"linear": {"out": 1}}]},
        "compute": {"kind": "torch_distributor", "num_processes": 2}})


def card() -> ModelCard:
    return ModelCard(task="regression", loss="mse", feature_names=["a", "b"], out_features=1,
                     model={"kind": "mlp"}, preprocessing=[], target_mean=1.5, target_std=2.0)


def test_a_job_reads_back_as_written(tmp_path):
    job = RankJob(spec=spec(), card=card(), backend="gloo", use_gpu=False, epochs=3,
                  resume=True, tracking=TrackingTarget("sqlite:///x.db", "abc"),
                  checkpoint_dir=tmp_path / "checkpoints")
    job.write(tmp_path)
    assert RankJob.read(tmp_path) == job
    untracked = RankJob(spec=spec(), card=card(), backend="nccl", use_gpu=True,
                        deepspeed={"zero_optimization": {"stage": 2}})
    untracked.write(tmp_path)
    assert RankJob.read(tmp_path) == untracked


def test_a_missing_job_says_where_it_looked(tmp_path):
    with pytest.raises(DistributedError, match="job.json: no job file .*is the work directory"):
        RankJob.read(tmp_path)


def test_a_job_from_another_dbspec_is_a_clear_error(tmp_path):
    (tmp_path / "job.json").write_text(json.dumps({"spec": {}, "card": {}}))
    with pytest.raises(DistributedError, match="not a job this dbspec can read .*same dbspec"):
        RankJob.read(tmp_path)


def test_rank_zero_s_result_reads_back_and_its_absence_is_none(tmp_path):
    assert RankResult.read(tmp_path) is None
    outcome = TrainOutcome([{"train_loss": 0.5}], 0, 0.5, False, 1, 100.0, None,
                           extra={"not": "written"})
    RankResult(outcome, 2, "gloo", ("cpu-bound",)).write(tmp_path)
    result = RankResult.read(tmp_path)
    assert result.outcome == TrainOutcome([{"train_loss": 0.5}], 0, 0.5, False, 1, 100.0)
    assert (result.world_size, result.backend, result.diagnosis) == (2, "gloo", ("cpu-bound",))
    assert result.with_placement("on Ray").placement == "on Ray"


def test_rank_reports_come_back_in_rank_order(tmp_path):
    for rank in (1, 0, 10):
        RankReport(rank, 5, 10.0, 1.0, 3.0).write(tmp_path)
    assert [r.rank for r in RankReport.read_all(tmp_path)] == [0, 1, 10]


def test_a_failed_rank_is_worded_from_its_record(tmp_path, capsys):
    try:
        raise RuntimeError("gloo timed out")
    except RuntimeError as exc:
        record_rank_failure(tmp_path, 1, exc)
    assert rank_errors(tmp_path) == "rank-1: RuntimeError: gloo timed out"
    assert "rank 1 failed: RuntimeError: gloo timed out" in capsys.readouterr().err
