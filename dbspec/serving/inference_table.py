"""The inference table: every answered request appended to a Delta table, kept through a kill.

One row per scored row: ``request_id``, ``timestamp`` (UTC), ``model_name``, ``model_version``,
``latency_ms``, the features and the predictions. Before its response is sent, a request is
appended to a write-ahead log (:mod:`dbspec.serving.wal`; no fsync: a killed process loses
nothing the kernel holds, an OS crash may lose its last ~30 s). A writer thread commits one
segment at a time to Delta, each commit carrying a transaction id (this server, the segment's
number), and deletes it. At the next start, :meth:`InferenceTable.recover` commits the segments
of dead servers (a live one holds its lock file): one the table already records is only
deleted, so no request is logged twice. Past ``queue_size`` waiting records, requests are
dropped and counted (``dbspec_inference_log_dropped_total``).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional

import numpy as np

from dbspec.faults import pause_point
from dbspec.filelocks import HostLock, LockBusy
from dbspec.serving.wal import WAL_DIR, Record, Segment, read_segment

__all__ = ["InferenceTable", "Record"]
_APP = "dbspec-serve-"  # + the writer: the Delta transaction identifier of a server's commits


class InferenceTable:
    """A write-ahead log on the request path and a background Delta writer."""

    def __init__(self, path: Path, *, queue_size: int = 10_000,
                 flush_seconds: float = 1.0, flush_rows: int = 20_000):
        self.path = Path(path)
        self.wal = self.path / WAL_DIR
        self.queue_size = queue_size
        self.flush_seconds = flush_seconds
        self.flush_rows = flush_rows
        self.writer = f"{int(time.time())}-{os.getpid()}-{os.urandom(3).hex()}"
        #: what /metrics reports, as ``dbspec_inference_log_<name>_total``
        self.counts = dict.fromkeys(("dropped", "written_requests", "written_rows",
                                     "failed_writes", "wal_errors", "replayed_requests"), 0)
        self._lock = threading.Lock()  # the current segment, the sealed ones, the pending count
        self._current: Optional[Segment] = None
        self._sealed: list[Segment] = []
        self._pending = 0
        self._numbers = iter(range(1, sys.maxsize))
        self._writer_lock: Optional[HostLock] = None
        self._wake = threading.Event()
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
            self.wal.mkdir(exist_ok=True)
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

    def recover(self) -> tuple[int, int]:
        """Commit what servers that died left in the write-ahead log (run after :meth:`check`).

        Returns:
            (requests committed now, bytes of cut-off records skipped).

        Raises:
            DbspecError: a segment could not be committed (it stays for the next start).
        """
        from dbspec.errors import DbspecError

        # a lock file with no segments is what a server killed before its first request left
        writers = sorted({p.name.split(".", 1)[0] for p in self.wal.glob("*.wal")}
                         | {p.name.split(".", 1)[0] for p in self.wal.glob("*.lock")})
        committed = skipped = 0
        for writer in writers:
            held = _take_lock(self.wal / f"{writer}.lock")
            if held is None:
                continue  # a live server's segments
            try:
                for path in sorted(self.wal.glob(f"{writer}.*.wal")):
                    number = int(path.name.split(".")[1])
                    records, cut = read_segment(path)
                    skipped += cut
                    if records and (_committed_version(self.path, writer) or 0) < number:
                        try:
                            self._commit(records, writer, number)
                        except Exception as exc:
                            raise DbspecError(f"inference table {self.path}: cannot commit the "
                                              f"requests a stopped server left in {path}: "
                                              f"{exc}") from None
                        committed += len(records)
                    path.unlink()
                (self.wal / f"{writer}.lock").unlink(missing_ok=True)
            finally:
                held.release()
        self.counts["replayed_requests"] = committed
        return committed, skipped

    def start(self) -> None:
        """Hold this server's lock, then start the writer (after :meth:`check`, :meth:`recover`)."""
        self.wal.mkdir(parents=True, exist_ok=True)
        self._writer_lock = _take_lock(self.wal / f"{self.writer}.lock")
        self._thread.start()

    def offer(self, record: Record) -> None:
        """Log ``record`` before its response goes out; drop and count it when ``queue_size``
        records already wait for Delta."""
        with self._lock:
            if self._pending >= self.queue_size:
                self.counts["dropped"] += 1
                return
            segment = self._current
            if segment is None:
                try:
                    segment = self._current = Segment(self.wal, self.writer, next(self._numbers))
                except OSError as exc:
                    self._wal_failed(exc)
                    return
            try:
                segment.append(record)
            except OSError as exc:  # a full disk: nothing after a cut record would be readable
                self._wal_failed(exc)
                self._seal()
                return
            self._pending += 1
            if segment.rows >= self.flush_rows:
                self._wake.set()

    def counters(self) -> dict[str, int]:
        return {f"dbspec_inference_log_{name}_total": n for name, n in self.counts.items()}

    def close(self, timeout: float = 30.0) -> None:
        """Commit what is logged, stop the writer, release the lock (a segment that could not be
        committed stays for the next start)."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        if self._writer_lock is not None:
            if not list(self.wal.glob(f"{self.writer}.*.wal")):
                (self.wal / f"{self.writer}.lock").unlink(missing_ok=True)
            self._writer_lock.release()
            self._writer_lock = None

    def _wal_failed(self, exc: OSError) -> None:
        self.counts["wal_errors"] += 1
        self.counts["dropped"] += 1
        if self.counts["wal_errors"] == 1:
            print(f"dbspec serve: inference table: cannot write the write-ahead log in "
                  f"{self.wal}: {exc.strerror or exc}; requests are not logged until it can",
                  file=sys.stderr, flush=True)

    def _seal(self) -> None:
        """Close the current segment for new records (under ``_lock``)."""
        if self._current is not None:
            self._current.close()
            if self._current.records:
                self._sealed.append(self._current)
            else:
                self._current.path.unlink(missing_ok=True)
            self._current = None

    def _loop(self) -> None:
        while True:
            self._wake.wait(self.flush_seconds)
            self._wake.clear()
            stopping = self._stop.is_set()
            with self._lock:
                self._seal()
                sealed = list(self._sealed)
            for segment in sealed:  # in order: a Delta txn version only grows
                if not self._write(segment):
                    break
            if stopping:
                return

    def _write(self, segment: Segment) -> bool:
        try:
            if segment.attempts and (_committed_version(self.path, self.writer) or 0) \
                    >= segment.number:
                pass  # the failed attempt had committed after all
            else:
                segment.attempts += 1
                self._commit(segment.records, self.writer, segment.number)
        except Exception as exc:  # a full disk must not take the endpoint down
            self.counts["failed_writes"] += 1
            if self.counts["failed_writes"] == 1 or segment.attempts == 1:
                print(f"dbspec serve: inference table write of {len(segment.records)} "
                      f"request(s) failed (kept in {segment.path}, retried): {exc}",
                      file=sys.stderr, flush=True)
            return False
        pause_point("inference_table.committed")  # a kill here must not log a request twice
        segment.path.unlink(missing_ok=True)
        with self._lock:
            self._sealed.remove(segment)
            self._pending -= len(segment.records)
        self.counts["written_requests"] += len(segment.records)
        self.counts["written_rows"] += segment.rows
        return True

    def _commit(self, records: list[Record], writer: str, number: int) -> None:
        import pyarrow as pa
        from deltalake import CommitProperties, Transaction, write_deltalake

        groups: dict[tuple, list[Record]] = {}  # a swapped-in model may take other features
        for record in records:
            groups.setdefault(record.feature_names + tuple(record.predictions), []).append(record)
        tables = [self._table(group) for group in groups.values()]
        data = tables[0] if len(tables) == 1 else pa.concat_tables(tables,
                                                                   promote_options="default")
        write_deltalake(str(self.path), data, mode="append", schema_mode="merge",
                        commit_properties=CommitProperties(
                            app_transactions=[Transaction(_APP + writer, number)]))

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


def _committed_version(path: Path, writer: str) -> Optional[int]:
    """The last segment number the table records for ``writer``; None for none (or no table)."""
    from deltalake import DeltaTable

    if not (path / "_delta_log").is_dir():
        return None
    return DeltaTable(str(path)).transaction_version(_APP + writer)


def _take_lock(path: Path) -> Optional[HostLock]:
    """The writer lock at ``path``, held; None when another live process holds it."""
    try:
        return HostLock(path).acquire(f"the inference-table writer lock {path}")
    except LockBusy:
        return None
