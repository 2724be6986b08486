"""Unpacking a Databricks AI Gateway inference table: in Spark against the local Python path.

Writes ``--rows`` gateway rows (default 200,000) with the diabetes features' names and random
values: the four body shapes of MLflow's scoring protocol in turn (``dataframe_split``,
``inputs``, ``dataframe_records``, ``instances``), ``--rows-per-request`` rows each, one
``prediction`` a row; one row in 50 answered 500, one in 100 with a logging error code, one in
200 with JSON cut short. The table is written with ``deltalake`` in ``--files`` commits of one
data file each (default: one a CPU, so Spark has a partition a core).

Sides, interleaved (Python, Spark, then Spark, Python...) ``--repeats`` times, in this process:

- Python: what ``dbspec monitor`` does with a gateway Delta path and no Spark session at hand
  (:func:`dbspec.monitoring.gateway.unpack_gateway_table`, then its table materialised).
- Spark: :func:`dbspec.monitoring.gateway_spark.unpack_in_spark` on the same file read as
  Parquet by a local Spark session (``local[*]``, started once, its start printed but not
  timed): the JSON parsed, exploded and typed in Spark, the unpacked rows collected through
  Arrow, as ``dbspec monitor --table catalog.schema.table`` does on a cluster.

Both sides must give the same rows by reason (checked). Printed: gateway rows/s of each side
(best and median), the load average, and last the ratio of the medians (Spark / Python).
Run: ``python benchmarks/gateway_unpack.py [--rows 200000] [--repeats 2]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
FEATURES = ["age", "sex", "bmi", "bp", "s1", "s2", "s3", "s4", "s5", "s6"]


def _body(values, shape: int) -> dict:
    rows = [dict(zip(FEATURES, row)) for row in values]
    if shape == 0:
        return {"dataframe_split": {"columns": FEATURES, "data": values}}
    if shape == 1:
        return {"inputs": {f: [row[i] for row in values] for i, f in enumerate(FEATURES)}}
    return {"dataframe_records": rows} if shape == 2 else {"instances": rows}


def write_table(path: Path, rows: int, per_request: int, files: int) -> None:
    import numpy as np
    import pyarrow as pa
    from deltalake import write_deltalake

    rng = np.random.default_rng(7)
    start = 1_700_000_000 * 1_000_000
    columns: dict[str, list] = {c: [] for c in (
        "databricks_request_id", "request_time", "status_code", "execution_duration_ms",
        "request", "response", "served_entity_id", "logging_error_codes")}
    for i in range(rows):
        values = rng.normal(size=(per_request, len(FEATURES))).round(6).tolist()
        request = json.dumps(_body(values, i % 4))
        response = json.dumps({"predictions": rng.normal(size=per_request).round(6).tolist()})
        columns["databricks_request_id"].append(f"r{i}")
        columns["request_time"].append(start + i * 10_000)
        columns["status_code"].append(500 if i % 50 == 7 else 200)
        columns["execution_duration_ms"].append(int(rng.integers(5, 50)))
        columns["request"].append(request[:-3] if i % 200 == 11 else request)
        columns["response"].append(response)
        columns["served_entity_id"].append("bench-1")
        columns["logging_error_codes"].append(["MAX_REQUEST_SIZE_EXCEEDED"] if i % 100 == 3
                                              else None)
    table = pa.table(columns).set_column(1, "request_time", pa.array(
        columns["request_time"], pa.int64()).cast(pa.timestamp("us", tz="UTC")))
    step = -(-rows // files)
    for first in range(0, rows, step):  # one data file a commit, as a table grows
        write_deltalake(str(path), table.slice(first, step), mode="append")


def python_side(path: str):
    from dbspec.monitoring.gateway import unpack_gateway_table
    from dbspec.monitoring.labels import open_rows
    from dbspec.monitoring.layout import InferenceRows

    return unpack_gateway_table(InferenceRows(path, open_rows(path, "open")), "bench") \
        .dataset.to_table()


def spark_side(spark, path: str):
    from dbspec.monitoring.gateway_spark import unpack_in_spark

    return unpack_in_spark(spark.read.parquet(path), path, "bench", None, "1").dataset.to_table()


def by_reason(table) -> dict:
    from dbspec.monitoring.gateway import LEFT_OUT

    reasons = table.column(LEFT_OUT).to_pylist()
    return {str(r): reasons.count(r) for r in set(reasons)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--rows-per-request", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--files", type=int, default=os.cpu_count() or 1,
                        help="data files the table is written in (default: one a CPU)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="dbspec-gateway-bench-"))
    try:
        return _bench(work, args)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _bench(work: Path, args) -> int:
    from pyspark.sql import SparkSession

    print(f"load average at the start: {os.getloadavg()[0]:.2f}; {os.cpu_count()} CPUs")
    began = time.perf_counter()
    write_table(work / "gateway", args.rows, args.rows_per_request, args.files)
    print(f"wrote {args.rows:,} gateway rows ({args.rows_per_request} a request, "
          f"{args.files} files) in "
          f"{time.perf_counter() - began:.1f} s")
    began = time.perf_counter()
    spark = (SparkSession.builder.master(args.master).config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.memory", "4g").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    print(f"Spark session ({args.master}) started in {time.perf_counter() - began:.1f} s "
          "(not timed below)")
    path = str(work / "gateway")
    sides = {"python": lambda: python_side(path), "spark": lambda: spark_side(spark, path)}
    seconds: dict[str, list[float]] = {"python": [], "spark": []}
    found = {}
    for repeat in range(args.repeats):
        for side in (("python", "spark") if repeat % 2 == 0 else ("spark", "python")):
            began = time.perf_counter()
            table = sides[side]()
            seconds[side].append(time.perf_counter() - began)
            found[side] = by_reason(table)
            print(f"  {side}: {seconds[side][-1]:.2f} s, {table.num_rows:,} unpacked rows, "
                  f"load {os.getloadavg()[0]:.2f}", flush=True)
    spark.stop()
    if found["python"] != found["spark"]:
        raise SystemExit(f"the sides differ: {found}")
    rates = {side: [args.rows / s for s in seconds[side]] for side in seconds}
    for side, rate in rates.items():
        print(f"{side}: {max(rate):,.0f} gateway rows/s best, {statistics.median(rate):,.0f} "
              "median")
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    ratio = statistics.median(rates["spark"]) / statistics.median(rates["python"])
    print(f"ratio (Spark / Python, median gateway rows/s, {args.rows:,} rows): {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
