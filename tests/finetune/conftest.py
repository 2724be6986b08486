"""The smoke run of ``specs/text_finetune.yaml``, once per session (the run tests and the
serving tests share it: one xdist group, ``tests/conftest.py``)."""

from __future__ import annotations

import pytest

from tests.conftest import ROOT, run_in_process


@pytest.fixture(scope="session")
def finetuned(tmp_path_factory):
    """The smoke run of the shipped spec in a project directory of its own: (the directory,
    what the run printed on stderr)."""
    project = tmp_path_factory.mktemp("finetune")
    (project / "specs").symlink_to(ROOT / "specs")
    # the store named: a MLFLOW_TRACKING_URI another test left in this worker must not win
    result = run_in_process("run", "specs/text_finetune.yaml", "--smoke", "--summary-json",
                            "s.json", "--tracking-uri", f"sqlite:///{project}/.dbspec/mlflow.db",
                            cwd=project, env={"HF_HUB_OFFLINE": "1"}, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    return project, result.stderr
