"""A compute kind from outside dbspec: the toy plugin package (``tests/plugins/toy_compute``)
is pip-installed into a temporary directory and found through its ``dbspec.compute`` entry
point by ``validate``, ``schema``, ``plan``, ``jobs`` and ``run`` in fresh processes; a second
package whose import fails (``tests/plugins/broken_compute``) gives a located error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.plugins.installed import dbspec_with, install_plugins

PACKAGES = ("toy_compute", "broken_compute")

TOY_SPEC = """\
name: toy-run
data:
  source: {kind: sklearn, name: diabetes}
  task: regression
  target: target
  split: {validation: 0.2, test: 0.2, seed: 1}
model:
  layers: [{linear: {out: 8}}, relu, {linear: {out: 1}}]
training:
  epochs: 2
  batch_size: 16
compute:
  kind: toy
  threads: THREADS
"""


@pytest.fixture(scope="session")
def plugin_site(tmp_path_factory) -> Path:
    """The two plugin packages installed into a temporary directory."""
    return install_plugins(tmp_path_factory.mktemp("plugins"), *PACKAGES)


_dbspec = dbspec_with


def _spec(tmp_path: Path, threads: int = 2, kind: str = "toy") -> str:
    path = tmp_path / "toy.yaml"
    path.write_text(TOY_SPEC.replace("THREADS", str(threads)).replace("kind: toy",
                                                                       f"kind: {kind}"))
    return str(path)


def test_a_plugin_kind_validates(plugin_site, tmp_path):
    result = _dbspec(plugin_site, "validate", _spec(tmp_path), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "all valid" in result.stdout


def test_a_plugin_kind_s_own_check_is_located(plugin_site, tmp_path):
    spec = _spec(tmp_path, threads=40)
    result = _dbspec(plugin_site, "validate", spec, cwd=tmp_path)
    assert result.returncode == 1
    assert f"{spec}:14:12: compute.threads: 40 threads for batches of 16 rows" in result.stdout
    assert "Traceback" not in result.stdout + result.stderr


def test_a_plugin_kind_is_in_the_schema(plugin_site, tmp_path):
    result = _dbspec(plugin_site, "schema", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    schema = json.loads(result.stdout)
    assert "ToyCompute" in schema["$defs"]
    threads = schema["$defs"]["ToyCompute"]["properties"]["threads"]
    assert threads["description"] == "Intra-op threads; at most training.batch_size."


def test_a_plugin_kind_plans_and_compiles_to_a_job(plugin_site, tmp_path):
    spec = _spec(tmp_path)
    plan = _dbspec(plugin_site, "plan", spec, cwd=tmp_path)
    assert plan.returncode == 0, plan.stderr
    assert "train" in plan.stdout and "compute" in plan.stdout
    jobs = _dbspec(plugin_site, "jobs", spec, "-o", str(tmp_path / "jobs"), cwd=tmp_path)
    assert jobs.returncode == 0, jobs.stdout + jobs.stderr


def test_a_plugin_kind_runs(plugin_site, tmp_path):
    result = _dbspec(plugin_site, "run", _spec(tmp_path), "--smoke", "--state-dir",
                     str(tmp_path / "state"), cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "stages run       load_data, split, preprocess, train, evaluate" in result.stdout
    assert "on cpu" in result.stdout


def test_a_typo_of_a_plugin_kind_gets_a_suggestion(plugin_site, tmp_path):
    spec = _spec(tmp_path, kind="tpy")
    result = _dbspec(plugin_site, "validate", spec, cwd=tmp_path)
    assert result.returncode == 1
    assert f"{spec}:13:9: compute.kind: unknown compute kind 'tpy' (did you mean 'toy'?)" \
        in result.stdout


def test_a_plugin_that_fails_to_import_is_a_located_error(plugin_site, tmp_path):
    spec = _spec(tmp_path, kind="slurm")
    result = _dbspec(plugin_site, "validate", spec, cwd=tmp_path)
    assert result.returncode == 1
    assert (f"{spec}:13:9: compute.kind: compute kind 'slurm' (entry point slurm = "
            "dbspec_broken_compute:KIND from dbspec-broken-compute) failed to load: "
            "ModuleNotFoundError: No module named 'dbspec_slurm_client'; fix or uninstall that "
            "package") in result.stdout
    assert "Traceback" not in result.stdout + result.stderr
    # the other kinds are not affected by one broken package
    assert _dbspec(plugin_site, "validate", _spec(tmp_path), cwd=tmp_path).returncode == 0
