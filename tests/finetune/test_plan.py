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


def test_a_checkpoint_rewritten_in_place_reruns_preprocess(tmp_path, monkeypatch):
    """The same path, other contents: a tokenizer changed (by content), large weights
    rewritten (by modification time); the spec alone does not show it."""
    import os
    import shutil

    from dbspec.spec.checkpoints import checkpoint_version

    checkpoint = tmp_path / "ckpt"
    shutil.copytree(ROOT / "specs" / "data" / "tiny_bert", checkpoint)
    monkeypatch.chdir(ROOT)
    loaded = apply_values(load_spec("specs/text_finetune.yaml"),
                          {"model.pretrained.checkpoint": str(checkpoint)})

    def fingerprints() -> dict[str, str]:
        plan = compile_plan(loaded.spec, checkpoint_version=checkpoint_version(loaded.spec))
        return {stage.name: stage.fingerprint for stage in plan}

    first = fingerprints()
    assert fingerprints() == first  # reading it changes nothing
    tokenizer = checkpoint / "tokenizer_config.json"
    tokenizer.write_text(tokenizer.read_text().replace("}", ', "model_max_length": 64}', 1))
    second = fingerprints()
    assert second["preprocess"] != first["preprocess"] and second["train"] != first["train"]
    assert second["split"] == first["split"]
    monkeypatch.setattr("dbspec.spec.checkpoints._READ_WHOLE", 1024)  # weights of gigabytes
    second = fingerprints()
    weights = checkpoint / "model.safetensors"
    stat = weights.stat()
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert fingerprints()["preprocess"] != second["preprocess"]
    # a hub id (the id and revision stand for it) and a Volume off Databricks hash nothing
    for elsewhere in ("someone/another-model", "/Volumes/main/models/ckpt"):
        assert checkpoint_version(apply_values(
            loaded, {"model.pretrained.checkpoint": elsewhere}).spec) is None
    shutil.rmtree(checkpoint)  # gone since validation: the run fails on it, located
    assert checkpoint_version(loaded.spec) is None


def test_run_and_plan_see_a_checkpoint_rewritten_in_place(tmp_path):
    """The executor and ``dbspec plan`` both hash the checkpoint: right after a run, plan finds
    the fingerprint the run recorded (cached); once the tokenizer changes under the same path,
    preprocess is stale and the split is not."""
    import json
    import shutil

    from tests.conftest import run_in_process

    checkpoint = tmp_path / "ckpt"
    shutil.copytree(ROOT / "specs" / "data" / "tiny_bert", checkpoint)
    spec = tmp_path / "spec.yaml"
    spec.write_text((ROOT / "specs" / "text_finetune.yaml").read_text()
                    .replace("specs/data/tiny_bert", str(checkpoint))
                    .replace("rows: 3000", "rows: 300"))
    result = run_in_process("run", str(spec), "--only", "load_data,split,preprocess", "-q",
                            cwd=tmp_path, env={"HF_HUB_OFFLINE": "1"}, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]

    def statuses() -> dict[str, str]:
        result = run_in_process("plan", str(spec), "--format", "json", cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        return {s["name"]: s["status"] for s in json.loads(result.stdout)["stages"]}

    assert statuses()["preprocess"] == "cached"
    tokenizer = checkpoint / "tokenizer_config.json"
    tokenizer.write_text(tokenizer.read_text().replace("}", ', "model_max_length": 64}', 1))
    after = statuses()
    assert after["preprocess"] == "stale" and after["split"] == "cached"
