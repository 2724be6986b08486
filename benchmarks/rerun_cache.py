"""How much does re-running an unchanged spec cost?

Runs ``dbspec run specs/diabetes.yaml`` twice in a fresh working directory (fresh MLflow store
and stage state), as a user would from a shell: the first run does every stage, the second
must find every stage unchanged. Repeated ``--repeats`` times, each pair in its own directory
(first and rerun alternate); prints min and median of each, how long the first run was silent
before its first line (target: <= 1 s), then the rerun's share of the first run (medians, and
mins) last. Target: <= 10%.

``--results`` writes the figures into benchmarks/RESULTS.md (its own section), where
tests/test_benchmark_results.py holds both goals.

Run: ``python benchmarks/rerun_cache.py [--spec specs/diabetes.yaml] [--repeats 3] [--results]``.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _results import conditions, load, write_section

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
    parser.add_argument("--results", action="store_true",
                        help="write the figures into benchmarks/RESULTS.md")
    args = parser.parse_args()
    spec = Path(args.spec).resolve()
    start_load = load()
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
    ratio = statistics.median(reruns) / statistics.median(firsts)
    print(f"ratio rerun / first run: {ratio:.1%} (medians), {min(reruns) / min(firsts):.1%} "
          "(mins) (target <= 10%)")
    if args.results:
        write_results(args, spec, firsts, reruns, silences, start_load)


def write_results(args, spec: Path, firsts: list[float], reruns: list[float],
                  silences: list[float], start_load: str) -> None:
    """rerun_cache.py's section of RESULTS.md: both goals and the figures behind them."""
    first, rerun = statistics.median(firsts), statistics.median(reruns)
    silent = statistics.median(silences)
    write_section("rerun_cache.py", [
        "## Unchanged rerun and a fresh run's first line: `dbspec run` twice in a fresh "
        "directory (issue 35)",
        "",
        conditions(f"rerun_cache.py --repeats {args.repeats} --results", start_load)
        + f" `specs/{spec.name}`, the default SQLite store, each pair in a fresh directory.",
        "",
        "| measure | first run | unchanged rerun | figure | goal (issue 35) |",
        "| --- | --- | --- | --- | --- |",
        f"| wall seconds, median of {args.repeats} | {first:.2f} | {rerun:.2f} | "
        f"**rerun {rerun / first:.1%} of the first run** | <= 10%: "
        f"{'met' if rerun / first <= 0.10 else '**not met**'} |",
        f"| a fresh run's first line, seconds after the start, median (max) | {silent:.2f} "
        f"({max(silences):.2f}) | - | **first line after {silent:.2f} s** | <= 1 s: "
        f"{'met' if silent <= 1 else '**not met**'} |",
    ])


if __name__ == "__main__":
    main()
