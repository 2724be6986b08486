"""The typed records at the seams (issue 16): stage outputs, stage state entries and the run
summary read state recorded by the version before them and write it back unchanged, so a run
resumes across the upgrade and its stage cache stays valid."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from dbspec.executors.cache import entry_identity
from dbspec.executors.records import RunRecord, StageRecord
from dbspec.executors.records import RunState, StageEntry
from dbspec.executors.summary import RunSummary
from dbspec.stages.outputs import (OUTPUTS, OutputError, PromoteOutput, ServeOutput,
                                   TrainOutput, TuneOutput)

#: state.json of a smoke-free diabetes run written by the version before these records, with
#: a study and a batch scoring in that version's format added.
PREVIOUS = Path(__file__).parent / "data" / "state_before_records.json"


@pytest.fixture
def previous() -> dict:
    return json.loads(PREVIOUS.read_text())


def test_state_of_the_previous_version_round_trips_unchanged(previous):
    state = RunState.from_json(copy.deepcopy(previous))
    assert state.to_json() == previous
    for name, entry in state.stages.items():
        assert entry.done and entry.fingerprint == previous["stages"][name]["fingerprint"]
        assert entry_identity(entry.to_json()) == entry_identity(previous["stages"][name])
        output = OUTPUTS[name].from_json(entry.output)
        assert output.to_json() == previous["stages"][name]["output"], name


def test_outputs_read_typed(previous):
    stages = previous["stages"]
    train = TrainOutput.from_json(stages["train"]["output"])
    assert train.run_id == stages["train"]["output"]["run_id"] and train.parameters == 385
    assert train.world_size is None and "world_size" not in train.to_json()
    assert PromoteOutput.from_json(stages["promote"]["output"]).decision == "promoted"
    assert ServeOutput.from_json(stages["serve"]["output"]).checked_rows == 8
    assert TuneOutput.from_json(stages["tune"]["output"]).best_params == \
        {"training.optimizer.lr": 0.01}


def test_older_outputs_take_defaults_for_later_fields(previous):
    """A train output from before the observability fields, a study from before
    search.final_model."""
    train = dict(previous["stages"]["train"]["output"])
    del train["diagnosis"], train["gpu_monitoring"]
    assert TrainOutput.from_json(train).gpu_monitoring == "off"
    tune = dict(previous["stages"]["tune"]["output"])
    del tune["final_model"], tune["trials_dir"], tune["epochs_trained"]
    assert TuneOutput.from_json(tune).final_model == "retrain"


def test_an_output_lacking_a_needed_field_says_how_to_remake_it(previous):
    train = dict(previous["stages"]["train"]["output"])
    del train["model_uri"], train["run_id"]
    with pytest.raises(OutputError, match=r"recorded output of stage 'train' has no run_id, "
                                          r"model_uri .* dbspec run SPEC --from train"):
        TrainOutput.from_json(train)


def test_entries_without_the_cache_fields_read_as_unset():
    """An entry from before the stage cache (no chain, no inputs) and a running entry."""
    old = {"fingerprint": "abc", "status": "done", "output": {"steps": []}, "seconds": 1.0}
    entry = StageEntry.from_json(old)
    assert entry.chain is None and entry.inputs is None and entry.to_json() == old
    running = StageEntry("abc", "running", chain="abc")
    assert running.to_json() == {"fingerprint": "abc", "status": "running", "output": {},
                                 "chain": "abc"}
    assert StageEntry.from_json({**old, "used": 1.0}).to_json() == old  # the cache's mark


def test_the_summary_keeps_its_json_shape(previous, tmp_path):
    stages = [StageRecord(name, "cached", 0.0, entry["output"])
              for name, entry in previous["stages"].items()]
    summary = RunSummary.of(RunRecord("diabetes-regressor", "dev", tmp_path, stages))
    data = json.loads(json.dumps(summary.to_json()))
    assert list(data) == ["spec", "target", "run_id", "experiment_id", "tracking_uri",
                          "model_uri", "model_name", "model_version", "aliases_set",
                          "previous_alias_holder", "promotion", "gates", "metrics", "search",
                          "training", "diagnosis", "learning_curve", "batch_predict", "serve",
                          "stages", "state_dir", "deployment_job"]  # new keys go last
    train, promote = previous["stages"]["train"]["output"], previous["stages"]["promote"]["output"]
    assert data["run_id"] == train["run_id"] and data["promotion"] == "promoted"
    assert data["aliases_set"] == {promote["alias"]: promote["version"]}
    assert data["search"]["study_run_id"] == "5f1c0e7a"
    assert data["training"]["best_epoch"] == train["best_epoch"]
    assert data["stages"][0] == {"name": "load_data", "action": "cached", "seconds": 0.0}
    assert "dbspec run diabetes-regressor --target dev" in summary.render()


def test_a_run_key_state_entry_that_is_not_an_object_is_a_clear_error(tmp_path):
    from dbspec.executors.state import MlflowState, StateError

    state = MlflowState(tmp_path / "run", tracking_uri=f"sqlite:///{tmp_path / 'm.db'}",
                        experiment="records", key="k", tags={}, state_dir=tmp_path)
    (tmp_path / "train.json").write_text("[1, 2]")
    state.client.log_artifact(state.run_id, str(tmp_path / "train.json"), "dbspec/state")
    with pytest.raises(StateError, match="stage 'train' .* is not a JSON object"):
        state.load()
