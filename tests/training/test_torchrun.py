"""The torchrun launcher's error paths (AI Runtime's ranks; the runs themselves are in
tests/jobs/test_ai_runtime.py): several nodes without a meeting place, and a rank that fails."""

from __future__ import annotations

import pytest

from dbspec.training.job import DistributedError
from dbspec.training.torchrun import run_torchrun, torchrun_command


def test_several_nodes_without_a_rendezvous_are_refused_before_any_launch(tmp_path,
                                                                         monkeypatch):
    monkeypatch.setenv("NUM_NODES", "2")
    monkeypatch.delenv("DBSPEC_RENDEZVOUS", raising=False)
    with pytest.raises(DistributedError, match="2 nodes but no DBSPEC_RENDEZVOUS"):
        run_torchrun(tmp_path, 1, say=lambda text: None)


def test_the_command_joins_the_other_nodes_only_when_there_are_some(tmp_path, monkeypatch):
    monkeypatch.delenv("NUM_NODES", raising=False)
    assert "--standalone" in torchrun_command(tmp_path, 2)
    monkeypatch.setenv("NUM_NODES", "3")
    joined = torchrun_command(tmp_path, 8)
    assert "--nnodes=3" in joined and "--node_rank=${NODE_RANK}" in joined
    assert joined[-3:] == ["-m", "dbspec.training.rank", str(tmp_path)]


@pytest.mark.slow
def test_a_failing_rank_fails_the_launch_with_its_error(tmp_path, monkeypatch):
    monkeypatch.delenv("NUM_NODES", raising=False)
    with pytest.raises(DistributedError, match=r"torchrun failed \(exit 1\): rank-0: "):
        run_torchrun(tmp_path, 1, say=lambda text: None)  # no job.json: the rank fails
