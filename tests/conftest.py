"""Shared test helpers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ASSETS = Path(__file__).resolve().parent / "assets"
SPECS = sorted((ROOT / "specs").glob("*.yaml"))


def checkout_env(env: dict | None = None) -> dict:
    """The environment for a ``python -m dbspec`` subprocess that must run this checkout."""
    full = {**os.environ, **(env or {})}
    full["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), full.get("PYTHONPATH")]))
    return full


def run_cli(*args: str, cwd: Path = ROOT, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m dbspec ARGS`` in a fresh process, as a user would."""
    full_env = checkout_env(env)  # this checkout's dbspec, whatever is installed
    return subprocess.run([sys.executable, "-m", "dbspec", *args], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def write_spec(tmp_path):
    """Write YAML text to a spec file in a temp dir and return its path."""

    def write(text: str, name: str = "spec.yaml") -> str:
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        return str(path)

    return write


MINIMAL = """\
name: minimal
data: {source: {kind: sklearn, name: diabetes}, task: regression}
model:
  layers:
    - linear: {out: 8}
    - relu
    - linear: {out: 1}
"""


def run_main(*args: str) -> tuple[int, str, str]:
    """Run the CLI in this process; returns (exit code, stdout, stderr)."""
    import contextlib
    import io

    from dbspec.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A fresh project directory: its own .dbspec state and MLflow store."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    """One local Spark session per test module (local[2], no UI, its own warehouse); code
    that asks for the active session gets this one."""
    from pyspark.sql import SparkSession

    warehouse = tmp_path_factory.mktemp("warehouse")
    session = (SparkSession.builder.master("local[2]").appName("dbspec-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.warehouse.dir", str(warehouse)).getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


from tests.cluster import spark_cluster  # noqa: E402,F401  (a standalone cluster, once per session)
from tests.servers import mlflow_server  # noqa: E402,F401  (a real mlflow server, once per session)
