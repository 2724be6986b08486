"""``dbspec monitor`` on a Databricks AI Gateway inference table: a real Delta table in the
gateway's layout whose request and response JSON are real requests to a real ``dbspec serve``
and its real answers, MLflow on SQLite.

The traffic: calm requests of the diabetes features (as ``dataframe_split``, ``inputs``,
``dataframe_records`` and ``instances`` bodies) plus a few rows the monitor cannot use (non-200,
a logging error code, an unparsable body, another version), then, an hour later, requests whose ``bmi`` is
shifted by five standard deviations. A calm table holds the calm hour and the unusable rows,
a drifted one both hours.
"""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import httpx
import numpy as np
import pytest

from tests.conftest import run_in_process
from tests.serving import conftest as serving
from tests.serving.conftest import AUTH, FEATURES, NAME, start_server

registered = serving.registered  # the serving tests' two registered versions, as a fixture

HOUR_S = 3600


def _body(batch: np.ndarray, shape: int) -> dict:
    if shape == 0:
        return {"dataframe_split": {"columns": FEATURES, "data": batch.tolist()}}
    if shape == 1:
        return {"inputs": {f: batch[:, i].tolist() for i, f in enumerate(FEATURES)}}
    records = [dict(zip(FEATURES, row)) for row in batch.tolist()]
    return {"dataframe_records": records} if shape == 2 else {"instances": records}


def _gateway_row(request_id: str, start: float, request: str, response: str, *,
                 status: int = 200, entity: str = f"{NAME}-1", errors=None) -> dict:
    return {"request_date": None, "databricks_request_id": request_id,
            "client_request_id": None, "request_time": int(start * 1e6),
            "status_code": status, "sampling_fraction": 1.0, "execution_duration_ms": 12,
            "request": request, "response": response, "served_entity_id": entity,
            "logging_error_codes": errors, "requester": "someone@example.com"}


def _write_gateway_table(path: str, rows: list[dict]) -> None:
    import pyarrow as pa
    from deltalake import write_deltalake

    schema = pa.schema([("request_date", pa.date32()), ("databricks_request_id", pa.string()),
                        ("client_request_id", pa.string()),
                        ("request_time", pa.timestamp("us", tz="UTC")),
                        ("status_code", pa.int32()), ("sampling_fraction", pa.float64()),
                        ("execution_duration_ms", pa.int64()), ("request", pa.string()),
                        ("response", pa.string()), ("served_entity_id", pa.string()),
                        ("logging_error_codes", pa.list_(pa.string())),
                        ("requester", pa.string())])
    write_deltalake(path, pa.Table.from_pylist(rows, schema=schema))


@pytest.fixture(scope="module")
def gateway(registered, tmp_path_factory):
    from sklearn.datasets import load_diabetes

    env = {"MLFLOW_TRACKING_URI": registered.tracking_uri}
    where = tmp_path_factory.mktemp("gateway")
    server = start_server(registered, f"models:/{NAME}/1", log=where / "serve.log")
    data = load_diabetes().data
    rng = np.random.default_rng(23)
    calm_at = (int(time.time()) // HOUR_S - 3) * HOUR_S
    rows: list[dict] = []
    try:
        for i in range(60):  # calm hour, then a shifted hour
            shifted = i >= 30
            batch = data[rng.integers(0, len(data), 8)].copy()
            if shifted:
                batch[:, FEATURES.index("bmi")] += 5 * data[:, FEATURES.index("bmi")].std()
            request = json.dumps(_body(batch, i % 4))
            answer = httpx.post(server.url + "/invocations", timeout=30, content=request,
                                headers={**AUTH, "Content-Type": "application/json"})
            assert answer.status_code == 200, answer.text
            start = calm_at + (HOUR_S if shifted else 0) + i
            rows.append(_gateway_row(f"r{i}", start, request, answer.text))
    finally:
        assert server.stop() == 0, server.output()
    good = rows[0]
    unusable = [_gateway_row("e1", calm_at + 40, good["request"], "", status=500),
             _gateway_row("e2", calm_at + 41, good["request"], "", status=429),
             _gateway_row("e3", calm_at + 42, "{not json", good["response"]),
             _gateway_row("e4", calm_at + 43, good["request"], good["response"],
                          errors=["MAX_REQUEST_SIZE_EXCEEDED"]),
             _gateway_row("e5", calm_at + 44, good["request"], good["response"],
                          entity=f"{NAME}-2")]  # another version: not watched
    calm, drifted = str(where / "calm"), str(where / "drifted")
    _write_gateway_table(calm, rows[:30] + unusable)
    _write_gateway_table(drifted, rows + unusable)
    return SimpleNamespace(calm=calm, drifted=drifted, env=env, workdir=registered.workdir,
                           rows=rows + unusable)


def _monitor(gateway, table: str, *args: str):
    return run_in_process("monitor", f"models:/{NAME}/1", "--table", table,
                          "--window", "1h", "--min-rows", "60", *args, cwd=gateway.workdir,
                          env=gateway.env, timeout=300)


def test_calm_gateway_traffic_passes_and_reports_the_rows_it_left_out(gateway):
    result = _monitor(gateway, gateway.calm, "--format", "json")
    assert result.returncode == 0, result.stdout + result.stderr
    (report,) = json.loads(result.stdout)["versions"]
    assert report["version"] == "1"
    calm = report["windows"][0]
    assert calm["status"] == "ok" and calm["rows"] == 30 * 8 and calm["requests"] == 30
    assert report["left_out"] == {
        "request(s) answered with a status other than 200": 2,
        "request(s) whose request or response JSON cannot be unpacked": 1,
        "request(s) with a logging error code (payload not logged whole)": 1}


def test_a_shifted_feature_in_gateway_traffic_is_named(gateway):
    result = _monitor(gateway, gateway.drifted)
    assert result.returncode == 3, result.stdout + result.stderr
    assert "bmi" in result.stderr.strip().splitlines()[-1]
    assert "2 request(s) answered with a status other than 200" in result.stdout


def test_every_body_shape_unpacks_and_what_cannot_be_placed_is_warned(tmp_path, capsys):
    from dbspec.monitoring.gateway import LEFT_OUT, MIXED, UNPARSABLE
    from dbspec.monitoring.monitor import open_inference_table

    at = 1_700_000_000.0
    bodies = [({"instances": [{"a": 1.5, "b": 2.0}]}, {"predictions": [3.0]}),
              ({"inputs": [{"a": 2.5, "b": 3.0}]}, {"predictions": {"y": [4.0]}}),
              ({"inputs": {"a": [3.5, 4.5], "b": [1.0, 2.0]}},
               {"predictions": [{"y": 5.0}, {"y": 6.0}]}),
              ({"dataframe_split": {"columns": ["a"], "data": [[1.0], [2.0]]}},
               {"predictions": [1.0]}),  # one prediction for two rows
              ({"dataframe_split": {"columns": ["a", "b"], "data": [[1.0]]}},
               {"predictions": [1.0]}),  # a row shorter than its columns
              ({"dataframe_records": [{"a": "x", "b": 1.0}]}, {"predictions": [1.0]}),
              ({"dataframe_records": [{"timestamp": 7.0}]}, {"predictions": [1.0]})]
    rows = [_gateway_row(f"r{i}", at + i, json.dumps(q), json.dumps(a))
            for i, (q, a) in enumerate(bodies)]
    rows += [_gateway_row("x1", at, rows[0]["request"], rows[0]["response"], entity="custom"),
             {**_gateway_row("x2", at, rows[0]["request"], rows[0]["response"]),
              "request_time": None}]
    _write_gateway_table(str(tmp_path / "t"), rows)
    table = open_inference_table(str(tmp_path / "t"), "m").dataset.to_table().to_pylist()
    used = [(r["request_id"], r["a"], r["b"], r["prediction"], r["y"], r["feature_timestamp"])
            for r in table if r[LEFT_OUT] is None]
    assert used == [("r0", 1.5, 2.0, 3.0, None, None), ("r1", 2.5, 3.0, None, 4.0, None),
                    ("r2", 3.5, 1.0, None, 5.0, None), ("r2", 4.5, 2.0, None, 6.0, None),
                    ("r6", None, None, 1.0, None, 7.0)]  # a feature named as a base column
    assert [r["request_id"] for r in table if r[LEFT_OUT] == MIXED] == ["r5"]  # "x" among numbers
    assert {r["model_name"] for r in table} == {"m"} and {r["model_version"] for r in table} \
        == {"1"}
    assert [r["request_id"] for r in table if r[LEFT_OUT] == UNPARSABLE] == ["r3", "r4"]
    warned = capsys.readouterr().err
    # an ID that is no <name>-<version> is looked up in Databricks' system table, which this
    # machine has not (the reason says why, with or without a Spark session; see
    # tests/monitoring/test_monitor_gateway_spark.py for the lookup)
    assert "1 request(s) left out: served entity 'custom': " in warned
    assert "1 request(s) left out: no request_time" in warned


def test_a_table_of_no_layout_still_names_the_serve_layout(tmp_path):
    import pyarrow as pa
    from deltalake import write_deltalake

    from dbspec.errors import DbspecError
    from dbspec.monitoring.monitor import open_inference_table

    write_deltalake(str(tmp_path / "t"), pa.table({"request": ["{}"], "status_code": [200]}))
    with pytest.raises(DbspecError, match=r"has no request_id, timestamp, model_name, "
                       r"model_version, latency_ms column\(s\) \(dbspec serve's\), nor "
                       r"databricks_request_id, request_time, response, served_entity_id, "
                       r"logging_error_codes, execution_duration_ms \(a Databricks AI Gateway"):
        open_inference_table(str(tmp_path / "t"), "m")


@pytest.mark.parametrize("zone", [None, "UTC"])
def test_since_is_pushed_down_and_a_naive_request_time_is_utc(tmp_path, zone):
    import pyarrow as pa
    from deltalake import write_deltalake

    from dbspec.monitoring.monitor import open_inference_table

    at = 1_700_000_000
    rows = [_gateway_row(f"r{i}", at + i * 60, json.dumps({"inputs": [{"a": 1.0}]}),
                         json.dumps({"predictions": [2.0]})) for i in range(3)]
    table = pa.Table.from_pylist(rows).drop_columns(["request_date", "client_request_id"])
    stamps = table.column("request_time").cast(pa.timestamp("us", tz=zone))
    write_deltalake(str(tmp_path / "t"), table.set_column(
        table.schema.get_field_index("request_time"), "request_time", stamps))
    read = open_inference_table(str(tmp_path / "t"), "m", since=at + 60).dataset.to_table()
    assert read.column("request_id").to_pylist() == ["r1", "r2"]
    assert read.column("timestamp").cast(pa.int64()).to_pylist() == \
        [(at + 60) * 1_000_000, (at + 120) * 1_000_000]


def test_served_entity_ids_may_come_as_any_iterable():
    """A ``<name>-<version>`` is read as it is; an ID is looked up in the system table, which
    this stand-in session cannot read (see test_monitor_gateway_spark.py for a lookup)."""
    from dbspec.monitoring.served_entities import entity_versions

    class NoSystemTables:
        def table(self, name):
            raise RuntimeError(f"[TABLE_OR_VIEW_NOT_FOUND] {name}")

    found = entity_versions((i for i in ["m-1", "4f" * 16, None]), "m", NoSystemTables())
    assert found.versions == {"m-1": "1"}
    assert found.left_out == {"4f" * 16: f"served entity '{'4f' * 16}': system.serving."
                              "served_entities cannot be read: [TABLE_OR_VIEW_NOT_FOUND] "
                              "system.serving.served_entities"}


def test_without_a_spark_session_an_id_names_where_it_would_be_looked_up(monkeypatch):
    """Off Databricks with no Spark session running (whatever another test in this worker
    started), an ID cannot be looked up: the reason says where it would be."""
    from dbspec.monitoring.served_entities import entity_versions
    from dbspec.spark import session

    monkeypatch.setattr(session, "session_at_hand", lambda: None)
    found = entity_versions(["4f" * 16], "m")
    assert found == ({}, {"4f" * 16: f"served entity '{'4f' * 16}': IDs are mapped to versions "
                          "through system.serving.served_entities: run on Databricks (or with "
                          "a Spark session that reads it)"})
