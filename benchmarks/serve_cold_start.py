"""How fast does ``dbspec serve`` start, and how much memory does it hold, next to
``mlflow models serve`` on the same registered model?

Trains and registers ``specs/diabetes.yaml`` in a fresh temporary directory (its own SQLite
MLflow store), then, ``--repeats`` times, alternating which goes first, starts each server on
``models:/NAME/VERSION``: ``dbspec serve`` and ``mlflow models serve --env-manager local``
(uvicorn, one worker). For each start it measures:

- cold start: from just before ``exec`` to the first ``GET /ping`` answered 200 (polled every
  10 ms), the time a load balancer waits for a new replica;
- RSS after warm-up: ``--warmup-requests`` 1-row requests on one keep-alive connection (the
  same ``dataframe_split`` body to both; both must answer 200), then the resident memory of
  the server's whole session (``mlflow models serve`` scores in a child process).

The OS page cache is warm after the first start of each: every start but the first reads
files from memory, as a restarted replica does. Reported: each run, then min and median per
server, the goals (dbspec cold start <= 2 s, RSS <= 300 MiB; from issue 16), and last the
ratios mlflow/dbspec of the medians (how many times faster, how many times smaller) with
issue 31's goal (both at least 2). The exit code follows the ratios and the memory bound.
Other work on the machine slows both servers alike: trust the ratios over absolute figures.
Run: ``python benchmarks/serve_cold_start.py [--repeats 5] [--warmup-requests 2000] [--keep]``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple

import _serving_setup as setup

GOAL_COLD_S = 2.0
GOAL_RSS_MIB = 300.0
#: Issue 31: at most half of mlflow's start time and memory (ratios mlflow/dbspec >= 2).
GOAL_RATIO = 2.0


class Start(NamedTuple):
    server: str
    cold_s: float
    rss_mib: float


def warm_up(server: setup.Server, requests: int, payload: bytes) -> None:
    """``requests`` scoring requests on one keep-alive connection; each must answer 200."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {setup.TOKEN}"}
    try:
        for _ in range(requests):
            connection.request("POST", "/invocations", body=payload, headers=headers)
            response = connection.getresponse()
            body = response.read()
            if response.status != 200:
                raise SystemExit(f"{server.label} answered {response.status} to the warm-up "
                                 f"request: {body[:300]!r}\n{server.log_tail()}")
    finally:
        connection.close()


def one_start(label: str, trained: setup.Trained, workdir: Path, run: int, requests: int,
              payload: bytes) -> Start:
    port = setup.free_port()
    log = workdir / f"{label}-{run}.log"
    server = (setup.start_dbspec(trained, port, log) if label == "dbspec"
              else setup.start_mlflow(trained, port, log))
    try:
        cold = server.wait_ready(timeout=300, poll_s=0.01)
        warm_up(server, requests, payload)
        rss = server.rss_bytes() / 2**20
    finally:
        server.stop()
    print(f"  run {run + 1} {label:<7} cold start {cold:6.2f} s   RSS after warm-up "
          f"{rss:7.1f} MiB", flush=True)
    return Start(label, cold, rss)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="starts per server (default 5)")
    parser.add_argument("--warmup-requests", type=int, default=2000,
                        help="1-row requests before RSS is read (default 2000)")
    parser.add_argument("--spec", default=str(setup.DIABETES_SPEC))
    parser.add_argument("--keep", action="store_true",
                        help="keep the temporary directory (store, server logs)")
    args = parser.parse_args()
    if args.repeats < 1 or args.warmup_requests < 1:
        raise SystemExit("--repeats and --warmup-requests must be at least 1")

    workdir = Path(tempfile.mkdtemp(prefix="dbspec-cold-start-"))
    starts: list[Start] = []
    try:
        trained = setup.train(Path(args.spec).resolve(), workdir)
        columns, rows = setup.diabetes_rows(1)
        payload = json.dumps({"dataframe_split": {"columns": columns, "data": rows}}).encode()
        print(f"{args.repeats} starts each of dbspec serve and mlflow models serve on "
              f"{trained.uri}, alternating; load average {os.getloadavg()[0]:.2f} on "
              f"{os.cpu_count()} cores", flush=True)
        for run in range(args.repeats):
            order = ("dbspec", "mlflow") if run % 2 == 0 else ("mlflow", "dbspec")
            for label in order:
                starts.append(one_start(label, trained, workdir, run, args.warmup_requests,
                                        payload))
    finally:
        if args.keep:
            print(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)

    print(f"load average at the end {os.getloadavg()[0]:.2f} (other work skews the figures)")
    summary = {}
    print()
    print(f"{'server':<8} {'cold start s (min / median)':>28} {'RSS MiB (min / median)':>26}")
    for label in ("dbspec", "mlflow"):
        mine = [s for s in starts if s.server == label]
        cold = [s.cold_s for s in mine]
        rss = [s.rss_mib for s in mine]
        summary[label] = (statistics.median(cold), statistics.median(rss))
        print(f"{label:<8} {min(cold):>17.2f} / {statistics.median(cold):<8.2f} "
              f"{min(rss):>15.1f} / {statistics.median(rss):<8.1f}")
    cold_d, rss_d = summary["dbspec"]
    cold_m, rss_m = summary["mlflow"]
    print()
    ok_cold, ok_rss = cold_d <= GOAL_COLD_S, rss_d <= GOAL_RSS_MIB
    print(f"goal: dbspec cold start <= {GOAL_COLD_S:g} s: {'PASS' if ok_cold else 'FAIL'} "
          f"(median {cold_d:.2f} s); RSS <= {GOAL_RSS_MIB:g} MiB: "
          f"{'PASS' if ok_rss else 'FAIL'} (median {rss_d:.1f} MiB)")
    print(f"ratio mlflow/dbspec (medians): cold start {cold_m / cold_d:.2f}x faster, "
          f"RSS {rss_m / rss_d:.2f}x smaller")
    ok_ratio = cold_m / cold_d >= GOAL_RATIO and rss_m / rss_d >= GOAL_RATIO
    print(f"goal: both ratios >= {GOAL_RATIO:g} (issue 31): {'PASS' if ok_ratio else 'FAIL'}")
    # the exit code follows issue 31's goals and the memory bound; the 2 s start of issue 16
    # was given up for MLflow's public client (about 2 s of import and store set-up, in a
    # child process): it is printed above, not enforced
    return 0 if ok_ratio and ok_rss else 1


if __name__ == "__main__":
    sys.exit(main())
