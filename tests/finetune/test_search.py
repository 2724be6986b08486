"""The search section over fine-tuning settings (issue 36): learning rate and LoRA rank."""

from __future__ import annotations

import json

import pytest

from tests.conftest import ROOT, run_in_process

SEARCH = """\
search:
  n_trials: 2
  sampler: random
  pruner: none
  space:
    training.optimizer.lr: {float: [0.0005, 0.01], log: true}
    model.pretrained.finetune.rank: {int: [2, 8]}
"""


def test_the_learning_rate_and_the_lora_rank_validate_as_a_search_space(tmp_path):
    (tmp_path / "specs").symlink_to(ROOT / "specs")
    (tmp_path / "s.yaml").write_text((ROOT / "specs" / "text_finetune.yaml").read_text()
                                     + SEARCH)
    result = run_in_process("validate", "s.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
def test_a_search_over_the_lora_rank_runs(tmp_path):
    (tmp_path / "specs").symlink_to(ROOT / "specs")
    (tmp_path / "s.yaml").write_text((ROOT / "specs" / "text_finetune.yaml").read_text()
                                     .replace("rows: 3000", "rows: 400") + SEARCH)
    result = run_in_process("run", "s.yaml", "--smoke", "--only", "load_data,split,preprocess,"
                            "tune", "--summary-json", "s.json", cwd=tmp_path,
                            env={"HF_HUB_OFFLINE": "1"}, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "s.json").read_text())
    search = summary["search"]
    assert search["trials"]["complete"] == 2, search
    assert 2 <= search["best_params"]["model.pretrained.finetune.rank"] <= 8
    assert 0.0005 <= search["best_params"]["training.optimizer.lr"] <= 0.01
