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


def test_the_plan_names_the_checkpoint_and_the_method_not_encoders():
    from tests.conftest import run_in_process

    result = run_in_process("plan", "specs/text_finetune.yaml", cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert "model: pretrained specs/data/tiny_bert, LoRA (rank 8, alpha 16) on " \
           "word_embeddings, query, value; it reads text (text (checkpoint tokenizer, 48 tokens))" in result.stdout
    assert "encoder" not in result.stdout
