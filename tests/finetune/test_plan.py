"""The plan of a pretrained spec (issue 36): ``preprocess`` fits the checkpoint's tokenizer, so
another checkpoint re-encodes the text (before, only ``train`` reran: ids of the old
tokenizer went into the new model)."""

from __future__ import annotations

from dbspec.plan import compile_plan
from dbspec.spec import apply_values, load_spec
from tests.conftest import ROOT


def test_another_checkpoint_reruns_preprocess(monkeypatch):
    monkeypatch.chdir(ROOT)
    loaded = load_spec("specs/text_finetune.yaml")
    before = compile_plan(loaded.spec)
    after = compile_plan(apply_values(
        loaded, {"model.pretrained.checkpoint": "someone/another-model"}).spec)
    changed = {a.name for a, b in zip(before, after) if a.fingerprint != b.fingerprint}
    assert {"preprocess", "train"} <= changed and "split" not in changed
    rank = compile_plan(apply_values(loaded, {"model.pretrained.finetune.rank": 4}).spec)
    assert {a.name for a, b in zip(before, rank) if a.fingerprint != b.fingerprint} \
        .isdisjoint({"load_data", "split", "preprocess"})
