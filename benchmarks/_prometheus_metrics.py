"""The candidate measured by ``prometheus_text.py``: :mod:`dbspec.serving.metrics` on
``prometheus_client`` (0.26), with the same series, names and help texts, in a registry of the
app's own. It was a drop-in (``http_limits`` calling ``.inc()``/``.dec()`` on its counters);
the measurement kept the hand-written module (see benchmarks/RESULTS.md).
"""

from __future__ import annotations

from typing import Callable, Iterator, Optional

from prometheus_client import (CollectorRegistry, Counter, Gauge, Histogram, Info,
                               disable_created_metrics, generate_latest)
from prometheus_client.core import CounterMetricFamily

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)

#: Connections the HTTP layer refused or cut, by reason (see :mod:`dbspec.serving.http_limits`).
HTTP_REFUSALS = ("too_many_connections", "headers_too_large", "header_timeout", "malformed",
                 "upgrade")


class ServerMetrics:
    """What ``GET /metrics`` reports; ``extra`` returns more counters (name: value) per scrape."""

    def __init__(self, extra: Optional[Callable[[], dict[str, int]]] = None):
        # the server's process is dbspec's own: no `<name>_created` series beside each counter
        disable_created_metrics()
        self.registry = registry = CollectorRegistry()
        self.model = Info("dbspec_model", "The model being served.", registry=registry)
        self.requests = Counter("dbspec_requests", "Requests answered, by path and HTTP status.",
                                ["path", "status"], registry=registry)
        self.latency = Histogram("dbspec_request_latency_seconds", "Latency of /invocations, "
                                 "receipt to response.", buckets=LATENCY_BUCKETS,
                                 registry=registry)
        self.batch_rows = Histogram("dbspec_batch_rows", "Rows per forward pass.",
                                    buckets=BATCH_BUCKETS, registry=registry)
        self.batch_requests = Histogram("dbspec_batch_requests", "Requests merged into one "
                                        "forward pass.", buckets=BATCH_BUCKETS, registry=registry)
        self.rows_scored = Counter("dbspec_rows_scored", "Rows scored.", registry=registry)
        self.model_swaps = Counter("dbspec_model_swaps", "Model versions swapped in by "
                                   "--watch-alias.", registry=registry)
        self.out_of_range_rows = Counter(
            "dbspec_out_of_range_rows", "Rows with a feature far outside the training range "
            "(serving.out_of_range), scored or refused.", registry=registry)
        self.out_of_range_values = Counter("dbspec_out_of_range_values", "Out-of-range values, "
                                           "by feature.", ["feature"], registry=registry)
        self.connections_open = Gauge("dbspec_http_connections_open", "Open HTTP connections.",
                                      registry=registry)
        refused = Counter("dbspec_http_refused", "Requests or connections refused before the app "
                          "saw them, by reason.", ["reason"], registry=registry)
        self.refused = {reason: refused.labels(reason) for reason in HTTP_REFUSALS}
        self.idle_closed = Counter(
            "dbspec_http_idle_closed", "Connections closed with no request in progress: idle "
            "for keep_alive_timeout_seconds, or silent at max_connections.", registry=registry)
        if extra is not None:
            registry.register(_Counters(extra))
        self._counted: dict[tuple[str, int], Counter] = {}  # requests' children, by label

    def request(self, path: str, status: int, seconds: float) -> None:
        counter = self._counted.get((path, status))
        if counter is None:
            counter = self._counted[path, status] = self.requests.labels(path, status)
        counter.inc()
        if path == "/invocations":
            self.latency.observe(seconds)

    def batch(self, requests: int, rows: int) -> None:
        self.batch_requests.observe(requests)
        self.batch_rows.observe(rows)
        self.rows_scored.inc(rows)

    def out_of_range(self, rows: int, per_feature: dict[str, int]) -> None:
        self.out_of_range_rows.inc(rows)
        for name, count in per_feature.items():
            self.out_of_range_values.labels(name).inc(count)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _Counters:
    """A collector of counters read at each scrape."""

    def __init__(self, read: Callable[[], dict[str, int]]):
        self.read = read

    def collect(self) -> Iterator[CounterMetricFamily]:
        for name, value in self.read().items():
            yield CounterMetricFamily(name, "Kept by the inference-table writer.", value=value)
