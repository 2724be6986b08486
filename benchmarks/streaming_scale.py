"""``data.streaming`` on a Delta table a third the size of this machine's memory, and against
training in memory on a table that fits.

Tables: synthetic Delta tables of ``--rows`` rows (default 20,000,000: 8 GB) and ``--fit-rows``
rows (default 2,000,000), each of 100 float32 features ``f0``..``f99`` (standard normal) and a
float32 regression ``target`` (a fixed linear function of ``f0``..``f9`` plus noise), from a
fixed seed. They are written in 1,000,000-row appends with ``deltalake.write_deltalake``,
dictionary encoding off (much faster for float columns), so the generator never holds more than
one chunk. The same chunks are also written to one Parquet file with ``pyarrow.parquet.
ParquetWriter`` twice: with dictionary encoding off (pyarrow's default Snappy compression, as
the Delta files) and with pyarrow's defaults (dictionary encoding tried on every column, as
``pq.write_table`` does untuned). Those writes, timed alone (not the data generation), are the
peers of dbspec's conversion (which also reads the Delta table, so it does more); the files are
deleted straight after.

Runs: ``dbspec run spec.yaml --summary-json`` in a fresh project of its own (its own SQLite
MLflow store, ``.dbspec`` state and shards), each in a process of its own. Peak memory is the
process's maximum resident set, from ``wait4``; the wrapper also samples ``/proc/PID/status``
every 0.2 s for the largest anonymous and file-backed resident sets it saw (memory-mapped shard
pages count in the RSS while they are resident, but the kernel can drop them). The spec trains
the monitoring spec's MLP (100-256-128-1, dropout 0.2, AdamW) for one epoch, batch size 256,
split 80/10/10, ``standard_scale: all``, no checkpoints, no monitoring. From the summary JSON:
the stages' seconds (``load_data`` is the conversion into shards, opening the table included)
and the train stage's ``train_samples_per_second`` (the training pass alone, no validation).

- Big side: one streaming run on the ``--rows`` table: wall time, peak RSS, conversion rows/s,
  train samples/s.
- Fits side: the ``--fit-rows`` table trained with ``streaming: {enabled: true}`` and
  ``{enabled: false}`` (in memory, on the same hash split), interleaved (streaming, memory, then
  memory, streaming...) ``--repeats`` times.

Targets (the streaming issue): peak RSS under 2 GiB on the big table; streaming train samples/s
at least 0.9 of the in-memory path's on the fits table (best run against best run); the
conversion (``load_data``) at least as fast, in rows/s, as the Parquet peer. A missed target is
a measurement: the exit status stays 0; an error exits non-zero. Other work on the machine skews
the figures; the load average is printed. The tables and projects are deleted at the end
unless ``--keep``; free disk space is checked first, and available memory for the in-memory
runs (which peaked at about ten times the feature matrix here).
Issue 35's goal is tighter: peak RSS at most 1.5 GiB on 6,000,000 rows (2.4 GB);
``--results`` writes the figures into benchmarks/RESULTS.md (its own section), where
tests/test_benchmark_results.py holds it.
Run: ``python benchmarks/streaming_scale.py [--rows 20000000] [--fit-rows 2000000]
[--repeats 2] [--keep] [--results]`` (``--rows 200000 --fit-rows 200000`` for a quick try).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _results import conditions, load, write_section

FEATURES = 100
CHUNK = 1_000_000
ROW_BYTES = 4 * (FEATURES + 1)  # a table row: features and target, float32
SHARD_ROW_BYTES = 4 * FEATURES + 16  # a shard row: features, target and position
RSS_TARGET_MIB = 2048
RATIO_TARGET = 0.9
# What the in-memory path's process peaked at here, per row of 100 float32 features (8.1 GB for
# 2,000,000 rows, 4.1 GB for 1,000,000: ten times the feature matrix, float64 copies included)
IN_MEMORY_ROW_BYTES = 4_100
SPEC = """\
name: stream-bench
data:
  source: {{kind: delta, path: {table}}}
  task: regression
  target: target
  split: {{validation: 0.1, test: 0.1, seed: 42}}
  preprocessing: [{{standard_scale: all}}]
  streaming: {{enabled: {enabled}}}
model:
  layers:
    - linear: {{out: 256}}
    - relu
    - dropout: {{p: 0.2}}
    - linear: {{out: 128}}
    - relu
    - linear: {{out: 1}}
training:
  optimizer: {{name: adamw, lr: 0.001, weight_decay: 0.01}}
  epochs: 1
  batch_size: 256
  seed: 42
  checkpointing: {{enabled: false}}
tracking: {{monitor: false}}
"""

# The wrapper process: starts the command, samples its /proc status, waits for it with wait4 and
# prints [wall seconds, ru_maxrss KiB, exit code, max RssAnon KiB, max RssFile KiB] last.
WRAPPER = """\
import json, os, subprocess, sys, threading, time
peaks = {"RssAnon:": 0, "RssFile:": 0}
started = time.perf_counter()
child = subprocess.Popen(sys.argv[1:])
done = threading.Event()
def sample():
    while not done.is_set():
        try:
            with open(f"/proc/{child.pid}/status") as handle:
                for line in handle:
                    key = line.split(maxsplit=1)[0]
                    if key in peaks:
                        peaks[key] = max(peaks[key], int(line.split()[1]))
        except (OSError, ValueError, IndexError):
            pass
        done.wait(0.2)
threading.Thread(target=sample, daemon=True).start()
_, status, usage = os.wait4(child.pid, 0)
done.set()
print(json.dumps([time.perf_counter() - started, usage.ru_maxrss,
                  os.waitstatus_to_exitcode(status), peaks["RssAnon:"], peaks["RssFile:"]]))
"""

_CONVERTED = re.compile(r"converted ([\d,]+) rows into (\d+) shards in ([\d.]+) s")


def measured(directory: Path) -> dict:
    """``dbspec run`` of ``directory/spec.yaml`` in a process of its own: wall time, memory, the
    summary's stage seconds and training figures, and the conversion line if it printed one.

    Raises:
        SystemExit: the run failed (with the end of its output).
    """
    command = [sys.executable, "-m", "dbspec", "run", "spec.yaml", "--summary-json",
               "summary.json"]
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{directory / 'mlflow.db'}"}
    process = subprocess.run([sys.executable, "-c", WRAPPER, *command], cwd=directory,
                             capture_output=True, text=True, env=env)
    lines = process.stdout.rstrip("\n").split("\n")
    try:
        seconds, peak_kib, code, anon_kib, file_kib = json.loads(lines[-1])
    except (ValueError, IndexError):
        raise SystemExit(f"the wrapper of {' '.join(command)} failed:\n"
                         f"{process.stdout[-2000:]}\n{process.stderr[-3000:]}") from None
    output = "\n".join(lines[:-1]) + "\n" + process.stderr
    if code != 0:
        raise SystemExit(f"dbspec run in {directory} failed ({code}):\n{output[-4000:]}")
    summary = json.loads((directory / "summary.json").read_text())
    converted = _CONVERTED.search(output)
    return {"seconds": seconds, "peak_mib": peak_kib / 1024, "anon_mib": anon_kib / 1024,
            "file_mib": file_kib / 1024,
            "stages": {s["name"]: s["seconds"] for s in summary["stages"]},
            "training": summary["training"],
            "metrics": summary["metrics"],
            "converted_seconds": float(converted.group(3)) if converted else None,
            "shards": int(converted.group(2)) if converted else None}


def write_tables(table: Path, peer: Path, rows: int, seed: int) -> dict:
    """The Delta table (see the module docstring) and its Parquet peer, chunk by chunk;
    returns the seconds spent in each writer alone."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from deltalake import ColumnProperties, WriterProperties, write_deltalake

    rng = np.random.default_rng(seed)
    weights = np.random.default_rng(0).normal(size=10).astype(np.float32)
    names = [f"f{j}" for j in range(FEATURES)]
    schema = pa.schema([(name, pa.float32()) for name in names + ["target"]])
    properties = WriterProperties(
        default_column_properties=ColumnProperties(dictionary_enabled=False))
    delta_seconds = parquet_seconds = default_seconds = 0.0
    writer = pq.ParquetWriter(str(peer), schema, use_dictionary=False)
    # the same rows as pyarrow writes them by default (dictionary encoding tried on every
    # column): what `pq.write_table(table, path)` costs a user who does not tune it
    plain = pq.ParquetWriter(str(peer) + ".default", schema)
    try:
        for first in range(0, rows, CHUNK):
            n = min(CHUNK, rows - first)
            x = rng.standard_normal((FEATURES, n), dtype=np.float32)  # one contiguous row a column
            target = weights @ x[:10] + rng.standard_normal(n, dtype=np.float32) * 0.5
            chunk = pa.Table.from_arrays([pa.array(column) for column in x]
                                         + [pa.array(target.astype(np.float32))], schema=schema)
            started = time.perf_counter()
            write_deltalake(str(table), chunk, mode="append", writer_properties=properties)
            delta_seconds += time.perf_counter() - started
            started = time.perf_counter()
            writer.write_table(chunk)
            parquet_seconds += time.perf_counter() - started
            started = time.perf_counter()
            plain.write_table(chunk)
            default_seconds += time.perf_counter() - started
            del x, target, chunk
    finally:
        started = time.perf_counter()
        writer.close()
        parquet_seconds += time.perf_counter() - started
        started = time.perf_counter()
        plain.close()
        default_seconds += time.perf_counter() - started
        Path(str(peer) + ".default").unlink(missing_ok=True)
    return {"delta": delta_seconds, "parquet": parquet_seconds, "parquet_default": default_seconds}


def project(work: Path, name: str, table: Path, enabled: str) -> Path:
    """A fresh project directory holding the spec."""
    path = work / name
    path.mkdir()
    (path / "spec.yaml").write_text(SPEC.format(table=table, enabled=enabled))
    return path


def _load() -> str:
    return f"{os.getloadavg()[0]:.2f}"


def _available_memory() -> int:
    """``MemAvailable`` in bytes."""
    with open("/proc/meminfo") as handle:
        for line in handle:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise SystemExit("no MemAvailable in /proc/meminfo")


def _gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:.1f} GiB"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=20_000_000,
                        help="rows of the big table (default 20,000,000: 8 GB)")
    parser.add_argument("--fit-rows", type=int, default=2_000_000,
                        help="rows of the table trained both in memory and streaming")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--dir", type=Path, default=None,
                        help="where the temporary directory goes (default: the system's)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    parser.add_argument("--results", action="store_true",
                        help="write the figures into benchmarks/RESULTS.md")
    args = parser.parse_args()
    if args.rows < 1000 or args.fit_rows < 1000 or args.repeats < 1:
        parser.error("--rows and --fit-rows need at least 1,000 rows, --repeats at least 1")
    base = args.dir or Path(tempfile.gettempdir())
    # the big table and its Parquet peer together, or the table and its shards; then the fits
    # table with, per run, its shards or the in-memory stages' arrays (all kept with --keep)
    big = args.rows * max(2 * ROW_BYTES, ROW_BYTES + SHARD_ROW_BYTES)
    fits = args.fit_rows * (2 * ROW_BYTES + 3 * SHARD_ROW_BYTES * (2 * args.repeats
                                                                    if args.keep else 1))
    needed = int(((big + fits) if args.keep else max(big, fits)) * 1.15) + 2**30
    free = shutil.disk_usage(base).free
    if free < needed:
        raise SystemExit(f"not enough disk space under {base}: {_gib(free)} free, about "
                         f"{_gib(needed)} needed for {args.rows:,} + {args.fit_rows:,} rows"
                         f"{' kept' if args.keep else ''}; free some, pass --dir elsewhere or "
                         "fewer --rows")
    in_memory = args.fit_rows * IN_MEMORY_ROW_BYTES
    if in_memory > 0.8 * _available_memory():
        raise SystemExit(f"--fit-rows {args.fit_rows:,}: the in-memory run would need about "
                         f"{_gib(in_memory)} (measured: ~{IN_MEMORY_ROW_BYTES:,} bytes a row), "
                         f"more than 80% of the {_gib(_available_memory())} available; pass "
                         "fewer --fit-rows")
    work = Path(tempfile.mkdtemp(prefix="dbspec-streaming-bench-", dir=base))
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
    tables = {"big": (work / "table_big", args.rows, 1),
              "fits": (work / "table_fits", args.fit_rows, 2)}
    writes = {}
    for label in ("big", "fits"):
        path, rows, seed = tables[label]
        started = time.perf_counter()
        writes[label] = write_tables(path, work / f"peer_{label}.parquet", rows, seed)
        (work / f"peer_{label}.parquet").unlink()
        print(f"wrote the {label} table: {rows:,} rows in {time.perf_counter() - started:.0f} s "
              f"(Delta writes {writes[label]['delta']:.1f} s, Parquet peer "
              f"{writes[label]['parquet']:.1f} s = {rows / writes[label]['parquet']:,.0f} rows/s)")
        if label == "big":  # the big side first, so its table can go before the fits side
            print(f"big side: streaming one epoch over {rows:,} rows "
                  f"(load average {_load()})")
            big = measured(project(work, "big", path, "true"))
            _print_run("stream", "big", rows, big)
            if not args.keep:
                shutil.rmtree(work / "big", ignore_errors=True)
                shutil.rmtree(path, ignore_errors=True)
    fit_table, fit_rows, _ = tables["fits"]
    print(f"fits side: {fit_rows:,} rows, streaming and in memory, {args.repeats} "
          f"interleaved repeats (load average {_load()})")
    modes = {"stream": "true", "memory": "false"}
    runs: dict[str, list[dict]] = {mode: [] for mode in modes}
    for repeat in range(args.repeats):
        order = list(modes) if repeat % 2 == 0 else list(reversed(modes))
        for mode in order:
            name = f"fits-{mode}-{repeat}"
            run = measured(project(work, name, fit_table, modes[mode]))
            runs[mode].append(run)
            _print_run(mode, "fits", fit_rows, run)
            if not args.keep:
                shutil.rmtree(work / name, ignore_errors=True)
    print(f"load average at the end: {_load()}")
    _report(args, big, runs, writes)
    if args.results:
        write_results(args, big, runs, start_load)
    return 0


def write_results(args, big: dict, runs: dict[str, list[dict]], start_load: str) -> None:
    """streaming_scale.py's section of RESULTS.md: the big table's peak RSS (issue 35's goal)
    and the fits table's training rates."""
    def rate(run: dict) -> float:
        return run["training"]["train_samples_per_second"]

    best = {mode: max(rate(r) for r in mode_runs) for mode, mode_runs in runs.items()}
    write_section("streaming_scale.py", [
        "## Streaming training: peak memory on a Delta table larger than the memory a run "
        "may hold (issue 35)",
        "",
        conditions(f"streaming_scale.py --rows {args.rows} --fit-rows {args.fit_rows} "
                   f"--repeats {args.repeats} --results", start_load)
        + f" {args.rows:,} rows x 100 float32 features ({_gib(args.rows * ROW_BYTES)}), one "
        "epoch of the MLP streamed from shards, each run in a process of its own (peak RSS "
        "from `wait4`).",
        "",
        "| measure | figure | goal (issue 35) |",
        "| --- | --- | --- |",
        f"| peak RSS, streaming {args.rows:,} rows | **peak {big['peak_mib']:,.0f} MiB** "
        f"(anonymous {big['anon_mib']:,.0f}, file-backed {big['file_mib']:,.0f}) | <= 1,536 "
        f"MiB on 6,000,000 rows: {'met' if big['peak_mib'] <= 1536 else '**not met**'} |",
        f"| train samples/s, streaming {args.rows:,} rows | {rate(big):,.0f} | - |",
        f"| train samples/s on {args.fit_rows:,} rows, streaming / in memory, best of "
        f"{args.repeats} | {best['stream']:,.0f} / {best['memory']:,.0f} = "
        f"{best['stream'] / best['memory']:.2f} | >= {RATIO_TARGET} (the streaming issue) |",
    ])


def _print_run(mode: str, label: str, rows: int, run: dict) -> None:
    stages = ", ".join(f"{name} {seconds:.1f}" for name, seconds in run["stages"].items())
    training = run["training"]
    print(f"  {mode:<6} {label:<4} {run['seconds']:7.1f} s  peak {run['peak_mib']:6.0f} MiB "
          f"(anon {run['anon_mib']:.0f}, file {run['file_mib']:.0f})  train "
          f"{training.get('train_samples_per_second', 0):>9,.0f} samples/s on "
          f"{training.get('threads')} threads  test_rmse "
          f"{run['metrics'].get('test_rmse', float('nan')):.4g}\n"
          f"         stages (s): {stages}")


def _report(args, big: dict, runs: dict[str, list[dict]], writes: dict) -> None:
    """The figures and the verdicts on the three targets."""
    def rate(run: dict) -> float:
        return run["training"]["train_samples_per_second"]

    convert = args.rows / big["stages"]["load_data"]
    peer = args.rows / writes["big"]["parquet"]
    best = {mode: max(rate(r) for r in mode_runs) for mode, mode_runs in runs.items()}
    median = {mode: statistics.median(rate(r) for r in mode_runs)
              for mode, mode_runs in runs.items()}
    print()
    print(f"{'run':<22}{'rows':>12}{'wall s':>9}{'peak MiB':>10}{'train samples/s':>17}"
          f"{'load_data rows/s':>18}")
    print(f"{'stream, big':<22}{args.rows:>12,}{big['seconds']:>9.1f}{big['peak_mib']:>10.0f}"
          f"{rate(big):>17,.0f}{convert:>18,.0f}")
    for mode, mode_runs in runs.items():
        for i, run in enumerate(mode_runs):
            print(f"{f'{mode}, fits #{i + 1}':<22}{args.fit_rows:>12,}{run['seconds']:>9.1f}"
                  f"{run['peak_mib']:>10.0f}{rate(run):>17,.0f}"
                  f"{args.fit_rows / run['stages']['load_data']:>18,.0f}")
    if big["converted_seconds"]:
        print(f"conversion alone, as load_data prints it: {big['converted_seconds']:.1f} s = "
              f"{args.rows / big['converted_seconds']:,.0f} rows/s into {big['shards']} shards "
              f"(the stage's {big['stages']['load_data']:.1f} s include opening the table)")
    print(f"writing the same rows: Delta {args.rows / writes['big']['delta']:,.0f} rows/s, "
          f"Parquet (the peer, dictionary off) {peer:,.0f} rows/s, Parquet with pyarrow's "
          f"defaults {args.rows / writes['big']['parquet_default']:,.0f} rows/s")
    print()

    def verdict(met: bool) -> str:
        return "met" if met else "MISSED"

    print(f"peak RSS, streaming {args.rows:,} rows ({_gib(args.rows * ROW_BYTES)} of features "
          f"and target): {big['peak_mib']:,.0f} MiB (largest sampled: anonymous "
          f"{big['anon_mib']:,.0f}, file-backed {big['file_mib']:,.0f}); target < "
          f"{RSS_TARGET_MIB} MiB: {verdict(big['peak_mib'] < RSS_TARGET_MIB)}")
    print(f"train samples/s, streaming / in memory on {args.fit_rows:,} rows: best "
          f"{best['stream']:,.0f} / {best['memory']:,.0f} = {best['stream'] / best['memory']:.2f}"
          f" (medians: {median['stream'] / median['memory']:.2f}); target >= {RATIO_TARGET}: "
          f"{verdict(best['stream'] / best['memory'] >= RATIO_TARGET)}")
    print(f"peak RSS on {args.fit_rows:,} rows: streaming "
          f"{max(r['peak_mib'] for r in runs['stream']):,.0f} MiB, in memory "
          f"{max(r['peak_mib'] for r in runs['memory']):,.0f} MiB")
    print(f"conversion (load_data) / Parquet write, rows/s on {args.rows:,} rows: "
          f"{convert:,.0f} / {peer:,.0f} = {convert / peer:.2f}; target >= 1: "
          f"{verdict(convert >= peer)}")
    default = args.rows / writes["big"]["parquet_default"]
    print(f"conversion (load_data) / Parquet write with pyarrow's defaults: {convert:,.0f} / "
          f"{default:,.0f} = {convert / default:.2f}; target >= 1: {verdict(convert >= default)}"
          " (the conversion also reads the Delta table; the writes start from rows in memory)")


if __name__ == "__main__":
    sys.exit(main())
