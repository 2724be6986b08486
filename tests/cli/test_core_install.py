"""A core-only install (no extras): the light commands work, the others name the extra.

A real core-only virtualenv would need its own copy of pydantic, PyYAML and databricks-sdk
(minutes of installs); instead each command runs in a fresh interpreter in which importing
any extra's module fails, and importlib.metadata knows none of their distributions, exactly
as where they were never installed.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT, checkout_env

HIDE = """
import importlib.abc, importlib.metadata, sys
HIDDEN = {"torch", "mlflow", "optuna", "sklearn", "numpy", "pandas", "pyarrow", "deltalake",
          "psutil", "pynvml", "matplotlib", "tensorboard", "pyspark", "deepspeed", "ray",
          "uvicorn", "httptools", "orjson", "httpx", "scipy", "sqlalchemy"}
DISTRIBUTIONS = {"scikit-learn", "torch", "mlflow", "numpy", "pandas", "pyspark"}

class Hidden(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in HIDDEN:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, Hidden())
known = importlib.metadata.version
def version(name):
    if name in DISTRIBUTIONS:
        raise importlib.metadata.PackageNotFoundError(name)
    return known(name)
importlib.metadata.version = version
from dbspec.cli import main
sys.exit(main(sys.argv[1:]))
"""
DIABETES = str(ROOT / "specs" / "diabetes.yaml")


def core_only(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", HIDE, *args], cwd=cwd, env=checkout_env(),
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args, extra", [
    (["run", DIABETES, "--smoke"], "train"),
    (["models", "diabetes_predictor"], "train"),
    (["serve", "models:/diabetes_predictor@production"], "train"),
    (["predict", "models:/diabetes_predictor@production", "--input", "in.parquet",
      "--output", "out"], "train"),
])
def test_commands_that_need_an_extra_name_it(args, extra, tmp_path):
    done = core_only(*args, cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert f"error: dbspec {args[0]} needs the '{extra}' extra (" in done.stderr
    assert f"pip install 'dbspec[{extra}]'" in done.stderr and "Traceback" not in done.stderr


def test_the_light_commands_work_on_a_core_install(tmp_path):
    for args in (["validate", DIABETES], ["plan", DIABETES], ["jobs", DIABETES, "-o", "out"]):
        done = core_only(*args, cwd=tmp_path)
        assert done.returncode == 0, (args, done.stderr)
