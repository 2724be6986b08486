"""The streaming example spec (``specs/sensor_streaming.yaml``) runs, in smoke mode, from a
project directory of its own (its Delta table is found relative to the working directory, as
the docs run it from the checkout)."""

from __future__ import annotations

import json
import re

from tests.conftest import ROOT, run_main as run


def test_the_streaming_example_runs_in_smoke_mode(workdir):
    (workdir / "specs").symlink_to(ROOT / "specs")
    code, out, err = run("run", "specs/sensor_streaming.yaml", "--smoke", "--summary-json",
                         "s.json")
    assert code == 0, err
    assert "data: streamed from shards (data.streaming.enabled: true)" in err
    assert re.search(r"converted 1,000 rows into \d+ shards", err)
    summary = json.loads((workdir / "s.json").read_text())
    assert summary["training"]["epochs_run"] == 1
    assert summary["model_name"] == "sensor_failures_smoke"
    shard_sets = list((workdir / ".dbspec" / "shards").glob("shards-*"))
    assert len(shard_sets) == 1 and (shard_sets[0] / "index.json").exists()
    # a rerun of an unchanged spec and table reuses the set instead of converting again
    code, _, err = run("run", "specs/sensor_streaming.yaml", "--smoke", "--from", "load_data")
    assert code == 0, err
    assert "reusing the shards of delta-v1" in err


def test_gc_removes_shard_sets_no_run_names(workdir):
    (workdir / "specs").symlink_to(ROOT / "specs")
    code, _, err = run("run", "specs/sensor_streaming.yaml", "--smoke", "--only", "load_data")
    assert code == 0, err
    folder = workdir / ".dbspec" / "shards"
    (kept,) = folder.glob("shards-*")
    for leftover in ("shards-0123456789abcdef", ".partial-0123456789abcdef-00000000"):
        (folder / leftover / "train").mkdir(parents=True)
        (folder / leftover / "train" / "shard-00000-00000.arrow").write_bytes(b"x" * 1000)
    code, out, _ = run("gc", "--dry-run")
    assert code == 0 and "would remove .dbspec/shards/shards-0123456789abcdef" in out
    assert (folder / "shards-0123456789abcdef").exists()  # a dry run deletes nothing
    code, out, _ = run("gc")
    assert code == 0
    assert re.search(r"removed \.dbspec/shards/shards-0123456789abcdef \(1000 B, unreferenced\)",
                     out)
    assert "removed .dbspec/shards/.partial-0123456789abcdef-00000000" in out
    assert sorted(p.name for p in folder.iterdir()) == [kept.name]  # the run's own set stays
