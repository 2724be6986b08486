"""A Databricks AI Gateway inference table, unpacked into the layout ``dbspec serve`` writes.

The gateway logs one row per request with the request and response as JSON text. Each answered
request's body (``dataframe_split``, ``dataframe_records``, ``inputs``, ``instances``) becomes
feature rows and its ``predictions`` the prediction columns (a list of plain values is the
``prediction`` column); JSON numbers become float32, as dbspec serve scores and logs them, so a
discrete feature matches its reference profile. The version is ``served_entity_id``'s
(:mod:`dbspec.monitoring.served_entities`: an ID looked up in Databricks' system table, or a
``<model>-<version>`` name). Rows the pass cannot use (a status other than
200, a logging error code, JSON it cannot read) are kept with the reason in :data:`LEFT_OUT`,
so the pass counts and reports them. The unpacking runs locally (pyarrow); the table's feature
rows are held in memory.
"""

from __future__ import annotations

import json
import sys
from typing import Any, Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dbspec.monitoring.layout import GATEWAY_COLUMNS, InferenceRows, read_batches
from dbspec.monitoring.served_entities import entity_versions

#: The unpacked table's column holding why a row is left out (null: it is used).
LEFT_OUT = "gateway_left_out"
NOT_ANSWERED = "request(s) answered with a status other than 200"
LOGGING_ERROR = "request(s) with a logging error code (payload not logged whole)"
UNPARSABLE = "request(s) whose request or response JSON cannot be unpacked"
MIXED = "row(s) with a value of another type than the rest of its column"


def is_gateway_table(table: InferenceRows) -> bool:
    """Whether ``table`` has the AI Gateway inference table's columns."""
    return all(c in table.dataset.schema.names for c in GATEWAY_COLUMNS)


def unpack_gateway_table(table: InferenceRows, model_name: str,
                         since: Optional[float] = None) -> InferenceRows:
    """``table`` (AI Gateway layout) as an in-memory table in dbspec serve's layout, rows of
    ``model_name`` since ``since`` (epoch seconds, pushed down); requests without a version or
    time are counted in a warning."""
    import pyarrow.dataset as ds

    rows: list[dict[str, Any]] = []
    unplaced: dict[str, int] = {}
    condition = None
    if since is not None:  # the column's own type: a naive timestamp is read as UTC
        kind = table.dataset.schema.field("request_time").type
        condition = (ds.field("request_time") >= pa.scalar(int(since * 1e6), pa.int64()).cast(
            pa.timestamp("us")).cast(kind)) | ds.field("request_time").is_null()
    entities = entity_versions(pc.unique(table.dataset.to_table(
        columns=["served_entity_id"], filter=condition).column(0)).to_pylist(), model_name)
    for batch in read_batches(table, list(GATEWAY_COLUMNS), condition, 4096):
        stamps = batch.column("request_time").cast(pa.timestamp("us")).cast(pa.int64())
        for record, stamp in zip(batch.to_pylist(), stamps.to_pylist()):
            entity = record["served_entity_id"]
            version = entities.versions.get(entity or "")
            if version is None or stamp is None:
                why = "no request_time" if stamp is None else entities.left_out.get(
                    entity, f"served entity {entity!r}: none named")
                unplaced[why] = unplaced.get(why, 0) + 1
                continue
            base = {"request_id": record["databricks_request_id"] or "", "timestamp": stamp,
                    "model_name": model_name, "model_version": version,
                    "latency_ms": record["execution_duration_ms"]}
            rows.extend({**base, **row} for row in _unpack(record))
    for why, count in unplaced.items():
        print(f"warning: {table.path}: {count:,} request(s) left out: {why}", file=sys.stderr)
    return InferenceRows(table.path, ds.dataset(_to_table(rows)))


_BASE_TYPES = {"request_id": pa.string(), "timestamp": pa.timestamp("us", tz="UTC"),
               "model_name": pa.string(), "model_version": pa.string(),
               "latency_ms": pa.float64(), LEFT_OUT: pa.string()}


def _to_table(rows: list[dict[str, Any]]) -> Any:
    """The unpacked rows as an Arrow table; a value of another kind than the rest of its
    column (a number among strings) leaves its row out, marked :data:`MIXED`."""
    names = dict.fromkeys(c for r in rows for c in r)
    for column in names:
        if column in _BASE_TYPES:
            continue
        kinds = [_kind(r.get(column)) for r in rows]
        common = max(set(kinds) - {None}, key=kinds.count, default=None)
        for row, kind in zip(rows, kinds):
            if kind not in (None, common):
                row[column] = None
                row[LEFT_OUT] = row.get(LEFT_OUT) or MIXED
    arrays = {c: pa.array([r.get(c) for r in rows], _BASE_TYPES.get(c)) for c in names} \
        if rows else {c: pa.array([], t) for c, t in _BASE_TYPES.items()}
    for column, values in arrays.items():  # dbspec's models score (and serve logs) float32
        if column not in _BASE_TYPES and pa.types.is_floating(values.type):
            arrays[column] = values.cast(pa.float32())
    return pa.table(arrays)


def _kind(value: Any) -> Optional[str]:
    return None if value is None else "number" if isinstance(value, (bool, int, float)) else \
        "text" if isinstance(value, str) else type(value).__name__


def _unpack(record: dict[str, Any]) -> list[dict[str, Any]]:
    """One gateway row -> its feature-and-prediction rows, or one row saying why none."""
    if record["status_code"] != 200:
        return [{LEFT_OUT: NOT_ANSWERED}]
    if record["logging_error_codes"]:
        return [{LEFT_OUT: LOGGING_ERROR}]
    try:
        features = _request_rows(json.loads(record["request"]))
        predictions = _prediction_rows(json.loads(record["response"]))
    except (TypeError, ValueError, KeyError, AttributeError):
        return [{LEFT_OUT: UNPARSABLE}]
    if len(features) != len(predictions) or not features:
        return [{LEFT_OUT: UNPARSABLE}]
    taken = {c.lower() for c in (*_BASE_TYPES, *predictions[0])}
    if any(c.lower() in taken for c in features[0]):  # as dbspec serve: rename the features
        features = [{f"feature_{c}": v for c, v in f.items()} for f in features]
    return [{**f, **p} for f, p in zip(features, predictions)]


def _request_rows(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of a model serving request body (MLflow's scoring protocol)."""
    if "dataframe_split" in body:
        split = body["dataframe_split"]
        return [dict(zip(split["columns"], row, strict=True)) for row in split["data"]]
    if "dataframe_records" in body:
        return [dict(row) for row in body["dataframe_records"]]
    given = body["inputs"] if "inputs" in body else body["instances"]
    if isinstance(given, dict):  # columns -> values
        return [dict(zip(given, row, strict=True)) for row in zip(*given.values(), strict=True)]
    return [dict(row) for row in given]


def _prediction_rows(body: dict[str, Any]) -> list[dict[str, Any]]:
    predictions = body["predictions"]
    if isinstance(predictions, dict):  # columns -> values
        return [dict(zip(predictions, row, strict=True))
                for row in zip(*predictions.values(), strict=True)]
    return [dict(p) if isinstance(p, dict) else {"prediction": p} for p in predictions]


def gateway_usable(batch: Any, leave_out: Any, rows: np.ndarray) -> np.ndarray:
    """``rows`` less those the gateway table marks as left out, counted by ``leave_out``
    (:meth:`VersionScan.leave_out`) for each reason."""
    if LEFT_OUT not in batch.schema.names:
        return rows
    reasons = batch.column(LEFT_OUT).to_numpy(zero_copy_only=False)
    for why in (NOT_ANSWERED, LOGGING_ERROR, UNPARSABLE, MIXED):
        rows = rows & leave_out(why, rows & (reasons == why))
    return rows


def open_gateway_or(table: InferenceRows, model_name: Optional[str],
                    since: Optional[float] = None) -> InferenceRows:
    """``table`` unpacked when it is an AI Gateway table (rows of ``model_name`` since
    ``since``), else as is."""
    return unpack_gateway_table(table, model_name or "", since) if is_gateway_table(table) \
        else table
