"""Regressions for problems a code review found in the run, search and registry paths."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

from dbspec.spec.sections.training import TrainingSpec
from dbspec.training.checkpoints import CheckpointStore
from dbspec.training.loop import Tensors, TrainOptions, train
from tests.conftest import ROOT
from tests.conftest import run_main as run

SPECS = ROOT / "specs"


def test_only_train_makes_the_next_run_redo_its_dependents(workdir):
    spec = str(SPECS / "diabetes.yaml")
    assert run("run", spec, "--smoke", "-q")[0] == 0
    assert run("run", spec, "--smoke", "-q", "--only", "train")[0] == 0
    code, out, _ = run("run", spec, "--smoke", "-q", "--summary-json", "s.json")
    ran = [s["name"] for s in json.loads((workdir / "s.json").read_text())["stages"]
           if s["action"] == "ran"]
    assert code == 0 and ran == ["evaluate", "register", "promote", "serve"]


def test_best_trial_model_survives_a_rerun_of_tune(workdir):
    text = (SPECS / "breast_cancer_search.yaml").read_text().replace(
        "  direction: minimize\n", "  direction: minimize\n  final_model: best_trial\n")
    (workdir / "s.yaml").write_text(text)
    assert run("run", "s.yaml", "--smoke", "-q")[0] == 0
    code, _, err = run("run", "s.yaml", "--smoke", "-q", "--from", "tune")
    assert code == 0, err


def test_missing_values_outside_the_training_rows_are_caught(workdir):
    rows = np.random.default_rng(0).normal(size=(60, 3))
    lines = ["a,b,y"] + [f"{r[0]},{r[1]},{r[2]}" for r in rows]
    lines[-1] = ",1.0,2.0"  # one missing value, wherever the split puts it
    (workdir / "rows.csv").write_text("\n".join(lines) + "\n")
    (workdir / "s.yaml").write_text(
        "name: nan\ndata: {source: {kind: csv, path: rows.csv}, task: regression, target: y,\n"
        "       preprocessing: [standard_scale]}\nmodel: {layers: [{linear: {out: 1}}]}\n")
    code, _, err = run("run", "s.yaml")
    assert code == 1 and "missing values in a" in err and "Traceback" not in err


def test_served_predictions_use_the_spec_threshold():
    from dbspec.models.served import ModelCard, ServedModel

    card = ModelCard(task="binary", loss="bce", feature_names=["a"], out_features=1,
                     model={"layers": [{"linear": {"out": 1}}]}, preprocessing=[],
                     classes=[0, 1], threshold=0.8)
    served = ServedModel(card).eval()
    with torch.no_grad():
        served.network[0].weight.fill_(1.0)
        served.network[0].bias.zero_()
    frame = served.predict_frame(np.array([[1.0]], dtype=np.float32))  # sigmoid(1) = 0.73
    assert frame["prediction"].tolist() == [0]


def test_rollback_steps_back_through_history(workdir):
    spec = str(SPECS / "diabetes.yaml")
    for _ in range(3):  # three versions, each promoted by hand below
        assert run("run", spec, "--smoke", "-q", "--from", "train")[0] == 0
    name = "diabetes_predictor_smoke"
    for version in ("1", "2", "3"):
        assert run("promote", name, version, "--alias", "prod", "--force")[0] == 0
    steps = []
    for _ in range(2):
        code, out, _ = run("rollback", name, "--alias", "prod")
        assert code == 0
        steps.append(out.split("-> v")[1].split()[0])
    assert steps == ["2", "1"]


def test_bad_alias_is_a_clear_error(workdir):
    # refused before any store is opened (MLflow itself would only say it cannot set @v3)
    code, _, err = run("promote", "diabetes_predictor_smoke", "1", "--alias", "v3", "--force")
    assert code == 1 and "'v3' is reserved by the MLflow registry" in err
    assert "Traceback" not in err


def test_resume_after_an_early_stop_does_not_train_on(tmp_path):
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(200, 4, generator=g), torch.randn(200, 1, generator=g)
    data = Tensors(x[:160], y[:160], x[160:], y[160:])
    spec = TrainingSpec.model_validate({"optimizer": {"name": "sgd", "lr": 0.5}, "epochs": 50,
                                        "early_stopping": {"patience": 2}})
    store = CheckpointStore(tmp_path)
    torch.manual_seed(0)
    first = train(nn.Linear(4, 1), data, spec, loss="mse", device=torch.device("cpu"),
                  options=TrainOptions(checkpoints=store))
    assert first.stopped_early
    torch.manual_seed(0)
    again = train(nn.Linear(4, 1), data, spec, loss="mse", device=torch.device("cpu"),
                  options=TrainOptions(checkpoints=store, resume=True))
    assert again.epochs_run == first.epochs_run


def test_a_single_row_batch_with_batch_norm_trains(tmp_path):
    x, y = torch.randn(33, 4), torch.randn(33, 1)
    network = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 1))
    spec = TrainingSpec.model_validate({"epochs": 2, "batch_size": 32})
    outcome = train(network, Tensors(x, y), spec, loss="mse", device=torch.device("cpu"))
    assert outcome.epochs_run == 2


def test_registry_commands_without_a_store_say_what_to_do(workdir):
    code, _, err = run("models", "anything")
    assert code == 1 and "no tracking store at" in err and "run a spec first" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a GPU-less machine")
@pytest.mark.parametrize("setting, message", [
    ("compute={kind: single_gpu}", "compute.kind single_gpu: no CUDA GPU is visible"),
    ("compute={kind: local, device: cuda}", "compute.device cuda: no CUDA GPU is visible"),
])
def test_asking_for_a_missing_gpu_fails_the_train_stage_clearly(workdir, setting, message):
    code, _, err = run("run", str(SPECS / "diabetes.yaml"), "--smoke", "-q", "--set", setting)
    assert code == 1 and f"stage 'train' failed: {message}" in err
    assert "Traceback" not in err


def test_a_named_study_refuses_a_changed_search(workdir):
    spec = str(SPECS / "breast_cancer_search.yaml")
    named = ["--set", "search.study_name=fixed", "--smoke", "-q"]
    assert run("run", spec, *named)[0] == 0
    code, _, err = run("run", spec, *named, "--set", "search.sampler.name=random")
    assert code == 1 and "was made for a different search" in err
