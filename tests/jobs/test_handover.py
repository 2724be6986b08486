"""``dbspec run --only ... --run-key K``: job tasks as separate processes, each with its own
empty state dir, handing stages over through MLflow alone (as tasks on separate clusters)."""

from __future__ import annotations

import json

from tests.conftest import ROOT, run_cli

SPEC = str(ROOT / "specs" / "diabetes_batch.yaml")
TASKS = [["load_data,split,preprocess"], ["train"], ["evaluate", "register"], ["promote"],
         ["batch_predict"]]


def test_tasks_in_separate_processes_hand_over_through_mlflow(tmp_path):
    (tmp_path / "specs" / "data").mkdir(parents=True)
    (tmp_path / "specs" / "data" / "diabetes_scoring.parquet").write_bytes(
        (ROOT / "specs" / "data" / "diabetes_scoring.parquet").read_bytes())
    env = {"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'tracking.db'}"}
    for i, only in enumerate(TASKS):
        args = [a for name in only for a in ("--only", name)]
        result = run_cli("run", SPEC, "--smoke", "-q", *args, "--run-key", "job-7", "--state-dir",
                         str(tmp_path / f"task{i}"), "--summary-json", f"task{i}.json",
                         cwd=tmp_path, env=env)
        assert result.returncode == 0, (only, result.stderr)
    last = json.loads((tmp_path / "task4.json").read_text())
    assert [s["name"] for s in last["stages"] if s["action"] == "ran"] == ["batch_predict"]
    assert last["batch_predict"]["rows"] == 442
    assert last["model_name"] == "diabetes_batch_smoke" and last["model_version"] == "1"
    first = json.loads((tmp_path / "task1.json").read_text())
    assert last["run_id"] == first["run_id"]  # the training run, found through the key
    # the train task fetched its inputs from MLflow into its own, otherwise empty, state dir
    fetched = sorted(p.name for p in (tmp_path / "task1").glob("runs/*/key-job-7/stages/*"))
    assert fetched == ["load_data", "preprocess", "split", "train"]

def test_a_task_whose_inputs_were_never_produced_is_a_usage_error(tmp_path):
    env = {"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'tracking.db'}"}
    result = run_cli("run", SPEC, "--smoke", "--only", "train", "--run-key", "job-8", cwd=tmp_path,
                     env=env)
    assert result.returncode == 2
    assert "--only train: the output of 'load_data' is missing or stale" in result.stderr


def test_an_empty_run_key_is_refused(tmp_path):
    result = run_cli("run", SPEC, "--run-key", " ", cwd=tmp_path)
    assert result.returncode == 2 and "--run-key must not be empty" in result.stderr
