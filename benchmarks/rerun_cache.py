"""How much does re-running an unchanged spec cost?

Runs ``dbspec run specs/diabetes.yaml`` twice in a fresh working directory (fresh MLflow store
and stage state), as a user would from a shell: the first run does every stage, the second
must find every stage unchanged. Repeated ``--repeats`` times, each pair in its own directory
(first and rerun alternate); prints min and median of each, how long the first run was silent
before its first line (target: <= 1 s), then the rerun's share of the first run (medians, and
mins) last. Target: <= 10%.

Run: ``python benchmarks/rerun_cache.py [--spec specs/diabetes.yaml] [--repeats 3]``.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def timed_run(spec: Path, cwd: str) -> tuple[float, float, str]:
    """Seconds to the end and to the first line of output (progress or summary), the output."""
    start = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-m", "dbspec", "run", str(spec)], cwd=cwd,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert process.stdout is not None
    first_line = process.stdout.readline()
    first = time.perf_counter() - start
    output = first_line + process.stdout.read()
    elapsed = time.perf_counter() - start
    if process.wait() != 0:
        raise SystemExit(f"dbspec run failed:\n{output}")
    return elapsed, first, output


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", default=str(ROOT / "specs" / "diabetes.yaml"))
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    spec = Path(args.spec).resolve()
    firsts, reruns, silences = [], [], []
    for repeat in range(args.repeats):
        with tempfile.TemporaryDirectory() as tmp:
            first, silent, opening = timed_run(spec, tmp)
            second, _, output = timed_run(spec, tmp)
        if "none (all unchanged)" not in output:
            raise SystemExit(f"the second run did work:\n{output}")
        firsts.append(first)
        reruns.append(second)
        silences.append(silent)
        print(f"  #{repeat}: first run {first:.2f} s (first line after {silent:.2f} s: "
              f"{opening.splitlines()[0][:60]!r}), unchanged rerun {second:.2f} s", flush=True)
    print(f"{spec.name}, {args.repeats} repeats: first run min {min(firsts):.2f} s median "
          f"{statistics.median(firsts):.2f} s; unchanged rerun min {min(reruns):.2f} s median "
          f"{statistics.median(reruns):.2f} s")
    print(f"first run's first line after: median {statistics.median(silences):.2f} s, max "
          f"{max(silences):.2f} s (target <= 1 s)")
    print(f"ratio rerun / first run: {statistics.median(reruns) / statistics.median(firsts):.1%}"
          f" (medians), {min(reruns) / min(firsts):.1%} (mins) (target <= 10%)")


if __name__ == "__main__":
    main()
