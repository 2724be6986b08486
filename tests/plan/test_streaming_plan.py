"""What a ``data.streaming`` spec's plan hashes: the shards' identity reaches ``load_data``."""

from __future__ import annotations

from dbspec.plan import compile_plan
from dbspec.spec import load_spec
from tests.conftest import run_main

PLAIN = """\
name: streamed
data:
  source: {kind: sklearn, name: diabetes}
  task: regression
model: {layers: [{linear: {out: 1}}]}
"""
STREAMED = PLAIN.replace("  task: regression\n", "  task: regression\n  streaming: {enabled: true}\n")


def _fingerprints(write_spec, text: str) -> dict[str, str]:
    plan = compile_plan(load_spec(write_spec(text)).spec)
    return {stage.name: stage.fingerprint for stage in plan}


def test_streaming_settings_and_the_split_enter_load_data(write_spec):
    base = _fingerprints(write_spec, STREAMED)
    bigger = _fingerprints(write_spec, STREAMED.replace("{enabled: true}",
                                                        "{enabled: true, shard_size_mb: 64}"))
    assert bigger["load_data"] != base["load_data"]  # other shards
    assert bigger["train"] != base["train"]  # and everything after them
    reseeded = _fingerprints(write_spec, STREAMED.replace("  task:", "  split: {seed: 7}\n  task:"))
    assert reseeded["load_data"] != base["load_data"]  # the split is decided while converting


def test_without_streaming_the_split_does_not_rerun_load_data(write_spec):
    base = _fingerprints(write_spec, PLAIN)
    reseeded = _fingerprints(write_spec, PLAIN.replace("  task:", "  split: {seed: 7}\n  task:"))
    assert reseeded["load_data"] == base["load_data"]
    assert reseeded["split"] != base["split"]


def test_ranks_on_executors_without_a_shared_place_for_shards_warn(write_spec):
    path = write_spec(STREAMED + "compute: {kind: torch_distributor, num_processes: 2, "
                      "local_mode: false}\n")
    code, out, err = run_main("validate", path)
    assert code == 0
    assert "data.streaming.location" in out + err and "every node mounts" in out + err
