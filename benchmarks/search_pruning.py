"""Does the median pruner save time, not only epochs, without losing the best result?

The same TPE study (same seed, same space) on the breast-cancer search spec, with the spec's
median pruner and with pruning off. The data stages are prepared once; then each study is one
``dbspec run --only tune`` in a fresh process (so each pays the same imports, as a user's run
does), the two alternating in order, ``--repeats`` times. For each study: epochs trained, the
tune stage's wall time (from ``--summary-json``), the process's CPU time, the best value.

Targets: at least 2x fewer epochs with pruning and the best value within 5%; the study's wall
time falling with the epochs: at least 1.8x faster with pruning (issue 16).
``--results`` writes the figures into benchmarks/RESULTS.md (its own section).
Run: ``python benchmarks/search_pruning.py [--trials 30] [--repeats 3] [--results]``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _results import conditions, load, write_section

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "specs" / "breast_cancer_search.yaml"
PRUNERS = ("median", "none")


def dbspec(workdir: Path, *args: str) -> None:
    """``python -m dbspec ARGS`` in ``workdir``; exits with its stderr if it fails."""
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    done = subprocess.run([sys.executable, "-m", "dbspec", *args], cwd=workdir, env=env,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"dbspec {' '.join(args)} failed (exit {done.returncode}):\n"
                         f"{done.stderr[-3000:]}")


def study(workdir: Path, pruner: str, trials: int, name: str) -> dict:
    """One study in a fresh process: its tune stage's seconds, the process's CPU seconds."""
    summary = workdir / f"{name}.json"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    dbspec(workdir, "run", str(SPEC), "--only", "tune", "--set", f"search.pruner.name={pruner}",
           "--set", f"search.n_trials={trials}", "--set", f"search.study_name={name}",
           "--summary-json", str(summary), "-q")
    process_seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    data = json.loads(summary.read_text())
    search = data["search"]
    return {"epochs": search["epochs_trained"], "best": search["best_value"],
            "trials": search["trials"], "process": process_seconds,
            "tune": next(s["seconds"] for s in data["stages"] if s["name"] == "tune"),
            "cpu": (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--results", action="store_true",
                        help="write the figures into benchmarks/RESULTS.md")
    args = parser.parse_args()
    start_load = load()
    results: dict[str, list[dict]] = {p: [] for p in PRUNERS}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        dbspec(workdir, "run", str(SPEC), "--only", "load_data,split,preprocess", "-q")
        for repeat in range(args.repeats):
            order = PRUNERS if repeat % 2 == 0 else PRUNERS[::-1]  # neither always goes first
            for pruner in order:
                result = study(workdir, pruner, args.trials, f"bench-{pruner}-{repeat}")
                results[pruner].append(result)
                print(f"  {pruner:<6} #{repeat}: {result['epochs']:>5} epochs  tune "
                      f"{result['tune']:6.1f} s  process {result['process']:6.1f} s wall, "
                      f"{result['cpu']:6.1f} s CPU  best {result['best']:.5f}  "
                      f"{result['trials']}", flush=True)

    def stat(pruner: str, key: str) -> tuple[float, float]:
        values = [r[key] for r in results[pruner]]
        return min(values), statistics.median(values)

    for pruner in PRUNERS:
        (tune_min, tune_med), (cpu_min, cpu_med) = stat(pruner, "tune"), stat(pruner, "cpu")
        epochs = statistics.median(r["epochs"] for r in results[pruner])
        print(f"{pruner:<6} epochs {epochs:>6.0f}  tune wall min {tune_min:6.1f} s median "
              f"{tune_med:6.1f} s  process CPU min {cpu_min:6.1f} s median {cpu_med:6.1f} s")
    pruned, unpruned = results["median"][0], results["none"][0]
    print(f"best value with pruning {pruned['best'] / unpruned['best'] - 1:+.1%} vs without "
          "(target within 5%)")
    epochs = unpruned["epochs"] / pruned["epochs"]
    wall_min = stat("none", "tune")[0] / stat("median", "tune")[0]
    wall_med = stat("none", "tune")[1] / stat("median", "tune")[1]
    cpu_med = stat("none", "cpu")[1] / stat("median", "cpu")[1]
    print(f"ratio (without / with pruning): epochs {epochs:.2f}x (target >= 2x); process CPU "
          f"{cpu_med:.2f}x (median); tune wall {wall_min:.2f}x (min), {wall_med:.2f}x (median) "
          "(target >= 1.8x)")
    if args.results:
        rows = [f"| {pruner} | {statistics.median(r['epochs'] for r in results[pruner]):,.0f} | "
                f"{stat(pruner, 'tune')[1]:.1f} | {stat(pruner, 'cpu')[1]:.1f} | "
                f"{results[pruner][0]['best']:.5f} |" for pruner in PRUNERS]
        write_section("search_pruning.py", [
            "## Search: the median pruner against the same study without pruning (issue 35)",
            "",
            conditions(f"search_pruning.py --trials {args.trials} --repeats {args.repeats} "
                       "--results", start_load)
            + f" `specs/{SPEC.name}`'s TPE study, each study one `dbspec run --only tune` in a "
            "fresh process, alternating.",
            "",
            "| pruner | epochs, median | tune stage wall s, median | process CPU s, median "
            "| best value (first repeat) |",
            "| --- | --- | --- | --- | --- |",
            *rows,
            "",
            f"Without / with pruning: epochs {epochs:.2f}x, process CPU {cpu_med:.2f}x, "
            f"**tune wall {wall_med:.2f}x** median ({wall_min:.2f}x of the fastest runs); goal "
            f">= 1.8x: {'met' if wall_med >= 1.8 else '**not met**'}.",
        ])


if __name__ == "__main__":
    main()
