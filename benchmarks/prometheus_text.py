"""The endpoint's ``/metrics``: dbspec's hand-written Prometheus text
(:mod:`dbspec.serving.metrics`) against the same metrics on ``prometheus_client``
(``_prometheus_metrics.py``): import time, memory, and the cost per request and per scrape.

Each import (and one ``ServerMetrics()``) is timed in a fresh interpreter, twice: alone, and
after what ``dbspec serve`` has imported by then (uvicorn, numpy, asyncio); the latter is what
the server's cold start pays.

    PYTHONPATH=$PWD python benchmarks/prometheus_text.py [--repeats 15]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import timeit
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SERVER_IMPORTS = "import asyncio, json, numpy, uvicorn, httptools"

_PROBE = """
import sys, time
sys.path[:0] = [{root!r}, {here!r}]
import dbspec.serving  # the package around the module: loaded in both cases
{preload}
def rss():
    with open('/proc/self/status') as f:
        return next(int(l.split()[1]) for l in f if l.startswith('VmRSS')) / 1024
before, t = rss(), time.perf_counter()
import {module} as m
metrics = m.ServerMetrics()
print({{"seconds": time.perf_counter() - t, "rss_mib": rss() - before}})
"""


def import_cost(module: str, preload: str, repeats: int) -> tuple[float, float]:
    """Median (ms, MiB) of importing ``module`` and building its ServerMetrics."""
    runs = []
    for _ in range(repeats):
        out = subprocess.run([sys.executable, "-c", _PROBE.format(
            root=str(ROOT), here=str(HERE), module=module, preload=preload)], capture_output=True, text=True,
            check=True, cwd=ROOT).stdout
        runs.append(eval(out))  # noqa: S307 - our own probe's dict
    return (statistics.median(r["seconds"] for r in runs) * 1000,
            statistics.median(r["rss_mib"] for r in runs))


def request_cost(metrics, number: int) -> float:
    """µs of what one 1-row /invocations request records (its count, latency and batch)."""
    def one() -> None:
        metrics.request("/invocations", 200, 0.0012)
        metrics.batch(1, 1)

    return min(timeit.repeat(one, number=number, repeat=5)) / number * 1e6


def scrape_cost(render, number: int) -> tuple[float, int]:
    """(µs per render, bytes) of a scrape after some traffic."""
    body = render()
    return min(timeit.repeat(render, number=number, repeat=5)) / number * 1e6, len(body)


def fill(metrics) -> None:
    for i in range(2000):
        metrics.request("/invocations", (200, 400, 422)[i % 3], i / 1e5)
        metrics.batch(1 + i % 40, 1 + i % 300)
    for path in ("/ping", "/health", "/metrics", "other"):
        metrics.request(path, 200, 0.0)
    metrics.out_of_range(3, {"age": 2, "bmi": 1})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))
    import _prometheus_metrics as candidate

    from dbspec.serving import metrics as ours

    figures = {}
    for label, module in (("hand-written", "dbspec.serving.metrics"),
                          ("prometheus_client", "_prometheus_metrics")):
        alone = import_cost(module, "", args.repeats)
        served = import_cost(module, SERVER_IMPORTS, args.repeats)
        figures[label] = {"import_ms_alone": alone[0], "import_ms_in_server": served[0],
                          "rss_mib_alone": alone[1], "rss_mib_in_server": served[1]}
    old, new = ours.ServerMetrics(), candidate.ServerMetrics(lambda: {"x_total": 1})
    new.model.info({"model_name": "diabetes", "model_version": "3"})
    figures["hand-written"]["request_us"] = request_cost(old, 200_000)
    figures["prometheus_client"]["request_us"] = request_cost(new, 200_000)
    fill(old)
    fill(new)
    model = {"model_name": "diabetes", "model_version": "3"}
    figures["hand-written"]["scrape_us"], figures["hand-written"]["scrape_bytes"] = \
        scrape_cost(lambda: old.render(model, lambda: {"x_total": 1}).encode(), 2000)
    figures["prometheus_client"]["scrape_us"], figures["prometheus_client"]["scrape_bytes"] = \
        scrape_cost(new.render, 2000)
    print(f"{'measure':<22}{'hand-written':>14}{'prometheus_client':>19}{'ratio':>8}")
    for key in figures["hand-written"]:
        a, b = figures["hand-written"][key], figures["prometheus_client"][key]
        print(f"{key:<22}{a:>14.3f}{b:>19.3f}{b / a if a else float('nan'):>8.2f}")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
