"""The layer contracts in pyproject.toml hold (import-linter), and the README shows the commands
that matter (tests/test_docs.py runs them, with every other example of the docs)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess

import pytest

from tests.conftest import ROOT


def test_import_contracts_are_kept():
    lint = shutil.which("lint-imports")
    if lint is None:
        pytest.fail("import-linter is not installed: pip install -e '.[dev]'")
    result = subprocess.run([lint], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "0 broken" in result.stdout


@pytest.mark.parametrize("module, planted, message", [
    # the validate path may not reach torch even through another dbspec module
    ("spec/locations.py", "import dbspec.models.network",
     "dbspec.spec is not allowed to import torch"),
    # the domain sits below the stages: an arrow back up breaks the layers
    ("data/__init__.py", "import dbspec.stages.base",
     "dbspec.data is not allowed to import dbspec.stages"),
    ("tracking/__init__.py", "import dbspec.serving",
     "dbspec.tracking is not allowed to import dbspec.serving"),
])
def test_import_contracts_catch_a_planted_import(tmp_path, module, planted, message):
    lint = shutil.which("lint-imports")
    if lint is None:
        pytest.fail("import-linter is not installed: pip install -e '.[dev]'")
    shutil.copytree(ROOT / "dbspec", tmp_path / "dbspec",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    with open(tmp_path / "dbspec" / module, "a", encoding="utf-8") as handle:
        handle.write(f"\n{planted}  # planted by the test\n")
    result = subprocess.run([lint], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert result.returncode != 0, result.stdout[-3000:]
    assert message in result.stdout, result.stdout[-3000:]


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```console\n(.*?)```", text, re.DOTALL)
    return [line[2:].strip() for block in blocks for line in block.splitlines()
            if line.startswith("$ dbspec ")]


def test_readme_shows_the_light_commands():
    commands = readme_commands()
    for verb in ("validate", "plan", "schema"):
        assert any(c.split()[1] == verb for c in commands), verb


def light_readme_commands() -> list[str]:
    """The README's commands that need no trained model or server: the others (run, serve,
    promote, jobs --check...) are exercised by their own tests."""
    def light(command: str) -> bool:
        args = shlex.split(command.split("  #")[0])[1:]
        return args[0] in ("validate", "plan", "schema", "jobs") and "--check" not in args
    return [c for c in readme_commands() if light(c)]


def test_the_readme_has_light_commands_to_run():
    """Five commands a reader can try with no model or server (tests/test_docs.py runs them)."""
    assert len(light_readme_commands()) >= 5


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    test_command = ci.strip().splitlines()[-1]
    assert test_command == "python -m pytest -q -n 2 --dist loadgroup"
    assert f"$ {test_command}" in readme
