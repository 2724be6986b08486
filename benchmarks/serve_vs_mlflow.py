"""How much faster does ``dbspec serve`` answer than ``mlflow models serve`` on the same model?

Trains and registers ``specs/diabetes.yaml`` in a fresh temporary directory (its own SQLite
MLflow store), then serves the same registered version (``models:/diabetes_predictor/1``) on
127.0.0.1 twice: ``mlflow models serve --env-manager local`` (uvicorn, one worker) and
``dbspec serve`` (bearer token from ``DBSPEC_TOKEN``; the client sends it to both, MLflow ignores
it). Both must answer a first request with the same predictions before any load is applied.

Each configuration (concurrency 1, 8, 32 x bodies of 1 and 64 real diabetes rows, scaled as
sklearn ships them) loads both servers with ``wrk -t1 -cC -dDs --latency`` and a Lua script that
POSTs one fixed body to ``/invocations``, ``--repeats`` times, alternating which server goes
first, each run after a short warm-up run. Reported: each run's requests/s, then per
configuration the min and median requests/s and the median p50 and p99 latency as wrk measures
them, and last the ratios dbspec/mlflow of the median requests/s.
The body is MLflow's ``dataframe_split`` with the feature names: MLflow enforces the model's
column signature and refuses unnamed ``inputs`` rows, and both servers must get the same body.
Any non-2xx answer or socket error stops the benchmark: it means a broken set-up, not a slow one.

Target: at concurrency 32, dbspec >= 3x mlflow's requests/s with a lower p99, for both sizes.
The machine runs wrk (one thread) and the server on the same cores; close other work first.
Run: ``python benchmarks/serve_vs_mlflow.py [--duration 10] [--repeats 3] [--concurrency 1 8 32]
[--keep]``
(needs ``wrk``: ``apt-get install wrk``).
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
import urllib.error
import urllib.request
from pathlib import Path
from typing import NamedTuple

import _serving_setup as setup

ROW_SIZES = (1, 64)
TARGET_CONCURRENCY = 32
TARGET_RATIO = 3.0
_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3, "h": 3600e3}  # to milliseconds


class Summary(NamedTuple):
    """One server's runs of one configuration."""

    runs: list  # WrkResult per repeat
    rps_min: float
    rps_median: float
    p50_median: float
    p99_median: float


def summarise(runs: list) -> Summary:
    rps = [r.rps for r in runs]
    return Summary(runs, min(rps), statistics.median(rps),
                   statistics.median(r.p50_ms for r in runs),
                   statistics.median(r.p99_ms for r in runs))


class WrkResult(NamedTuple):
    requests: int
    rps: float
    p50_ms: float
    p99_ms: float
    non_2xx: int
    socket_errors: dict[str, int]


def body(rows: int) -> bytes:
    """MLflow's ``dataframe_split`` body: ``rows`` real diabetes rows, named columns."""
    columns, data = setup.diabetes_rows(rows)
    return json.dumps({"dataframe_split": {"columns": columns, "data": data}}).encode()


def lua_script(path: Path, payload: bytes, token: str) -> Path:
    text = payload.decode()
    if "]==]" in text:  # cannot happen with JSON numbers, but the long bracket must not close
        raise ValueError("body contains ']==]'")
    path.write_text('wrk.method = "POST"\n'
                    f"wrk.body = [==[{text}]==]\n"
                    'wrk.headers["Content-Type"] = "application/json"\n'
                    f'wrk.headers["Authorization"] = "Bearer {token}"\n')
    return path


def _ms(value: str, unit: str) -> float:
    return float(value) * _UNITS[unit]


def parse_wrk(output: str) -> WrkResult:
    """Requests/sec, p50/p99 (in ms), non-2xx and socket error counts from wrk's text output."""
    rps = re.search(r"^Requests/sec:\s+([\d.]+)", output, re.M)
    total = re.search(r"^\s*(\d+) requests in ", output, re.M)
    latency = {p: re.search(rf"^\s+{p}%\s+([\d.]+)(us|ms|s|m|h)\s*$", output, re.M)
               for p in ("50", "99")}
    if not (rps and total and all(latency.values())):
        raise SystemExit(f"cannot parse wrk's output:\n{output}")
    non_2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", output)
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)",
                       output)
    socket_errors = dict(zip(("connect", "read", "write", "timeout"),
                             map(int, errors.groups()))) if errors else {}
    return WrkResult(int(total.group(1)), float(rps.group(1)),
                     _ms(*latency["50"].groups()), _ms(*latency["99"].groups()),
                     int(non_2xx.group(1)) if non_2xx else 0,
                     {k: v for k, v in socket_errors.items() if v})


def run_wrk(wrk: str, server: setup.Server, script: Path, connections: int,
            seconds: float) -> WrkResult:
    command = [wrk, "-t1", f"-c{connections}", f"-d{seconds:g}s", "--timeout", "10s",
               "--latency", "-s", str(script), server.url + "/invocations"]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise SystemExit(f"wrk failed (exit {result.returncode}) against {server.label}:\n"
                         f"{result.stdout}\n{result.stderr}")
    parsed = parse_wrk(result.stdout)
    if parsed.non_2xx or parsed.socket_errors:
        raise SystemExit(
            f"{server.label} answered {parsed.non_2xx} non-2xx responses and had socket errors "
            f"{parsed.socket_errors or 'none'} out of {parsed.requests} requests "
            f"(-c{connections}, {script.name}): the set-up is broken, not slow.\nwrk said:\n"
            f"{result.stdout}\n{server.label}'s log ({server.log}):\n{server.log_tail()}")
    if server.process.poll() is not None:
        raise SystemExit(f"{server.label} exited during the run:\n{server.log_tail()}")
    return parsed


def first_predictions(server: setup.Server, payload: bytes) -> list:
    request = urllib.request.Request(
        server.url + "/invocations", data=payload, method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {setup.TOKEN}"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            answer = json.loads(response.read())
    except urllib.error.HTTPError as refused:
        raise SystemExit(f"{server.label} refused the benchmark body: {refused.code} "
                         f"{refused.read()[:500]!r}") from None
    return [next(iter(p.values())) if isinstance(p, dict) else p for p in answer["predictions"]]


def check_same_model(mlflow: setup.Server, dbspec: setup.Server, payload: bytes) -> None:
    ours, theirs = first_predictions(dbspec, payload), first_predictions(mlflow, payload)
    if len(ours) != len(theirs) or any(abs(a - b) > 1e-3 * max(1.0, abs(b))
                                       for a, b in zip(ours, theirs)):
        raise SystemExit(f"the servers disagree on the same rows: dbspec {ours[:4]}..., "
                         f"mlflow {theirs[:4]}...")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=10.0,
                        help="seconds of measured load per server and configuration (default 10)")
    parser.add_argument("--warmup", type=float, default=2.0,
                        help="seconds of unmeasured load before each measurement (default 2)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="measured runs per server and configuration, alternating which "
                             "server goes first (default 3)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32],
                        help="wrk connection counts (default: 1 8 32)")
    parser.add_argument("--spec", default=str(setup.DIABETES_SPEC))
    parser.add_argument("--keep", action="store_true",
                        help="keep the temporary directory (store, server logs, Lua scripts)")
    args = parser.parse_args()
    wrk = shutil.which("wrk")
    if wrk is None:
        raise SystemExit("wrk is not installed: apt-get install wrk")
    if min(args.concurrency) < 1 or args.duration <= 0 or args.warmup < 0 or args.repeats < 1:
        raise SystemExit("--concurrency and --repeats must be >= 1, --duration > 0, "
                         "--warmup >= 0")

    workdir = Path(tempfile.mkdtemp(prefix="dbspec-serve-bench-"))
    servers: list[setup.Server] = []
    try:
        trained = setup.train(Path(args.spec).resolve(), workdir)
        mlflow = setup.start_mlflow(trained, setup.free_port(), workdir / "mlflow.log")
        servers.append(mlflow)
        dbspec = setup.start_dbspec(trained, setup.free_port(), workdir / "dbspec.log")
        servers.append(dbspec)
        for server in servers:
            server.wait_ready()
        payloads = {rows: body(rows) for rows in ROW_SIZES}
        check_same_model(mlflow, dbspec, payloads[max(ROW_SIZES)])
        scripts = {rows: lua_script(workdir / f"rows{rows}.lua", payloads[rows], setup.TOKEN)
                   for rows in ROW_SIZES}
        print(f"serving {trained.uri}: mlflow on :{mlflow.port}, dbspec on :{dbspec.port}; "
              f"wrk -t1, {args.warmup:g} s warm-up + {args.duration:g} s per run; load average "
              f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} cores", flush=True)

        results: dict[tuple[int, int], dict[str, Summary]] = {}
        for rows in ROW_SIZES:
            for connections in args.concurrency:
                runs: dict[str, list[WrkResult]] = {"mlflow": [], "dbspec": []}
                for repeat in range(args.repeats):
                    order = [(mlflow, "mlflow"), (dbspec, "dbspec")]
                    for server, name in order if repeat % 2 == 0 else order[::-1]:
                        if args.warmup > 0:
                            run_wrk(wrk, server, scripts[rows], connections, args.warmup)
                        runs[name].append(run_wrk(wrk, server, scripts[rows], connections,
                                                  args.duration))
                    print(f"  rows={rows} c={connections} run {repeat + 1}: mlflow "
                          f"{runs['mlflow'][-1].rps:,.0f} req/s, dbspec "
                          f"{runs['dbspec'][-1].rps:,.0f} req/s", flush=True)
                results[(rows, connections)] = {name: summarise(r) for name, r in runs.items()}
    finally:
        for server in servers:
            server.stop()
            print(f"{server.label}: {server.stopped}")
        if args.keep:
            print(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)

    print(f"load average at the end {os.getloadavg()[0]:.2f} (other work skews the figures)")
    print()
    print(f"{args.repeats} run(s) of {args.duration:g} s per server and configuration; "
          "req/s min / median, latency medians")
    print(f"{'config':<16} {'mlflow req/s':>17} {'p50 ms':>7} {'p99 ms':>8}   "
          f"{'dbspec req/s':>17} {'p50 ms':>7} {'p99 ms':>8}")
    for (rows, connections), pair in results.items():
        m, d = pair["mlflow"], pair["dbspec"]
        print(f"{f'rows={rows} c={connections}':<16} {m.rps_min:>8,.0f} / {m.rps_median:<6,.0f} "
              f"{m.p50_median:>7.2f} {m.p99_median:>8.2f}   {d.rps_min:>8,.0f} / "
              f"{d.rps_median:<6,.0f} {d.p50_median:>7.2f} {d.p99_median:>8.2f}")
    print()
    print(f"target: at concurrency {TARGET_CONCURRENCY}, dbspec >= {TARGET_RATIO:g}x mlflow's "
          "requests/s (medians) with a lower p99")
    if TARGET_CONCURRENCY in args.concurrency:
        for rows in ROW_SIZES:
            m, d = results[(rows, TARGET_CONCURRENCY)]["mlflow"], \
                results[(rows, TARGET_CONCURRENCY)]["dbspec"]
            ratio = d.rps_median / m.rps_median
            ok = ratio >= TARGET_RATIO and d.p99_median < m.p99_median
            lower = "lower" if d.p99_median < m.p99_median else "not lower"
            print(f"  rows={rows:<3} {'PASS' if ok else 'FAIL'}: {ratio:.2f}x requests/s "
                  f"({'>=' if ratio >= TARGET_RATIO else '<'} {TARGET_RATIO:g}x), p99 "
                  f"{d.p99_median:.2f} ms vs {m.p99_median:.2f} ms ({lower})")
    else:
        print(f"  not checked: --concurrency does not include {TARGET_CONCURRENCY}")
    print()
    print("ratio dbspec/mlflow, median requests/s: " + ", ".join(
        f"rows={rows} c={connections} {pair['dbspec'].rps_median / pair['mlflow'].rps_median:.2f}x"
        for (rows, connections), pair in results.items()))


if __name__ == "__main__":
    sys.exit(main())
