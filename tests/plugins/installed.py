"""Plugin packages of these tests, pip-installed into a temporary directory, and the dbspec
command run with them importable (a real installation, isolated from the environment)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import run_cli

HERE = Path(__file__).resolve().parent


def install_plugins(root: Path, *names: str) -> Path:
    """Install the packages ``tests/plugins/<name>`` (pip, no dependencies) under ``root``;
    the directory to put on PYTHONPATH. They are copied first: building in place would leave
    build/ and egg-info in the tests."""
    copies = [shutil.copytree(HERE / name, root / "src" / name) for name in names]
    site = root / "site"
    result = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                             "--no-build-isolation", "--target", str(site), *map(str, copies)],
                            check=False, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return site


def dbspec_with(site: Path, *args: str, cwd: Path, timeout: int = 120):
    """``python -m dbspec ARGS`` with the plugins importable (and this checkout's dbspec)."""
    return run_cli(*args, cwd=cwd, env={"PYTHONPATH": str(site), "MLFLOW_TRACKING_URI": ""},
                   timeout=timeout)
