"""``dbspec run`` and ``dbspec gc`` over a shard set whose index lies (issue 34).

Before: an index under-reporting a shard's rows trained on a fraction of the rows and exited 0;
one over-reporting them ended in an IndexError; a garbled one said "rerun load_data", which
failed the same way, and ``dbspec gc`` kept it. Now the cached ``load_data`` runs again and
converts the source again, ``--only train`` refuses the set naming the shard and both counts,
and ``gc`` removes it. Real runs in this process: a Delta table, the SQLite store.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from tests.conftest import run_main as run
from tests.data.test_streaming import rows_table, write_delta


@pytest.fixture
def project(workdir) -> Path:
    """A streamed regression spec over a 3,000-row Delta table; ``load_data`` has run."""
    write_delta(workdir / "table", rows_table(3000))
    spec = {"name": "lying", "data": {
        "source": {"kind": "delta", "path": "table"}, "task": "regression", "target": "y",
        "features": ["a", "b", "c"], "streaming": {"enabled": True}},
        "model": {"layers": [{"linear": {"out": 4}}, "relu", {"linear": {"out": 1}}]},
        "training": {"epochs": 1, "batch_size": 64, "num_threads": 1},
        "tracking": {"system_metrics": False}}
    (workdir / "spec.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    code, _, err = run("run", "spec.yaml", "--only", "load_data")
    assert code == 0, err
    return workdir


def shard_root(project: Path) -> Path:
    (root,) = (project / ".dbspec" / "shards").glob("shards-*")
    return root


def claim_rows(project: Path, rows: int) -> tuple[str, int]:
    """Make the index say the first training shard has ``rows`` rows; returns the shard's
    name and the rows it holds."""
    path = shard_root(project) / "index.json"
    index = json.loads(path.read_text())
    shard = index["splits"]["train"][0]
    held = shard["rows"]
    shard["rows"] = rows
    path.write_text(json.dumps(index))
    return shard["file"], held


def split_sizes(project: Path) -> dict[str, int]:
    state = json.loads((project / ".dbspec/runs/lying/state.json").read_text())
    return state["stages"]["split"]["output"]


@pytest.mark.parametrize("claimed", [100, 1_000_000], ids=["under", "over"])
def test_a_run_over_a_lying_index_converts_the_source_again(project, claimed):
    name, held = claim_rows(project, claimed)
    code, _, err = run("run", "spec.yaml")
    assert code == 0, err
    assert re.search(rf"! load_data: the shard set at .*shards-\w+ does not match its index"
                     rf"\.json: shard {re.escape(name)} holds {held:,} rows, the index says "
                     rf"{claimed:,}; running it again", err), err
    assert "converting the source again" in err and "converted 3,000 rows" in err
    assert sum(split_sizes(project).values()) == 3000  # every row, not the index's count


def test_only_train_refuses_a_lying_index_naming_the_shard_and_both_counts(project):
    code, _, err = run("run", "spec.yaml")
    assert code == 0, err
    name, held = claim_rows(project, 100)
    code, _, err = run("run", "spec.yaml", "--only", "train")
    assert code == 1
    assert re.search(rf"stage 'train' failed: data\.streaming: the shard set at .*shards-\w+ "
                     rf"does not match its index\.json: shard {re.escape(name)} holds "
                     rf"{held:,} rows, the index says 100; convert the source again: "
                     rf"dbspec run SPEC --from load_data", err), err
    assert "Traceback" not in err


def test_from_load_data_replaces_a_garbled_index(project):
    (shard_root(project) / "index.json").write_text("garbage")
    code, _, err = run("run", "spec.yaml", "--from", "load_data")
    assert code == 0, err
    assert "has no readable index.json: converting the source again" in err
    assert json.loads((shard_root(project) / "index.json").read_text())["rows"] == 3000


def test_gc_removes_a_broken_set_a_run_names_and_the_next_run_converts_again(project):
    root = shard_root(project)
    (root / "index.json").write_text("garbage")
    code, out, _ = run("gc")
    assert code == 0
    assert re.search(rf"removed \.dbspec/shards/{root.name} \([\d.]+ \w?B, broken: has no "
                     r"readable index\.json\)", out), out
    assert not root.exists()
    code, _, err = run("run", "spec.yaml")
    assert code == 0, err
    assert f"! load_data: the shard set at {root} has no readable index.json" in err
    assert sum(split_sizes(project).values()) == 3000
