"""``model.pretrained`` at ``dbspec validate`` (issue 36): what the spec and a local checkpoint
show without loading weights, as located errors; the same spec on every multi-GPU kind."""

from __future__ import annotations

import json
import shutil
import struct

import pytest

from dbspec.spec.checkpoints import CheckpointError, read_checkpoint
from tests.conftest import ROOT, run_in_process

SPEC = (ROOT / "specs" / "text_finetune.yaml").read_text()
TINY = ROOT / "specs" / "data" / "tiny_bert"


def validate(tmp_path, text: str) -> tuple[int, str]:
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    result = run_in_process("validate", str(path), cwd=ROOT)
    printed = result.stdout + result.stderr
    assert "Traceback" not in printed
    return result.returncode, printed


def line_col(text: str, needle: str) -> str:
    """``line:col`` (1-based) of the first ``needle`` in ``text``."""
    for number, line in enumerate(text.splitlines(), 1):
        if needle in line:
            return f"{number}:{line.index(needle) + 1}"
    raise AssertionError(needle)


def test_the_shipped_spec_validates(tmp_path):
    code, printed = validate(tmp_path, SPEC)
    assert code == 0, printed


def test_a_lora_target_the_checkpoint_lacks_is_a_located_error(tmp_path):
    text = SPEC.replace("target_modules: [word_embeddings, query, value]",
                        "target_modules: [query, q_proj]")
    code, printed = validate(tmp_path, text)
    assert code == 1
    assert f"spec.yaml:{line_col(text, 'q_proj')}: model.pretrained.finetune." \
           "target_modules.1: the checkpoint has no module 'q_proj'" in printed
    assert "query" in printed.split("its modules are named", 1)[1]  # what it does have


@pytest.mark.parametrize("compute", [
    "{kind: deepspeed, num_gpus: 2, zero_stage: 3}",
    "{kind: serverless_gpu, accelerator: GPU_8xH100, count: 8}",
])
def test_the_spec_validates_on_multi_gpu_kinds(tmp_path, compute):
    code, printed = validate(tmp_path, SPEC.replace("training:", f"compute: {compute}\n"
                                                    "training:", 1))
    assert code == 0, printed


def test_a_missing_checkpoint_directory_is_located(tmp_path):
    text = SPEC.replace("checkpoint: specs/data/tiny_bert", "checkpoint: ./no/such_dir")
    code, printed = validate(tmp_path, text)
    assert code == 1
    assert f"{line_col(text, './no/such_dir')}: model.pretrained.checkpoint: " in printed
    assert "is not a directory" in printed


def test_a_hub_id_is_left_to_the_run(tmp_path):
    code, printed = validate(tmp_path, SPEC.replace("specs/data/tiny_bert",
                                                    "prajjwal1/bert-tiny"))
    assert code == 0, printed


def copy_checkpoint(tmp_path, **config_changes):
    target = tmp_path / "ckpt"
    shutil.copytree(TINY, target)
    config = json.loads((target / "config.json").read_text())
    config.update(config_changes)
    (target / "config.json").write_text(json.dumps(config))
    return target


def test_a_head_of_another_label_count_needs_new_head(tmp_path):
    target = copy_checkpoint(tmp_path, architectures=["BertForSequenceClassification"],
                             id2label={"0": "a", "1": "b", "2": "c"})
    text = SPEC.replace("specs/data/tiny_bert", str(target))
    code, printed = validate(tmp_path, text)
    assert code == 1
    assert "head has 3 label(s); binary with loss 'bce' needs 1 output(s)" in printed
    assert "new_head: true" in printed
    code, printed = validate(tmp_path, text.replace("finetune:", "new_head: true\n    finetune:"))
    assert code == 0, printed


def test_a_vision_checkpoint_does_not_fit_a_text_task(tmp_path):
    target = copy_checkpoint(tmp_path, architectures=["ViTForImageClassification"])
    code, printed = validate(tmp_path, SPEC.replace("specs/data/tiny_bert", str(target)))
    assert code == 1 and "does not read text" in printed


def test_frozen_prefixes_are_checked_against_the_parameters(tmp_path):
    text = SPEC.replace("finetune: {method: lora", "freeze: [bert.embeddings, bert.pooler_x]\n"
                        "    finetune: {method: lora")
    code, printed = validate(tmp_path, text)
    assert code == 1
    assert f"{line_col(text, 'bert.pooler_x')}: model.pretrained.freeze.1: no parameter " \
           "of the checkpoint starts with 'bert.pooler_x'" in printed
    assert "freeze.0" not in printed


def test_the_checkpoint_tokenizer_needs_a_pretrained_model_and_one_feature(tmp_path):
    pretrained = SPEC[SPEC.index("  pretrained:"):SPEC.index("training:")]
    text = SPEC.replace(pretrained, "  layers: [{linear: {out: 1}}]\n")
    code, printed = validate(tmp_path, text)
    assert code == 1 and "that needs model.pretrained" in printed
    text = SPEC.replace("max_length: 48}", "max_length: 48}\n    - {name: x, type: numeric}")
    code, printed = validate(tmp_path, text)
    assert code == 1 and "model.pretrained reads one text feature" in printed


def test_read_checkpoint_refuses_what_is_not_one(tmp_path):
    target = copy_checkpoint(tmp_path)
    (target / "config.json").write_text("{}")
    with pytest.raises(CheckpointError, match="names no architecture"):
        read_checkpoint(target)
    target = copy_checkpoint(tmp_path / "b")
    (target / "model.safetensors").write_bytes(struct.pack("<Q", 10) + b"not json")
    with pytest.raises(CheckpointError, match="is not a safetensors file"):
        read_checkpoint(target)


def test_the_parameter_names_come_from_the_safetensors_header():
    info = read_checkpoint(TINY)
    assert info.architecture == "BertForMaskedLM" and info.labels is None
    assert "bert.encoder.layer.0.attention.self.query.weight" in info.parameters
