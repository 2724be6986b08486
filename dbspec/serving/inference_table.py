"""The inference table: every answered request appended to a Delta table, off the request path.

Requests hand their rows to a bounded queue (``put_nowait``, never a wait); a writer thread
drains it and appends to Delta with ``deltalake`` once a second or every ``flush_rows`` rows.
One table row per scored row: ``request_id``, ``timestamp`` (UTC), ``model_name``,
``model_version``, ``latency_ms``, the feature columns and the prediction columns. A full queue
drops the request's record and counts it (``dbspec_inference_log_dropped_total``).
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np


class Record(NamedTuple):
    request_id: str
    timestamp: float
    model_name: str
    model_version: str
    latency_ms: float
    feature_names: tuple
    features: np.ndarray
    predictions: dict[str, np.ndarray]


class InferenceTable:
    """A background Delta writer with a bounded queue."""

    def __init__(self, path: Path, *, queue_size: int = 10_000,
                 flush_seconds: float = 1.0, flush_rows: int = 20_000):
        self.path = Path(path)
        self.queue: queue.Queue = queue.Queue(maxsize=queue_size)
        self.flush_seconds = flush_seconds
        self.flush_rows = flush_rows
        self.dropped = 0  # incremented on the event loop only
        self.written_requests = 0
        self.written_rows = 0
        self.failed_writes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="dbspec-inference-table",
                                        daemon=True)

    def check(self) -> None:
        """Fail before serving when the table cannot be written, or is not an inference table.

        Raises:
            DbspecError: an unwritable path, or an existing Delta table of another kind.
        """
        import tempfile

        from deltalake import DeltaTable

        from dbspec.errors import DbspecError

        try:
            self.path.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=self.path, prefix=".dbspec-probe-"):
                pass
        except OSError as exc:
            raise DbspecError(f"inference table {self.path}: cannot write there: "
                              f"{exc.strerror or exc}") from None
        if (self.path / "_delta_log").is_dir():
            try:
                names = {f.name for f in DeltaTable(str(self.path)).schema().fields}
            except Exception as exc:  # a damaged log
                raise DbspecError(f"inference table {self.path}: cannot open it: {exc}") \
                    from None
            if not {"request_id", "timestamp", "model_version"} <= names:
                raise DbspecError(f"inference table {self.path} is a Delta table of another "
                                  "kind (no request_id, timestamp, model_version columns); "
                                  "give a new path")

    def start(self) -> None:
        """Start the writer (``dbspec serve`` runs :meth:`check` before it serves)."""
        self._thread.start()

    def offer(self, record: Record) -> None:
        """Queue a record; drop and count it when the queue is full."""
        try:
            self.queue.put_nowait(record)
        except queue.Full:
            self.dropped += 1

    def counters(self) -> dict[str, int]:
        return {"dbspec_inference_log_dropped_total": self.dropped,
                "dbspec_inference_log_written_requests_total": self.written_requests,
                "dbspec_inference_log_written_rows_total": self.written_rows,
                "dbspec_inference_log_failed_writes_total": self.failed_writes}

    def close(self, timeout: float = 30.0) -> None:
        """Write what is queued, then stop the writer."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _loop(self) -> None:
        pending: list[Record] = []
        rows = 0
        deadline = time.monotonic() + self.flush_seconds
        while True:
            stopping = self._stop.is_set()
            try:
                record = self.queue.get(timeout=max(0.0, deadline - time.monotonic()))
                pending.append(record)
                rows += len(record.features)
                if rows < self.flush_rows and time.monotonic() < deadline:
                    continue
            except queue.Empty:
                pass
            while True:  # take the rest without waiting
                try:
                    pending.append(self.queue.get_nowait())
                except queue.Empty:
                    break
            if pending:
                self._write(pending)
                pending, rows = [], 0
            if stopping and self.queue.empty():
                return
            deadline = time.monotonic() + self.flush_seconds

    def _write(self, records: list[Record]) -> None:
        from deltalake import write_deltalake

        groups: dict[tuple, list[Record]] = {}  # a swapped-in model may take other features
        for record in records:
            groups.setdefault(record.feature_names + tuple(record.predictions), []).append(record)
        try:
            for group in groups.values():
                write_deltalake(str(self.path), self._table(group), mode="append",
                                schema_mode="merge")
        except Exception as exc:  # a full disk must not take the endpoint down
            self.failed_writes += 1
            print(f"dbspec serve: inference table write of {len(records)} request(s) failed: "
                  f"{exc}", file=sys.stderr, flush=True)
            return
        self.written_requests += len(records)
        self.written_rows += sum(len(r.features) for r in records)

    def _table(self, records: list[Record]) -> Any:
        import pyarrow as pa

        counts = [len(r.features) for r in records]

        def repeat(values: list, kind) -> Any:
            return pa.array(np.repeat(np.asarray(values, dtype=object), counts).tolist(), kind)

        columns: dict[str, Any] = {
            "request_id": repeat([r.request_id for r in records], pa.string()),
            "timestamp": pa.array(np.repeat([int(r.timestamp * 1e6) for r in records], counts),
                                  pa.timestamp("us", tz="UTC")),
            "model_name": repeat([r.model_name for r in records], pa.string()),
            "model_version": repeat([r.model_version for r in records], pa.string()),
            "latency_ms": pa.array(np.repeat([r.latency_ms for r in records], counts),
                                   pa.float64()),
        }
        features = np.concatenate([r.features for r in records])
        names = list(records[0].feature_names)
        taken = {c.lower() for c in columns} | {c.lower() for c in records[0].predictions}
        if any(name.lower() in taken for name in names):  # keep every column, rename features
            names = [f"feature_{name}" for name in names]
        for j, name in enumerate(names):
            columns[name] = pa.array(features[:, j])
        for name in records[0].predictions:
            columns[name] = pa.array(np.concatenate([r.predictions[name] for r in records]))
        return pa.table(columns)
