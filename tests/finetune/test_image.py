"""``specs/image_finetune.yaml``: LoRA adapters on the shipped tiny ViT learn the PNG digits,
pixels scaled by the checkpoint's image processor; the registered model scores PNG bytes
(base64 text) by ``mlflow.pyfunc``; validate checks the checkpoint against the image feature."""

from __future__ import annotations

import base64
import io
import json
import re

import pytest

from tests.conftest import ROOT, mlflow_pointed_at, run_cli, run_in_process

SPEC = ROOT / "specs" / "image_finetune.yaml"


@pytest.fixture(scope="module")
def vit_finetuned(tmp_path_factory):
    """The full run of specs/image_finetune.yaml in a project of its own."""
    project = tmp_path_factory.mktemp("image_finetune")
    (project / "specs").symlink_to(ROOT / "specs")
    result = run_in_process("run", "specs/image_finetune.yaml", "--summary-json", "s.json",
                            "--tracking-uri", f"sqlite:///{project}/.dbspec/mlflow.db",
                            cwd=project, env={"HF_HUB_OFFLINE": "1"}, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    return project, result.stderr


@pytest.mark.slow
def test_lora_on_a_vit_learns_the_digits_and_serves_png(vit_finetuned):
    import mlflow
    import numpy as np
    import pandas as pd
    from PIL import Image
    from sklearn.datasets import load_digits

    project, printed = vit_finetuned
    trained, total = re.search(r"trained ([\d,]+) of ([\d,]+) parameters", printed).groups()
    assert 0 < int(trained.replace(",", "")) < int(total.replace(",", "")) / 4
    summary = json.loads((project / "s.json").read_text())
    assert summary["metrics"]["test_accuracy"] >= 0.7  # the spec's gate; chance is 0.1
    digits = load_digits()
    pngs = []
    for pixels in digits.images[:20]:
        buffer = io.BytesIO()
        Image.fromarray(np.round(pixels * 255 / 16).astype(np.uint8)).save(buffer, "PNG")
        pngs.append(base64.b64encode(buffer.getvalue()).decode("ascii"))
    uri = f"models:/{summary['model_name']}/{summary['model_version']}"
    with mlflow_pointed_at(f"sqlite:///{project}/.dbspec/mlflow.db"):
        scored = mlflow.pyfunc.load_model(uri).predict(pd.DataFrame({"image": pngs}))
        pins = open(mlflow.artifacts.download_artifacts(f"{uri}/requirements.txt")).read()
    predicted = pd.DataFrame(scored)["prediction"].astype(int).to_numpy()
    assert (predicted == digits.target[:20]).mean() >= 0.5
    assert "transformers==" in pins and "pillow==" in pins and "peft" not in pins


def test_the_image_processor_settings_scale_the_pixels():
    from dbspec.models.pretrained import image_checkpoint_input
    from dbspec.spec.sections.pretrained import PretrainedSpec

    pretrained = PretrainedSpec(checkpoint=str(ROOT / "specs" / "data" / "tiny_vit"))
    entry = image_checkpoint_input(pretrained, {"channels": 1, "height": 8, "width": 8,
                                                "normalize": "unit"})
    # the processor: pixels * (1/255), then (x - 0.5) / 0.5
    assert entry["spec"]["normalize"] == {"mean": [pytest.approx(0.5)],
                                          "std": [pytest.approx(0.5)]}
    assert entry["image"] == [1, 8, 8] and entry["config"]["model_type"] == "vit"


def validate(tmp_path, old: str, new: str) -> tuple[int, str]:
    text = SPEC.read_text().replace("specs/data/", f"{ROOT}/specs/data/").replace(old, new)
    (tmp_path / "spec.yaml").write_text(text)
    result = run_cli("validate", str(tmp_path / "spec.yaml"))
    return result.returncode, result.stdout + result.stderr


def test_the_shipped_spec_validates(tmp_path):
    code, printed = validate(tmp_path, "", "")
    assert code == 0, printed


@pytest.mark.parametrize("old, new, message", [
    ("height: 8, width: 8", "height: 16, width: 16",
     "spec.yaml:18:17: model.pretrained.checkpoint: the checkpoint takes 8 x 8 images; "
     "data.features.image is resized to 16 x 16"),
    ("channels: 1", "channels: 3", "the checkpoint takes 1 channel(s); data.features.image "
     "has channels: 3"),
    ("[query, value]", "[query, nope]", "spec.yaml:20:74: model.pretrained.finetune."
     "target_modules.1: the checkpoint has no module 'nope'"),
    ("tiny_vit", "tiny_bert", "the checkpoint is a BertForMaskedLM; an image feature needs an "
     "image classifier"),
])
def test_validate_checks_the_vision_checkpoint_against_the_image_feature(tmp_path, old, new,
                                                                         message):
    code, printed = validate(tmp_path, old, new)
    assert code == 1 and message in printed, printed


def test_the_renamed_projections_are_targets_too(tmp_path):
    """Transformers 5 loads ViT's query/value as q_proj/v_proj: either name is accepted."""
    code, printed = validate(tmp_path, "[query, value]", "[q_proj, v_proj]")
    assert code == 0, printed


def test_a_checkpoint_without_an_image_processor_is_located(tmp_path):
    import shutil

    target = tmp_path / "vit"
    shutil.copytree(ROOT / "specs" / "data" / "tiny_vit", target)
    (target / "preprocessor_config.json").unlink()
    code, printed = validate(tmp_path, f"{ROOT}/specs/data/tiny_vit", str(target))
    assert code == 1 and "has no preprocessor_config.json" in printed, printed
