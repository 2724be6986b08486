"""A data source from outside dbspec: the toy plugin package (``tests/plugins/toy_source``) is
pip-installed into a temporary directory and found through its ``dbspec.sources`` entry point
by ``validate``, ``schema``, ``plan`` and ``run`` in fresh processes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.plugins.installed import dbspec_with, install_plugins


TOY_SPEC = """\
name: toy-source-run
data:
  source: {kind: toy, rows: ROWS}
  task: regression
  target: target
  split: {validation: 0.2, test: 0.2, seed: 1}
model:
  layers: [{linear: {out: 1}}]
training:
  epochs: 2
  batch_size: 16
"""


@pytest.fixture(scope="session")
def source_site(tmp_path_factory) -> Path:
    """The toy source package installed into a temporary directory."""
    return install_plugins(tmp_path_factory.mktemp("source-plugin"), "toy_source")


_dbspec = dbspec_with


def _spec(tmp_path: Path, rows: int = 200) -> str:
    path = tmp_path / "toy.yaml"
    path.write_text(TOY_SPEC.replace("ROWS", str(rows)))
    return str(path)


def test_a_plugin_source_validates_and_plans(source_site, tmp_path):
    spec = _spec(tmp_path)
    result = _dbspec(source_site, "validate", spec, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    plan = _dbspec(source_site, "plan", spec, cwd=tmp_path)
    assert plan.returncode == 0, plan.stdout + plan.stderr
    assert "load_data" in plan.stdout


def test_a_plugin_source_s_own_check_is_located(source_site, tmp_path):
    spec = _spec(tmp_path, rows=10)
    result = _dbspec(source_site, "validate", spec, cwd=tmp_path)
    assert result.returncode == 1
    assert f"{spec}:3:29: data.source.rows: 10 rows are too few to split" in result.stdout
    assert "Traceback" not in result.stdout + result.stderr


def test_the_schema_holds_the_plugin_source(source_site, tmp_path):
    result = _dbspec(source_site, "schema", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "The toy plugin's data source." in json.dumps(json.loads(result.stdout))


def test_without_the_plugin_the_kind_is_unknown(tmp_path):
    result = run_cli("validate", _spec(tmp_path), cwd=tmp_path, env={"MLFLOW_TRACKING_URI": ""})
    assert result.returncode == 1
    assert "data.source.kind" in result.stdout and "toy" in result.stdout
    assert "Traceback" not in result.stdout + result.stderr


def test_a_spec_on_a_plugin_source_runs(source_site, tmp_path):
    result = _dbspec(source_site, "run", _spec(tmp_path), "--smoke", "--state-dir",
                     str(tmp_path / "state"), cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "stages run       load_data, split, preprocess, train, evaluate" in result.stdout
