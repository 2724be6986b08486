"""The network of ``model.pretrained`` (issue 36): built from the shipped tiny checkpoint with
LoRA adapters or frozen prefixes, merged after training into the plain model a served model
rebuilds from the stored config, and its run-time errors located."""

from __future__ import annotations

import pytest

from dbspec.models.pretrained import (PretrainedError, build_pretrained, checkpoint_input,
                                      resolve_checkpoint)
from dbspec.spec.sections.pretrained import PretrainedSpec
from tests.conftest import ROOT

TINY = str(ROOT / "specs" / "data" / "tiny_bert")
LORA = {"method": "lora", "rank": 4, "alpha": 8, "target_modules": ["query", "value"]}


@pytest.fixture(scope="module")
def inputs():
    entry = checkpoint_input(PretrainedSpec(checkpoint=TINY), 16)
    return [{"name": "text", "type": "text", **entry}]


def network(inputs, **settings):
    import torch

    torch.manual_seed(0)
    return build_pretrained(PretrainedSpec(checkpoint=TINY, **settings), 1, inputs, True)


def test_the_input_holds_the_checkpoint_tokenizer_and_config(inputs):
    from tokenizers import Tokenizer

    entry = inputs[0]
    assert entry["pad_id"] == 0 and entry["pad_token"] == "[PAD]"
    assert entry["config"]["model_type"] == "bert" and entry["indices"] == 600
    ids = Tokenizer.from_str(entry["tokenizer"]).encode("a b").ids
    assert ids[0] == 2 and ids[-1] == 3  # [CLS] ... [SEP]: the checkpoint's own template


def test_lora_trains_the_adapters_and_the_head_only(inputs):
    net = network(inputs, finetune=LORA)
    trained, total = net.parameter_counts()
    names = [n for n, p in net.named_parameters() if p.requires_grad]
    # the checkpoint (a masked LM) has no pooler: new, so trained in full like the head
    assert all("lora_" in n or "classifier" in n or "pooler" in n for n in names)
    assert any("pooler" in n for n in names)
    assert 0 < trained / total < 0.1


def test_merged_weights_load_into_the_served_form(inputs):
    import torch

    net = network(inputs, finetune=LORA)
    for param in net.parameters():  # adapters that do something
        if param.requires_grad:
            param.data.normal_(0, 0.2)
    x = torch.tensor([[2.0, 7, 9, 11, 3, 0, 0, 0], [2, 5, 3, 0, 0, 0, 0, 0]])
    net.eval()
    before = net(x)
    net.finish()
    served = build_pretrained(PretrainedSpec(checkpoint=TINY), 1, inputs, False)
    served.load_state_dict(net.state_dict())  # strict: the plain model's keys exactly
    served.eval()
    assert torch.allclose(served(x), before, atol=1e-5)
    assert "peft" not in type(net.model).__module__


def test_no_rows_score_to_no_logits(inputs):
    """``dbspec predict --engine spark`` scores 0 rows first to learn the output's columns:
    BERT's attention cannot reshape an empty batch (a RuntimeError stopped the command)."""
    import torch

    net = network(inputs, finetune=LORA).eval()
    assert net(torch.zeros(0, 8)).shape == (0, 1)
    net.finish()
    assert net(torch.zeros(0, 8)).shape == (0, 1)


def test_frozen_prefixes_stop_training(inputs):
    net = network(inputs, freeze=["bert.embeddings", "encoder.layer.0"])
    frozen = {n for n, p in net.named_parameters() if not p.requires_grad}
    assert any(".embeddings." in n for n in frozen)
    assert any(".encoder.layer.0." in n for n in frozen)
    assert not any(".encoder.layer.1." in n for n in frozen)


@pytest.mark.parametrize("settings, where", [
    ({"freeze": ["bert.nothing"]}, "model.pretrained.freeze.0: no parameter starts with"),
    ({"finetune": {**LORA, "target_modules": ["q_proj"]}},
     "model.pretrained.finetune.target_modules: "),
])
def test_what_validate_did_not_see_is_located_at_run_time(inputs, settings, where):
    with pytest.raises(PretrainedError, match=where.replace(".", r"\.")):
        network(inputs, **settings)


def test_a_missing_directory_is_located(tmp_path):
    with pytest.raises(PretrainedError, match=r"model\.pretrained\.checkpoint: .* is not a dir"):
        resolve_checkpoint(PretrainedSpec(checkpoint=str(tmp_path / "none")))


def test_no_rows_score_to_no_logits_on_a_vision_checkpoint():
    """The same probe on a ViT: ``view`` of an empty batch reaches the patch embedding with no
    rows, so the probe scores one blank image and returns none of it."""
    import json

    import torch
    from transformers import AutoModelForImageClassification

    from dbspec.models.pretrained import PretrainedNetwork

    checkpoint = ROOT / "specs" / "data" / "tiny_vit"
    config = json.loads((checkpoint / "config.json").read_text())
    shape = (config.get("num_channels", 3), config["image_size"], config["image_size"])
    net = PretrainedNetwork(AutoModelForImageClassification.from_pretrained(checkpoint).eval(),
                            0, shape)
    width = shape[0] * shape[1] * shape[2]
    assert net(torch.zeros(0, width)).shape == (0, config.get("num_labels", 2))
    assert net(torch.zeros(3, width)).shape == (3, config.get("num_labels", 2))
