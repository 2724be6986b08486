"""How much does re-running an unchanged spec cost?

Runs ``dbspec run specs/diabetes.yaml`` twice in a fresh working directory (fresh MLflow store
and stage state), as a user would from a shell, and prints the second run's wall time as a
fraction of the first. The second run must find every stage unchanged. Target: <= 10%.

Run: ``python benchmarks/rerun_cache.py [--spec specs/diabetes.yaml]``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def timed_run(spec: Path, cwd: str) -> tuple[float, str]:
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "dbspec", "run", str(spec), "--quiet"], cwd=cwd,
                            capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"dbspec run failed:\n{result.stdout}\n{result.stderr}")
    return elapsed, result.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", default=str(ROOT / "specs" / "diabetes.yaml"))
    args = parser.parse_args()
    spec = Path(args.spec).resolve()
    with tempfile.TemporaryDirectory() as tmp:
        first, _ = timed_run(spec, tmp)
        second, output = timed_run(spec, tmp)
    if "none (all unchanged)" not in output:
        raise SystemExit(f"the second run did work:\n{output}")
    print(f"{spec.name}: first run {first:.2f} s, unchanged rerun {second:.2f} s "
          f"= {second / first:.1%} of the first (target <= 10%)")


if __name__ == "__main__":
    main()
