"""Edge cases of a run's stages: what an --only run leaves for the next, data that fails
outside the training rows, and hardware the spec asks for but the machine lacks."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

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


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a GPU-less machine")
@pytest.mark.parametrize("setting, message", [
    ("compute={kind: single_gpu}", "compute.kind single_gpu: no CUDA GPU is visible"),
    ("compute={kind: local, device: cuda}", "compute.device cuda: no CUDA GPU is visible"),
])
def test_asking_for_a_missing_gpu_fails_the_train_stage_clearly(workdir, setting, message):
    code, _, err = run("run", str(SPECS / "diabetes.yaml"), "--smoke", "-q", "--set", setting)
    assert code == 1 and f"stage 'train' failed: {message}" in err
    assert "Traceback" not in err
