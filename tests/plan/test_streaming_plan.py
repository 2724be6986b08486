"""What a ``data.streaming`` spec's plan hashes: the shards' identity reaches ``load_data``."""

from __future__ import annotations

from dbspec.plan import compile_plan
from dbspec.spec import load_spec
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


def test_where_and_when_shards_are_read_does_not_retrain(write_spec):
    base = _fingerprints(write_spec, STREAMED)
    moved = _fingerprints(write_spec, STREAMED.replace(
        "{enabled: true}", "{enabled: true, prefetch: 3, cache_dir: /tmp/c, location: /tmp/l}"))
    assert moved == base
