"""``dbspec monitor`` over a large inference table, against pandas doing the same statistics.

Trains and registers a small diabetes model in a fresh temporary directory (its own SQLite
MLflow store; the evaluate stage logs its reference profile), then writes an inference table of
``--rows`` rows (default 2,000,000) in the layout ``dbspec serve`` writes: ``request_id`` (100
rows a request), ``timestamp`` (24 hours, in order), ``model_name``, ``model_version``,
``latency_ms``, the 10 feature columns (real diabetes rows resampled, fixed seed; float32 as
the server writes them) and ``prediction`` (drawn from the reference profile's own quantiles, so
no column drifts); Delta, appended in 1,000,000-row commits. A second table of a
fifth of the rows shows whether memory grows with the table.

Sides, each in a process of its own (peak memory is the process's maximum resident set, from
``wait4``):

- dbspec: ``dbspec monitor SPEC --table T --window 1h --format json``, the command a scheduled job
  runs: streams the table, compares the 24 windows with the reference profile, logs its MLflow
  run with the drift table (plots only when a version alerts: none here). All of it timed; the scan alone, as the command reports
  it (``scan_seconds``), is printed too, for context.
- pandas: ``DeltaTable(T).to_pandas()``, then per 1-hour window (``groupby``) and column the
  same statistics against the same reference profile: PSI and the KS statistic from counts on
  the profile's bins (numpy ``histogram``; the formulas are dbspec's own functions, so only the
  data handling differs), chi-square for the discrete column, missing and out-of-range shares,
  requests and latency p50/p95 (one latency per request). No MLflow run, no plots: the peer
  does less than the command, which favours it.

Runs are interleaved (dbspec, pandas, then pandas, dbspec...) ``--repeats`` times. Reported:
rows/s (best and median wall clock), CPU seconds (the child's user + system, from ``wait4``)
and peak memory of each side at both table sizes, then the ratio of rows/s. Targets (issues 17
and 35): dbspec's peak memory does not grow with the table, and its rows/s is at least
pandas'. A missed target is a measurement: the exit status stays 0; an error
exits non-zero. Other work on the machine skews the figures; the load average is printed.
``--results`` writes the figures into benchmarks/RESULTS.md (its own section), where
tests/test_benchmark_results.py holds the rows/s goal.
Run: ``python benchmarks/monitor_scan.py [--rows 2000000] [--repeats 2] [--keep] [--results]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _results import conditions, load, write_section

ROOT = Path(__file__).resolve().parents[1]
MODEL = "monitor_bench"
ROWS_PER_REQUEST = 100
CHUNK = 1_000_000
SPEC = f"""\
name: monitor-bench
data: {{source: {{kind: sklearn, name: diabetes}}, task: regression}}
model:
  layers:
    - linear: {{out: 16}}
    - relu
    - linear: {{out: 1}}
training: {{epochs: 5, batch_size: 32}}
tracking: {{monitor: false}}
registry: {{name: {MODEL}}}
monitoring: {{window: 1h, min_rows: 100}}
serving: {{realtime: {{inference_table: {{path: inference}}}}}}
"""


def measured(command: list[str], cwd: Path) -> tuple[float, float, float, int, str]:
    """Run ``command`` under a small Python parent of its own, which waits for it with
    ``os.wait4``: (wall seconds, peak RSS MiB, CPU seconds, exit code, its output)."""
    wrapper = ("import os,subprocess,sys,time,json\n"
               "t=time.perf_counter()\n"
               "p=subprocess.Popen(sys.argv[1:])\n"
               "_,status,usage=os.wait4(p.pid,0)\n"
               "print(json.dumps([time.perf_counter()-t,usage.ru_maxrss,"
               "usage.ru_utime+usage.ru_stime,os.waitstatus_to_exitcode(status)]))\n")
    process = subprocess.run([sys.executable, "-c", wrapper, *command], cwd=cwd,
                             capture_output=True, text=True,
                             env={**os.environ, "MLFLOW_TRACKING_URI": ""})
    lines = process.stdout.rstrip("\n").split("\n")
    seconds, peak_kib, cpu, code = json.loads(lines[-1])
    if code not in (0, 3):
        raise SystemExit(f"{' '.join(command)} failed ({code}):\n{process.stderr[-3000:]}")
    return seconds, peak_kib / 1024, cpu, code, "\n".join(lines[:-1])


def write_table(path: Path, rows: int, version: str, profile: dict, seed: int = 7) -> None:
    """The inference table (see the module docstring), in CHUNK-row Delta commits."""
    import numpy as np
    import pyarrow as pa
    from deltalake import write_deltalake
    from sklearn.datasets import load_diabetes

    data = load_diabetes()
    features, names = data.data.astype(np.float32), list(data.feature_names)
    rng = np.random.default_rng(seed)
    output = profile["columns"]["prediction"]
    edges = np.asarray([output["min"], *output["fine_edges"], output["max"]])
    start_us = int(time.time() // 86400 * 86400 - 86400) * 1_000_000
    step_us = 86_400 * 1_000_000 / rows
    for first in range(0, rows, CHUNK):
        n = min(CHUNK, rows - first)
        picked = features[rng.integers(0, len(features), n)]
        index = np.arange(first, first + n)
        request = index // ROWS_PER_REQUEST
        columns = {
            "request_id": pa.array(np.char.add("req-", request.astype(str)).astype(object),
                                   pa.string()),
            "timestamp": pa.array((start_us + index * step_us).astype(np.int64),
                                  pa.timestamp("us", tz="UTC")),
            "model_name": pa.array(np.full(n, MODEL, dtype=object), pa.string()),
            "model_version": pa.array(np.full(n, version, dtype=object), pa.string()),
            "latency_ms": pa.array(rng.lognormal(1.0, 0.5, n)),
        }
        for j, name in enumerate(names):
            columns[name] = pa.array(picked[:, j].astype(np.float32))
        # inverse CDF over the reference's quantile edges (equal shares between them)
        grid = np.linspace(0, 1, len(edges))
        columns["prediction"] = pa.array(np.interp(rng.random(n), grid, edges)
                                         .astype(np.float32))
        write_deltalake(str(path), pa.table(columns), mode="append")


def pandas_peer(table: str, profile_path: str) -> None:
    """The peer: the table into pandas, then every window's statistics (printed as JSON)."""
    import numpy as np
    from deltalake import DeltaTable

    from dbspec.monitoring.drift import chi_square_p, ks_binned, psi

    profile = json.loads(Path(profile_path).read_text())
    frame = DeltaTable(table).to_pandas()
    frame = frame[frame["model_name"] == MODEL]
    frame["window"] = frame["timestamp"].dt.floor("1h")
    columns = [c for c in (*profile["features"], *profile["outputs"]) if c in frame.columns]
    report = []
    for window, rows in frame.groupby("window", sort=True):
        if len(rows) < 100:
            continue
        stats = {"window": str(window), "rows": len(rows)}
        first = rows.drop_duplicates("request_id")
        stats["requests"] = len(first)
        stats["latency_p50"], stats["latency_p95"] = np.quantile(first["latency_ms"],
                                                                 [0.5, 0.95]).tolist()
        for name in columns:
            column, values = profile["columns"][name], rows[name]
            present = values.dropna().to_numpy(dtype=np.float64)
            entry = {"missing": float(values.isna().mean())}
            if column["kind"] == "discrete":
                counts = values.value_counts()
                window_counts = np.array([counts.get(v, 0) for v in column["values"]]
                                         + [len(present) - counts.reindex(
                                             column["values"]).fillna(0).sum()])
                reference = np.array(column["counts"] + [0])
                entry["psi"] = psi(reference, window_counts)
                entry["p"] = chi_square_p(reference, window_counts)
            else:
                coarse = np.histogram(present, [-np.inf, *column["edges"], np.inf])[0]
                fine = np.histogram(present, [-np.inf, *column["fine_edges"], np.inf])[0]
                entry["psi"] = psi(np.array(column["counts"]), coarse)
                entry["ks"], entry["p"] = ks_binned(np.array(column["fine_counts"]), fine)
                entry["out_of_range"] = float(((present < column["min"])
                                               | (present > column["max"])).mean())
            stats[name] = entry
        report.append(stats)
    print(json.dumps({"windows": len(report), "rows": int(sum(r["rows"] for r in report))}))


def _load() -> str:
    return f"{os.getloadavg()[0]:.2f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    parser.add_argument("--results", action="store_true",
                        help="write the figures into benchmarks/RESULTS.md")
    parser.add_argument("--pandas-peer", nargs=2, metavar=("TABLE", "PROFILE"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.pandas_peer:
        pandas_peer(*args.pandas_peer)
        return 0
    work = Path(tempfile.mkdtemp(prefix="dbspec-monitor-bench-"))
    try:
        return _bench(work, args)
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def _bench(work: Path, args) -> int:
    start_load = load()
    print(f"load average at the start: {_load()}")
    (work / "spec.yaml").write_text(SPEC)
    trained = subprocess.run([sys.executable, "-m", "dbspec", "run", "spec.yaml", "--quiet"],
                             cwd=work, capture_output=True, text=True,
                             env={**os.environ, "MLFLOW_TRACKING_URI": ""})
    if trained.returncode != 0:
        raise SystemExit(f"training failed:\n{trained.stderr[-3000:]}")
    profile = next((work / ".dbspec").rglob("reference_profile.json"))
    sizes = {"small": args.rows // 5, "full": args.rows}
    for label, rows in sizes.items():
        started = time.perf_counter()
        write_table(work / f"table_{label}", rows, version="1",
                    profile=json.loads(profile.read_text()))
        print(f"wrote the {label} table: {rows:,} rows in {time.perf_counter() - started:.0f} s")
    sides = {
        "dbspec": lambda t: [sys.executable, "-m", "dbspec", "monitor", "spec.yaml",
                             "--table", str(t), "--window", "1h", "--format", "json"],
        "pandas": lambda t: [sys.executable, str(Path(__file__).resolve()), "--pandas-peer",
                             str(t), str(profile)],
    }
    results: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
    scans: dict[str, list[float]] = {}  # dbspec's own figure: the streaming scan alone
    for repeat in range(args.repeats):
        order = list(sides) if repeat % 2 == 0 else list(reversed(sides))
        for label in sizes:
            for side in order:
                seconds, peak, cpu, code, out = measured(sides[side](work / f"table_{label}"),
                                                         work)
                if side == "dbspec":
                    report = json.loads(out)
                    windows = sum(len(v["windows"]) for v in report["versions"])
                    scans.setdefault(label, []).append(report["scan_seconds"])
                else:
                    windows = json.loads(out.splitlines()[-1])["windows"]
                results.setdefault((side, label), []).append((seconds, peak, cpu))
                print(f"  {side:<6} {label:<5} {sizes[label]:>11,} rows  {seconds:7.1f} s  "
                      f"{sizes[label] / seconds:>11,.0f} rows/s  CPU {cpu:5.1f} s  "
                      f"peak {peak:7.0f} MiB  "
                      f"({windows} windows{', exit 3: alert' if code == 3 else ''})")
    print(f"load average at the end: {_load()}")
    print(f"{'side':<7}{'table':<7}{'rows':>12}{'best rows/s':>14}{'median rows/s':>16}"
          f"{'median CPU s':>14}{'peak MiB':>10}")
    for (side, label), runs in sorted(results.items()):
        rates = [sizes[label] / s for s, _, _ in runs]
        print(f"{side:<7}{label:<7}{sizes[label]:>12,}{max(rates):>14,.0f}"
              f"{statistics.median(rates):>16,.0f}{statistics.median(c for _, _, c in runs):>14.2f}"
              f"{max(p for _, p, _ in runs):>10.0f}")
    for label, seconds in scans.items():
        print(f"dbspec's scan alone ({label} table, as the command reports it): "
              f"{sizes[label] / min(seconds):,.0f} rows/s best (the rest of its time: imports, "
              "the registry, statistics, the MLflow run and its plots)")
    growth = {side: max(p for _, p, _ in results[side, "full"])
              / max(p for _, p, _ in results[side, "small"]) for side in sides}
    print(f"peak memory, full / small table: dbspec {growth['dbspec']:.2f}x, "
          f"pandas {growth['pandas']:.2f}x (target: dbspec about 1x)")
    best = {side: max(args.rows / s for s, _, _ in results[side, "full"]) for side in sides}
    median = {side: statistics.median(args.rows / s for s, _, _ in results[side, "full"])
              for side in sides}
    print(f"dbspec / pandas rows/s on {args.rows:,} rows, medians: "
          f"{median['dbspec'] / median['pandas']:.2f}x")
    print(f"dbspec / pandas rows/s on {args.rows:,} rows (best of {args.repeats}): "
          f"{best['dbspec'] / best['pandas']:.2f}x (target: >= 1)")
    if args.results:
        write_results(args, sizes, results, scans, start_load)
    return 0


def write_results(args, sizes: dict, results: dict, scans: dict, start_load: str) -> None:
    """monitor_scan.py's section of RESULTS.md: rows/s, CPU and peak memory of both sides."""
    def rates(side: str) -> list[float]:
        return [args.rows / seconds for seconds, _, _ in results[side, "full"]]

    def peak(side: str, label: str) -> float:
        return max(p for _, p, _ in results[side, label])

    best = max(rates("dbspec")) / max(rates("pandas"))
    median = statistics.median(rates("dbspec")) / statistics.median(rates("pandas"))
    rows = [f"| {side} | {max(rates(side)):,.0f} | {statistics.median(rates(side)):,.0f} | "
            f"{statistics.median(c for _, _, c in results[side, 'full']):.2f} | "
            f"{peak(side, 'small'):,.0f} → {peak(side, 'full'):,.0f} "
            f"({peak(side, 'full') / peak(side, 'small'):.2f}x) |" for side in ("pandas", "dbspec")]
    write_section("monitor_scan.py", [
        "## Monitoring: `dbspec monitor` against pandas computing the same statistics "
        "(issue 35)",
        "",
        conditions(f"monitor_scan.py --rows {args.rows} --repeats {args.repeats} --results",
                   start_load)
        + f" A {args.rows:,}-row Delta inference table (and a {sizes['small']:,}-row one for "
        "memory growth); `dbspec monitor` end to end (imports, registry, scan, statistics, "
        "MLflow run) against `to_pandas` and the same statistics (no MLflow), each in a process "
        "of its own, alternating. The scan alone, as dbspec reports it, ran at "
        f"{args.rows / min(scans['full']):,.0f} rows/s at best.",
        "",
        f"| side | rows/s, best of {args.repeats} | median | CPU s, median | peak RSS MiB, "
        f"{sizes['small']:,} → {args.rows:,} rows |",
        "| --- | --- | --- | --- | --- |",
        *rows,
        "",
        f"Ratio dbspec / pandas rows/s: **best {best:.2f}x**, medians {median:.2f}x "
        f"(goal >= 1x: {'met' if best >= 1 else '**not met**'}).",
    ])


if __name__ == "__main__":
    sys.exit(main())
