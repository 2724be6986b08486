"""``dbspec run`` on a directory with no tracking store yet, and the rerun that needs none.

Two runs started together on a fresh directory once both had MLflow create and migrate the one
SQLite store, and the loser died of the other's tables (``duplicate column name: step``), also
for two different specs. An unchanged rerun once imported MLflow and opened the store before
deciding that every stage was cached (most of its time).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import MINIMAL, checkout_env

SPEC = MINIMAL + "tracking: {system_metrics: false}\n"

PROBE = """
import sys
from dbspec.cli import main
code = main(sys.argv[1:])
print(code, ",".join(m for m in ("mlflow", "sqlalchemy", "alembic", "torch")
                     if m in sys.modules))
"""


def _env() -> dict:
    env = checkout_env()
    env.pop("MLFLOW_TRACKING_URI", None)  # the default store: .dbspec/mlflow.db
    return env


def _start(workdir: Path, spec: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "dbspec", "run", spec, "--smoke"],
                            cwd=workdir, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _together(workdir: Path, *specs: str) -> list[tuple[int, str]]:
    """Start one ``dbspec run`` per spec at once; their exit codes and stderr."""
    processes = [_start(workdir, spec) for spec in specs]
    results = []
    for process in processes:
        _, err = process.communicate(timeout=600)
        results.append((process.returncode, err))
    return results


@pytest.fixture(scope="module")
def two_specs(tmp_path_factory):
    """Two different specs run together in a directory without a store."""
    workdir = tmp_path_factory.mktemp("fresh")
    for name in ("a", "b"):
        (workdir / f"{name}.yaml").write_text(SPEC.replace("name: minimal", f"name: spec-{name}"))
    return workdir, _together(workdir, "a.yaml", "b.yaml")


def test_two_specs_started_together_on_a_fresh_directory_both_finish(two_specs):
    _, results = two_specs
    for code, err in results:
        assert code == 0, err
        assert "Traceback" not in err and "error:" not in err


def test_the_same_spec_started_twice_on_a_fresh_directory_is_refused_once(tmp_path):
    (tmp_path / "a.yaml").write_text(SPEC)
    results = _together(tmp_path, "a.yaml", "a.yaml")
    assert sorted(code for code, _ in results) == [0, 1], results
    (refused,) = [err for code, err in results if code == 1]
    (line,) = refused.strip().splitlines()
    assert line.startswith("error: dbspec run minimal is already running in ") and \
        "wait for it to end or stop it, then run again" in line


def test_an_unchanged_rerun_imports_no_mlflow(two_specs):
    workdir, _ = two_specs
    found = subprocess.run([sys.executable, "-c", PROBE, "run", "a.yaml", "--smoke"], cwd=workdir,
                           env=_env(), capture_output=True,
                           text=True, timeout=300)
    assert found.returncode == 0, found.stderr
    assert found.stdout.splitlines()[-1] == "0 ", found.stdout  # exit 0, nothing heavy
    assert found.stderr.count("unchanged, skipped") == 5, found.stderr


def test_a_first_run_says_first_that_it_creates_the_store(two_specs):
    workdir, results = two_specs
    firsts = [err.splitlines()[0] for _, err in results if err]
    assert any(line == "creating the MLflow tracking store "
               f"{(workdir / '.dbspec' / 'mlflow.db').resolve()} (a first run: MLflow sets up "
               "its tables, some seconds)" for line in firsts), firsts
