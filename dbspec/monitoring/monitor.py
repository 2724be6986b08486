"""One monitoring pass over an inference table: stream it, window it, compare each window.

The Delta table is read batch by batch with the model name and ``--since`` pushed down as a
filter, and only bin counts are kept per window, so memory does not grow with the table. Each
model version in the table (a swap while serving) is compared with its own reference profile.
Its layout is checked first, and rows the server cannot have written are left out and counted
(:mod:`dbspec.monitoring.layout`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, NamedTuple, Optional

import numpy as np

from dbspec.errors import DbspecError
from dbspec.monitoring.drift import (ColumnDrift, Thresholds, WindowAccumulator, finite_or_none)
from dbspec.monitoring.gateway import gateway_usable, open_gateway_or
from dbspec.monitoring.labels import Labels, open_rows
from dbspec.monitoring.layout import (CLOCK_SKEW_S, FUTURE, NULL_VALUES, InferenceRows,
                                      check_base_columns, check_placed, read_batches,
                                      unusable_rows, version_columns)

CHECKS = ("features", "predictions", "missing", "out_of_range", "quality")
BATCH_ROWS = 65_536


@dataclass(frozen=True)
class MonitorSettings:
    """What one pass computes and when a window alerts."""

    window_s: int = 3600
    since: Optional[float] = None  # epoch seconds; None: the whole table
    min_rows: int = 100
    thresholds: Thresholds = Thresholds()
    checks: tuple = CHECKS
    version: Optional[str] = None  # only this model version's rows; None: every version
    until: Optional[float] = None  # later rows are left out; None: now + CLOCK_SKEW_S


@dataclass
class WindowReport:
    """One window of one version: its counts, each column's statistics, quality, alerts."""

    index: int
    start: float
    end: float
    rows: int
    requests: int
    latency_p50_ms: float
    latency_p95_ms: float
    columns: list[ColumnDrift] = field(default_factory=list)
    quality: dict[str, dict[str, float]] = field(default_factory=dict)
    labelled: int = 0
    checked: bool = True
    alerts: list[str] = field(default_factory=list)
    #: each column's counts on its reference bins (for the distribution plots)
    counts: dict[str, list[int]] = field(default_factory=dict)

    @property
    def status(self) -> str:
        return "alert" if self.alerts else "ok" if self.checked else "too few rows"

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "start": iso_utc(self.start), "end": iso_utc(self.end),
                "rows": self.rows, "requests": self.requests,
                "latency_p50_ms": finite_or_none(self.latency_p50_ms),
                "latency_p95_ms": finite_or_none(self.latency_p95_ms), "status": self.status,
                "alerts": self.alerts, "labelled": self.labelled,
                "quality": {k: {n: finite_or_none(v) for n, v in q.items()}
                            for k, q in self.quality.items()},
                "columns": [c.to_json() for c in self.columns]}


@dataclass
class VersionReport:
    """Every window of one model version in the pass."""

    name: str
    version: str
    profile: dict[str, Any]
    windows: list[WindowReport]
    #: rows left out of every window, by why (rows the server cannot have written)
    left_out: dict[str, int] = field(default_factory=dict)

    @property
    def alerts(self) -> list[str]:
        return [f"{iso_utc(w.start)}: {a}" for w in self.windows for a in w.alerts]

    def drifted_columns(self) -> list[str]:
        """Columns named in any alert, in profile order."""
        named = {a.split(":", 1)[0] for w in self.windows for a in w.alerts}
        return [c for c in self.profile["columns"] if c in named]


def iso_utc(seconds: float) -> str:
    """Epoch seconds as ``2026-01-31T12:00:00Z``."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def open_inference_table(path: str, model_name: Optional[str] = None,
                         since: Optional[float] = None,
                         version: Optional[str] = None) -> InferenceRows:
    """The inference table at ``path``, its base columns checked; an AI Gateway inference
    table is unpacked first (:mod:`dbspec.monitoring.gateway`, its rows are ``model_name``'s,
    those since ``since``, epoch seconds), in Spark for a catalog table name or a large table
    on a cluster (:mod:`dbspec.monitoring.gateway_spark`, rows of ``version`` only if given).

    Raises:
        DbspecError: no table there, not a Delta table, a Delta table of another kind, or
            base columns of other types than the server writes.
    """
    from dbspec.monitoring import gateway_spark as spark

    if spark.is_table_name(path):
        table = spark.open_catalog_table(path, model_name or "", since, version)
        check_base_columns(table)
        return table
    if "://" not in path and not (Path(path) / "_delta_log").is_dir():
        where = "does not exist" if not Path(path).exists() else "is not a Delta table"
        raise DbspecError(f"inference table {path} {where}: serve the model with an "
                          "inference table (serving.realtime.inference_table or dbspec serve "
                          "--inference-table PATH) first, or give --table PATH")
    table = InferenceRows(path, open_rows(path, "open the inference table"))
    session = spark.cluster_session(table)
    table = open_gateway_or(table, model_name, since) if session is None else \
        spark.open_delta_in_spark(session, path, model_name or "", since, version)
    check_base_columns(table)
    return table


class VersionScan:
    """The windows of one version seen so far, the table columns its profile maps to, and the
    rows left out."""

    def __init__(self, table: InferenceRows, name: str, version: str, profile: dict[str, Any]):
        self.name, self.version, self.profile = name, version, profile
        self.columns = version_columns(table, name, version, profile)  # profile -> table
        self.windows: dict[int, WindowAccumulator] = {}
        self.left_out: dict[str, int] = {}

    def window(self, index: int, window_s: int) -> WindowAccumulator:
        accumulator = self.windows.get(index)
        if accumulator is None:
            accumulator = self.windows[index] = WindowAccumulator(
                self.profile, list(self.columns), start=float(index * window_s))
        return accumulator

    def leave_out(self, why: str, rows: np.ndarray) -> np.ndarray:
        """Count the rows ``rows`` marks as left out for ``why``; the others."""
        count = int(np.count_nonzero(rows))
        if count:
            self.left_out[why] = self.left_out.get(why, 0) + count
        return ~rows


def scan_table(table: InferenceRows, name: str,
               profile_for: Callable[[str], Optional[dict[str, Any]]],
               settings: MonitorSettings, *, labels: Optional[Labels] = None,
               progress: Optional[Callable[[int, float], None]] = None) -> list[VersionScan]:
    """Stream the rows of model ``name`` (since ``settings.since``) into window accumulators.

    Args:
        table: The inference table (:func:`open_inference_table`).
        profile_for: A version's reference profile; None: leave that version's rows out.
        progress: Called with (rows so far, seconds since the start) every few seconds.

    Raises:
        DbspecError: a column of another type than the server writes, a profiled column
            missing, a row without a timestamp or version, or a data file it cannot read.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    scans: dict[str, Optional[VersionScan]] = {}  # None: a version left out
    window_us = settings.window_s * 1_000_000
    until = time.time() + CLOCK_SKEW_S if settings.until is None else settings.until
    carried: tuple[Optional[str], int] = (None, 0)  # the request running on from the last batch
    rows, started, told = 0, time.monotonic(), time.monotonic()
    condition = _condition(name, settings)
    for batch in read_batches(table, table.dataset.schema.names, condition, BATCH_ROWS):
        if batch.num_rows == 0:
            continue
        check_placed(table, batch)
        starts, row_in_request, carried = _request_rows(batch.column("request_id"), carried)
        stamps = batch.column("timestamp").cast(pa.int64()).to_numpy()  # Delta: UTC us
        future, windows = stamps > until * 1e6, stamps // window_us
        versions = batch.column("model_version")
        labelled = _label_rows(batch, labels, row_in_request) if labels is not None else None
        requests = _Requests(starts, batch.column("latency_ms").to_numpy(zero_copy_only=False),
                             labelled)
        for found in pc.unique(versions).to_pylist():
            if found not in scans:
                profile = profile_for(found)
                scans[found] = None if profile is None else \
                    VersionScan(table, name, found, profile)
            scan = scans[found]
            if scan is None:
                continue
            values = {c: batch.column(t).to_numpy(zero_copy_only=False)
                      for c, t in scan.columns.items()}
            in_version = pc.equal(versions, found).to_numpy(zero_copy_only=False)
            usable = gateway_usable(batch, scan.leave_out,
                                    in_version & scan.leave_out(FUTURE, in_version & future))
            usable &= scan.leave_out(NULL_VALUES, usable & unusable_rows(batch, scan.columns))
            for index in np.unique(windows[usable]):
                chosen = usable & (windows == index)
                _update(scan.window(int(index), settings.window_s), values,
                        slice(None) if chosen.all() else np.flatnonzero(chosen), requests,
                        scan.profile["outputs"])
        rows += batch.num_rows
        if progress is not None and time.monotonic() - told > 5:
            told = time.monotonic()
            progress(rows, told - started)
    return [scan for scan in scans.values() if scan is not None]


def _condition(name: str, settings: MonitorSettings):
    """The pushed-down filter: the model's rows (of ``settings.version``), since
    ``settings.since``."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    # rows with a null in a filtered column are kept: the scan refuses them (nothing hidden)
    condition = (ds.field("model_name") == name) | ds.field("model_name").is_null()
    if settings.version is not None:
        condition = condition & ((ds.field("model_version") == settings.version)
                                 | ds.field("model_version").is_null())
    if settings.since is not None:
        since = pa.scalar(int(settings.since * 1e6), pa.timestamp("us", tz="UTC"))
        condition = condition & ((ds.field("timestamp") >= since)
                                 | ds.field("timestamp").is_null())
    return condition


def _request_rows(ids, carried: tuple[Optional[str], int]):
    """(whether each row starts a request, each row's position in its request, what runs on
    into the next batch) for a batch's ``request_id`` column; ``carried``: the previous
    batch's last request id and the position its next row would have."""
    import pyarrow.compute as pc

    n = len(ids)
    starts = np.ones(n, dtype=bool)
    if n > 1:
        starts[1:] = pc.not_equal(ids.slice(1), ids.slice(0, n - 1)).to_numpy(
            zero_copy_only=False)
    last_id, position = carried
    starts[0] = last_id is None or ids[0].as_py() != last_id
    # rows of a request are contiguous: a row's position counts from its request's start (one
    # running on from the last batch starts ``position`` rows before this one)
    index = np.arange(n)
    offset = 0 if starts[0] else position
    row_in_request = index - np.maximum.accumulate(np.where(starts, index, -offset))
    return starts, row_in_request, (ids[n - 1].as_py(), int(row_in_request[-1]) + 1)


def _label_rows(batch, labels: Labels, row_in_request: np.ndarray) -> np.ndarray:
    """For each row, the index of its label in ``labels`` (-1: none)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if labels.key not in batch.schema.names:
        raise DbspecError(f"labels join on '{labels.key}', which the inference table does not "
                          f"have; set monitoring.labels.key to request_id or one of its columns")
    keys = batch.column(labels.key).cast(pa.string())
    if labels.by_row:
        keys = pc.binary_join_element_wise(keys, pa.array(row_in_request.astype(str)), "#")
    found = pc.index_in(keys, value_set=labels.keys).fill_null(-1).to_numpy()
    if not labels.by_row and labels.key == "request_id" and \
            bool(((found >= 0) & (row_in_request > 0)).any()):
        # one label per request would be given to each of its rows: wrong metrics, silently
        raise DbspecError("labels join on request_id alone, but requests here carry several "
                          "rows: add a 'row' column (the 0-based position in the request) to "
                          "the labels")
    return found


class _Requests(NamedTuple):
    """Per row of a batch: where each request starts, its latency, its label row (-1: none)."""

    starts: np.ndarray
    latency: np.ndarray
    labelled: Optional[np.ndarray]


def _update(window: WindowAccumulator, values: dict, rows: Any, requests: _Requests,
            outputs: list[str]) -> None:
    columns = {c: v[rows] for c, v in values.items()}
    window.update(columns, requests.latency[rows][requests.starts[rows]])
    if requests.labelled is not None:
        found = requests.labelled[rows]
        keep = found >= 0
        if keep.any():
            window.add_labels(found[keep], {c: v[keep] for c, v in columns.items()
                                            if c in outputs})
