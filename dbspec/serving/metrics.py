"""Counters and histograms of the endpoint, rendered in Prometheus' text format (0.0.4).

Updated on the event loop only (one thread), so plain integers suffice; the inference-table
writer thread reports through its own counters, read when ``/metrics`` is rendered.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Callable

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class Histogram:
    """Cumulative buckets, sum and count, as Prometheus expects them."""

    def __init__(self, buckets: tuple):
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    def render(self, name: str, labels: str = "") -> list[str]:
        lines, running = [], 0
        sep = "," if labels else ""
        for bound, count in zip(self.buckets, self.counts):
            running += count
            lines.append(f'{name}_bucket{{{labels}{sep}le="{bound}"}} {running}')
        lines.append(f'{name}_bucket{{{labels}{sep}le="+Inf"}} {self.count}')
        suffix = f"{{{labels}}}" if labels else ""
        lines.append(f"{name}_sum{suffix} {self.sum:.6f}")
        lines.append(f"{name}_count{suffix} {self.count}")
        return lines


#: Connections the HTTP layer refused or cut, by reason (see :mod:`dbspec.serving.http_limits`).
HTTP_REFUSALS = ("too_many_connections", "headers_too_large", "header_timeout", "malformed",
                 "upgrade")


class ServerMetrics:
    """What ``GET /metrics`` reports."""

    def __init__(self):
        self.connections_open = 0
        self.refused = dict.fromkeys(HTTP_REFUSALS, 0)
        self.idle_closed = 0
        self.requests: dict[tuple[str, int], int] = {}
        self.latency = Histogram(LATENCY_BUCKETS)
        self.batch_rows = Histogram(BATCH_BUCKETS)
        self.batch_requests = Histogram(BATCH_BUCKETS)
        self.rows_scored = 0
        self.model_swaps = 0
        self.out_of_range_rows = 0
        self.out_of_range_values: dict[str, int] = {}  # per feature

    def request(self, path: str, status: int, seconds: float) -> None:
        key = (path, status)
        self.requests[key] = self.requests.get(key, 0) + 1
        if path == "/invocations":
            self.latency.observe(seconds)

    def batch(self, requests: int, rows: int) -> None:
        self.batch_requests.observe(requests)
        self.batch_rows.observe(rows)
        self.rows_scored += rows

    def out_of_range(self, rows: int, per_feature: dict[str, int]) -> None:
        self.out_of_range_rows += rows
        for name, count in per_feature.items():
            self.out_of_range_values[name] = self.out_of_range_values.get(name, 0) + count

    def render(self, model: dict[str, str], extra: Callable[[], dict[str, int]]) -> str:
        out: list[str] = []

        def family(name: str, kind: str, text: str, *samples: str) -> None:
            out.extend((f"# HELP {name} {text}", f"# TYPE {name} {kind}", *samples))

        labels = ",".join(f'{k}="{_escape(v)}"' for k, v in model.items())
        family("dbspec_model_info", "gauge", "The model being served.",
               f"dbspec_model_info{{{labels}}} 1")
        family("dbspec_requests_total", "counter", "Requests answered, by path and HTTP status.",
               *(f'dbspec_requests_total{{path="{_escape(path)}",status="{status}"}} {count}'
                 for (path, status), count in sorted(self.requests.items())))
        for name, text, histogram in (
                ("dbspec_request_latency_seconds", "Latency of /invocations, receipt to "
                 "response.", self.latency),
                ("dbspec_batch_rows", "Rows per forward pass.", self.batch_rows),
                ("dbspec_batch_requests", "Requests merged into one forward pass.",
                 self.batch_requests)):
            family(name, "histogram", text, *histogram.render(name))
        family("dbspec_rows_scored_total", "counter", "Rows scored.",
               f"dbspec_rows_scored_total {self.rows_scored}")
        family("dbspec_model_swaps_total", "counter", "Model versions swapped in by "
               "--watch-alias.", f"dbspec_model_swaps_total {self.model_swaps}")
        family("dbspec_out_of_range_rows_total", "counter", "Rows with a feature far outside "
               "the training range (serving.out_of_range), scored or refused.",
               f"dbspec_out_of_range_rows_total {self.out_of_range_rows}")
        family("dbspec_out_of_range_values_total", "counter", "Out-of-range values, by feature.",
               *(f'dbspec_out_of_range_values_total{{feature="{_escape(name)}"}} {count}'
                 for name, count in sorted(self.out_of_range_values.items())))
        family("dbspec_http_connections_open", "gauge", "Open HTTP connections.",
               f"dbspec_http_connections_open {self.connections_open}")
        family("dbspec_http_refused_total", "counter", "Requests or connections refused before "
               "the app saw them, by reason.",
               *(f'dbspec_http_refused_total{{reason="{reason}"}} {count}'
                 for reason, count in self.refused.items()))
        family("dbspec_http_idle_closed_total", "counter", "Connections closed with no request "
               "in progress: idle for keep_alive_timeout_seconds, or silent at max_connections.",
               f"dbspec_http_idle_closed_total {self.idle_closed}")
        for name, value in extra().items():
            out += [f"# TYPE {name} counter", f"{name} {value}"]
        return "\n".join(out) + "\n"


def _escape(value: str) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
