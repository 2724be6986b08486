"""The inference table's write-ahead log: framed, checksummed JSON records in segment files.

A segment is ``<table>/.dbspec-wal/<writer>.<number>.wal``; a record is a frame (payload
length, crc32) and its JSON, appended with one ``os.write`` so a killed process loses nothing
the kernel holds. :func:`read_segment` stops at a record cut by the kill.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

WAL_DIR = ".dbspec-wal"
_FRAME = struct.Struct("<II")  # payload length, crc32 of the payload

try:
    import orjson

    def _encode(value: dict) -> bytes:
        return orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY, default=_tolist)

    def _decode(payload: bytes) -> Any:
        return orjson.loads(payload)
except ImportError:  # pragma: no cover - orjson comes with the serve extra
    def _encode(value: dict) -> bytes:
        return json.dumps(value, default=_tolist, separators=(",", ":")).encode()

    def _decode(payload: bytes) -> Any:
        return json.loads(payload)


def _tolist(value: Any) -> Any:
    if isinstance(value, (np.ndarray, np.generic)):
        return value.tolist()
    raise TypeError(f"cannot log {type(value).__name__}")


class Record(NamedTuple):
    """One answered request: who scored it, when, how fast, its features and predictions."""

    request_id: str
    timestamp: float
    model_name: str
    model_version: str
    latency_ms: float
    feature_names: tuple
    features: np.ndarray
    predictions: dict[str, np.ndarray]


class Segment:
    """One write-ahead file and the records it holds, committed to Delta as one version."""

    def __init__(self, directory: Path, writer: str, number: int):
        self.number = number
        self.path = directory / f"{writer}.{number:08d}.wal"
        self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.records: list[Record] = []
        self.rows = 0
        self.attempts = 0

    def append(self, record: Record) -> None:
        """Write ``record`` to the file (raises OSError), then hold it for the Delta commit."""
        payload = _encode({"id": record.request_id, "ts": record.timestamp,
                           "model": record.model_name, "version": record.model_version,
                           "latency_ms": record.latency_ms, "features": record.feature_names,
                           "x": record.features, "p": record.predictions,
                           "dtypes": {k: v.dtype.str for k, v in record.predictions.items()}})
        view = memoryview(_FRAME.pack(len(payload), zlib.crc32(payload)) + payload)
        while view:
            view = view[os.write(self.fd, view):]
        self.records.append(record)
        self.rows += len(record.features)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def read_segment(path: Path) -> tuple[list[Record], int]:
    """The records of a segment file, and how many bytes at its end were not a whole record
    (a write cut by the kill; that request was not answered, as records are written first)."""
    data = path.read_bytes()
    records, at = [], 0
    while at + _FRAME.size <= len(data):
        size, crc = _FRAME.unpack_from(data, at)
        payload = data[at + _FRAME.size: at + _FRAME.size + size]
        if len(payload) < size or zlib.crc32(payload) != crc:
            break
        value = _decode(payload)
        names = tuple(value["features"])
        records.append(Record(
            value["id"], value["ts"], value["model"], value["version"], value["latency_ms"],
            names, np.asarray(value["x"], dtype=np.float32).reshape(-1, len(names)),
            {k: np.asarray(v, dtype=value["dtypes"][k]) for k, v in value["p"].items()}))
        at += _FRAME.size + size
    return records, len(data) - at
