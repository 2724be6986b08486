"""The installed packages' entry points are read once a process, for every seam's group."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT, checkout_env

COUNT_SCANS = """
import importlib.metadata, sys
real, calls = importlib.metadata.entry_points, []
def counted(**kwargs):
    calls.append(kwargs)
    return real(**kwargs)
importlib.metadata.entry_points = counted
from dbspec.cli import main
code = main(["validate", sys.argv[1]])
print(len(calls), code)
"""


def test_a_cold_validate_scans_the_entry_points_once():
    # it scanned once per seam (compute, sources, gates...), each a walk of every package
    done = subprocess.run([sys.executable, "-c", COUNT_SCANS, str(ROOT / "specs" / "diabetes.yaml")],
                          capture_output=True, text=True, env=checkout_env(), cwd=ROOT,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-2:] == ["1", "0"], done.stdout
