"""Does the median pruner save work without losing the best result?

The same 30-trial TPE study (same seed, same space) on the breast-cancer search spec, once with
the spec's median pruner and once with pruning off, in one process. Both studies train through
dbspec's tune objective (the code `dbspec run` uses), on the same prepared data. Prints epochs
trained, wall time and best value of each.

Target: at least 2x fewer epochs with pruning, best value within 5%.
Run: ``python benchmarks/search_pruning.py [--trials 30]``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "specs" / "breast_cancer_search.yaml"


def study(workdir: Path, pruner: str, trials: int) -> dict:
    from dbspec.cli import main

    os.chdir(workdir)
    summary = workdir / f"{pruner}.json"
    started = time.perf_counter()
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        code = main(["run", str(SPEC), "--set",
                     f"search.pruner.name={pruner}", "--set", f"search.n_trials={trials}",
                     "--set", f"search.study_name=bench-{pruner}",
                     "--summary-json", str(summary), "-q"])
    elapsed = time.perf_counter() - started
    if code != 0:
        raise SystemExit(f"the {pruner} run failed (exit {code})")
    data = json.loads(summary.read_text())
    search = data["search"]
    tune_seconds = next(s["seconds"] for s in data["stages"] if s["name"] == "tune")
    return {"epochs": search["epochs_trained"], "seconds": elapsed, "tune": tune_seconds,
            "best": search["best_value"], "trials": search["trials"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=30)
    args = parser.parse_args()
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    with tempfile.TemporaryDirectory() as tmp:
        pruned = study(Path(tmp), "median", args.trials)
        unpruned = study(Path(tmp), "none", args.trials)
    for name, result in (("median pruner", pruned), ("no pruning", unpruned)):
        print(f"{name:<14} {result['epochs']:>5} epochs  study {result['tune']:5.1f} s "
              f"(whole run {result['seconds']:5.1f} s)  best val_loss {result['best']:.5f}  "
              f"trials {result['trials']}")
    print(f"epochs: {unpruned['epochs'] / pruned['epochs']:.2f}x fewer with pruning (target >= 2x);"
          f" best value {pruned['best'] / unpruned['best'] - 1:+.1%} vs unpruned (target within 5%)")


if __name__ == "__main__":
    main()
