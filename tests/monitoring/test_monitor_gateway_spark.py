"""An AI Gateway inference table unpacked in Spark (local mode): a catalog table holding the
same rows as the Delta tables of ``test_monitor_gateway`` (real requests to a real ``dbspec
serve`` in all four body shapes, with non-200, logging-error, unparsable and other-version rows
mixed in) gives the same unpacked rows, windows and counts of rows left out as the local path,
and names the shifted feature."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_cli
from tests.monitoring.test_monitor_gateway import (_gateway_row, _monitor, _write_gateway_table,
                                                   gateway, registered)
from tests.serving.conftest import NAME

__all__ = ["gateway", "registered"]  # fixtures this module uses


def _as_spark_table(spark, delta_path: str, name: str) -> str:
    """The Delta table's rows saved as a table of the session's catalog."""
    spark.sql(f"DROP TABLE IF EXISTS {name}")
    spark.read.parquet(delta_path).write.saveAsTable(name)
    return f"default.{name}"


def _rows(path: str, model: str = "m", version=None) -> list[dict]:
    from dbspec.monitoring.monitor import open_inference_table

    rows = open_inference_table(path, model, version=version).dataset.to_table().to_pylist()
    rows = [r for r in rows if version is None or r["model_version"] == version]
    return sorted(rows, key=lambda r: (r["timestamp"], r["request_id"], json.dumps(r, default=str,
                                                                                   sort_keys=True)))


def test_every_body_shape_and_every_reason_unpacks_as_the_local_path_does(spark, tmp_path,
                                                                           capfd):
    from dbspec.monitoring.gateway import LEFT_OUT

    at = 1_700_000_000.0
    bodies = [({"instances": [{"a": 1.5, "b": 2.0}]}, {"predictions": [3.0]}),
              ({"inputs": [{"a": 2.5, "b": 3.0}]}, {"predictions": {"y": [4.0]}}),
              ({"inputs": {"a": [3.5, 4.5], "b": [1.0, 2.0]}},
               {"predictions": [{"y": 5.0}, {"y": 6.0}]}),
              ({"dataframe_split": {"columns": ["a", "b"], "data": [[1.0, 2], [2.0, 3]]}},
               {"predictions": [1.0, 2.0]}),
              ({"dataframe_split": {"columns": ["a"], "data": [[1.0], [2.0]]}},
               {"predictions": [1.0]}),  # one prediction for two rows
              ({"dataframe_split": {"columns": ["a", "b"], "data": [[1.0]]}},
               {"predictions": [1.0]}),  # a row shorter than its columns
              ({"inputs": {"a": [1.0, 2.0], "b": [1.0]}}, {"predictions": [1.0, 2.0]}),
              ({"dataframe_records": [{"a": "x", "b": 1.0}]}, {"predictions": [1.0]}),
              ({"dataframe_records": [{"timestamp": 7.0, "n": 3}]}, {"predictions": [1.0]}),
              ({"inputs": [[1.0, 2.0]]}, {"predictions": [1.0]}),  # rows without names
              ({"nothing": 1}, {"predictions": [1.0]})]
    rows = [_gateway_row(f"r{i}", at + i, json.dumps(q), json.dumps(a))
            for i, (q, a) in enumerate(bodies)]
    good = rows[0]  # a repeated key keeps its last value, as json.loads does
    rows += [_gateway_row("r11", at + 11, '{"dataframe_records": [{"a": 1.0, "a": 2.5, "b": 1.0}]}',
                          good["response"]),
             _gateway_row("e1", at + 20, good["request"], "", status=500),
             _gateway_row("e2", at + 21, "{not json", good["response"]),
             _gateway_row("e3", at + 22, good["request"], "[1,"),
             _gateway_row("e4", at + 23, good["request"], good["response"], errors=["X"]),
             _gateway_row("e5", at + 24, good["request"], good["response"], entity="m-2"),
             _gateway_row("x1", at, good["request"], good["response"], entity="custom"),
             {**_gateway_row("x2", at, good["request"], good["response"]),
              "request_time": None}]
    _write_gateway_table(str(tmp_path / "t"), rows)
    table = _as_spark_table(spark, str(tmp_path / "t"), "gateway_shapes")
    for version in (None, "1"):
        local, in_spark = _rows(str(tmp_path / "t"), version=version), _rows(table, version=version)
        assert in_spark == local
    assert [r["request_id"] for r in local if r[LEFT_OUT] is None] == \
        ["r0", "r1", "r2", "r2", "r3", "r3", "r8", "r11"]
    assert [r["a"] for r in local if r["request_id"] == "r11"] == [2.5]
    warned = capfd.readouterr().err
    for where in (str(tmp_path / "t"), table):
        assert f"{where}: 1 request(s) left out: served entity 'custom'" in warned
        assert f"{where}: 1 request(s) left out: no request_time" in warned


def test_served_traffic_unpacks_windows_and_counts_as_the_local_path_does(spark, gateway):
    for delta in (gateway.calm, gateway.drifted):
        table = _as_spark_table(spark, delta, "gateway_" + delta.rsplit("/", 1)[-1])
        assert _rows(table, NAME, "1") == _rows(delta, NAME, "1")
        local, in_spark = (_monitor(gateway, t, "--format", "json") for t in (delta, table))
        assert local.returncode == in_spark.returncode, in_spark.stdout + in_spark.stderr
        (expected,), (found,) = (json.loads(r.stdout)["versions"] for r in (local, in_spark))
        assert found["windows"] == expected["windows"] and found["left_out"] == \
            expected["left_out"] == {
                "request(s) answered with a status other than 200": 2,
                "request(s) whose request or response JSON cannot be unpacked": 1,
                "request(s) with a logging error code (payload not logged whole)": 1}


def test_a_shifted_feature_is_named_through_spark(spark, gateway):
    table = _as_spark_table(spark, gateway.drifted, "gateway_shifted")
    result = _monitor(gateway, table)
    assert result.returncode == 3, result.stdout + result.stderr
    assert "bmi" in result.stderr.strip().splitlines()[-1]
    assert "2 request(s) answered with a status other than 200" in result.stdout


def test_a_shifted_feature_is_named_on_a_table_of_served_entity_ids(spark, gateway, tmp_path,
                                                                    monkeypatch):
    """The served traffic as Databricks logs it: served entity IDs, mapped to versions by the
    system table (a temporary view stands in for it, as in the test below); calm passes and the
    shift is named, whether the table is unpacked in this process or in Spark."""
    import datetime

    from dbspec.monitoring import served_entities

    ids = {f"{NAME}-1": "4f" * 16, f"{NAME}-2": "7a" * 16}
    at = datetime.datetime(2026, 12, 1)
    spark.createDataFrame([(entity, NAME, name.rsplit("-", 1)[1], at)
                           for name, entity in ids.items()],
                          "served_entity_id string, entity_name string, entity_version string, "
                          "change_time timestamp").createOrReplaceTempView("entities_of_traffic")
    monkeypatch.setattr(served_entities, "SERVED_ENTITIES", "entities_of_traffic")
    for name in ("calm", "drifted"):
        rows = [{**r, "served_entity_id": ids[r["served_entity_id"]]} for r in gateway.rows
                if name == "drifted" or r["request_time"] < gateway.rows[30]["request_time"]
                or not r["databricks_request_id"].startswith("r")]
        _write_gateway_table(str(tmp_path / name), rows)
    for table in (str(tmp_path / "calm"), _as_spark_table(spark, str(tmp_path / "calm"),
                                                           "gateway_calm_ids")):
        calm = _monitor(gateway, table)
        assert calm.returncode == 0, calm.stdout + calm.stderr
    for table in (str(tmp_path / "drifted"), _as_spark_table(spark, str(tmp_path / "drifted"),
                                                              "gateway_drifted_ids")):
        drifted = _monitor(gateway, table)
        assert drifted.returncode == 3, drifted.stdout + drifted.stderr
        assert "bmi" in drifted.stderr.strip().splitlines()[-1]


def test_a_catalog_table_of_another_layout_or_types_or_none_is_a_located_error(spark):
    import pyspark.sql.functions as F

    from dbspec.errors import DbspecError
    from dbspec.monitoring.monitor import open_inference_table

    spark.sql("DROP TABLE IF EXISTS not_gateway")
    spark.createDataFrame([("{}", 200)], "request string, status_code int") \
        .write.saveAsTable("not_gateway")
    with pytest.raises(DbspecError, match=r"^default.not_gateway is not an inference table: it "
                       r"has no request_id, .* nor databricks_request_id, request_time, "):
        open_inference_table("default.not_gateway", "m")
    spark.sql("DROP TABLE IF EXISTS served_layout")
    spark.sql("SELECT 'q' AS request_id, timestamp_seconds(1700000000) AS timestamp, 'm' AS "
              "model_name, '1' AS model_version, 3.0D AS latency_ms, 1.5D AS a").write \
        .saveAsTable("served_layout")  # dbspec serve's layout: read as it is
    assert [(r["request_id"], r["a"]) for r in _rows("default.served_layout")] == [("q", 1.5)]
    row = _gateway_row("r", 1_700_000_000.0, "{}", "{}")
    frame = spark.createDataFrame([tuple(row.values())], ", ".join(
        f"{c} {t}" for c, t in zip(row, ("date", "string", "string", "bigint", "int", "double",
                                         "bigint", "string", "string", "string",
                                         "array<string>", "string"))))
    spark.sql("DROP TABLE IF EXISTS gateway_int_request")
    frame.withColumn("request", F.lit(7)).write.saveAsTable("gateway_int_request")
    with pytest.raises(DbspecError, match=r"^inference table default.gateway_int_request: column "
                       r"'request' is int, expected string \(a Databricks AI Gateway"):
        open_inference_table("default.gateway_int_request", "m")
    with pytest.raises(DbspecError, match=r"^inference table default.gateway_missing: Spark cannot read "
                       r"it: .*TABLE_OR_VIEW_NOT_FOUND"):
        open_inference_table("default.gateway_missing", "m")


def test_a_table_name_without_spark_at_hand_says_where_it_can_be_read(tmp_path):
    result = run_cli("monitor", f"models:/{NAME}/1", "--table", "main.ml.payload",
                     cwd=tmp_path, env={"DATABRICKS_RUNTIME_VERSION": ""})
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "inference table main.ml.payload does not exist as a path; to read it as a catalog " \
        "table, run on a Databricks cluster" in result.stderr


def test_a_large_gateway_delta_path_goes_to_a_session_that_reads_delta(spark, tmp_path,
                                                                       monkeypatch):
    from dbspec.errors import DbspecError
    from dbspec.monitoring import gateway_spark
    from dbspec.monitoring.monitor import open_inference_table

    path = str(tmp_path / "t")
    _write_gateway_table(path, [_gateway_row("r", 1_700_000_000.0, json.dumps(
        {"inputs": [{"a": 1.0}]}), json.dumps({"predictions": [2.0]}))])
    monkeypatch.setattr(gateway_spark, "SPARK_ROWS", 1)
    assert [r["a"] for r in _rows(path)] == [1.0]  # this session reads no Delta: read locally
    monkeypatch.setattr("dbspec.data.spark_sources.has_delta_format", lambda spark: True)
    assert not gateway_spark.spreads_work(spark)  # local mode: its work stays on this machine
    assert [r["a"] for r in _rows(path)] == [1.0]  # so the Python path reads it
    # a stand-in for a multi-node cluster's session (none runs here): it goes to Spark
    monkeypatch.setattr(gateway_spark, "spreads_work", lambda spark: True)
    with pytest.raises(DbspecError, match=rf"^inference table {path}: Spark cannot read it: "
                       r".*(?i:delta)"):
        open_inference_table(path, "m")


def test_served_entity_ids_are_looked_up_in_the_system_table(spark, tmp_path, monkeypatch,
                                                              capfd):
    """Databricks logs the served entity's ID (32 hex digits), and
    system.serving.served_entities maps it to the model and its version, one row per endpoint
    configuration. No Unity Catalog runs here: a temporary view of the system table's columns
    stands in for it (the module constant names the table)."""
    import datetime

    from dbspec.monitoring import served_entities
    from dbspec.monitoring.gateway import LEFT_OUT

    ours, other, unknown = "2c5e22cf20044862812dfb724749c87c", "9" * 32, "a" * 32
    at = datetime.datetime(2026, 12, 1)
    spark.createDataFrame(
        [(ours, "main.ml.m", "2", at), (ours, "main.ml.m", "3", at + datetime.timedelta(1)),
         (other, "main.ml.other", "1", at)],
        "served_entity_id string, entity_name string, entity_version string, "
        "change_time timestamp").createOrReplaceTempView("served_entities_stand_in")
    monkeypatch.setattr(served_entities, "SERVED_ENTITIES", "served_entities_stand_in")
    good = _gateway_row("r", 1_700_000_000.0, json.dumps({"inputs": [{"a": 1.0}]}),
                        json.dumps({"predictions": [2.0]}))
    _write_gateway_table(str(tmp_path / "t"), [
        {**good, "databricks_request_id": name, "served_entity_id": entity}
        for name, entity in (("r0", ours), ("r1", other), ("r2", unknown), ("r3", "m-1"))])
    table = _as_spark_table(spark, str(tmp_path / "t"), "gateway_ids")
    for where in (str(tmp_path / "t"), table):  # this process, then Spark
        rows = _rows(where, "main.ml.m")
        assert [(r["request_id"], r["model_version"]) for r in rows if r.get(LEFT_OUT) is None] \
            == [("r0", "3"), ("r3", "1")]  # the latest configuration's; a name as it is
        warned = capfd.readouterr().err
        assert f"served entity '{other}' serves main.ml.other, not main.ml.m" in warned
        assert f"served entity '{unknown}': not in served_entities_stand_in" in warned

    monkeypatch.setattr(served_entities, "SERVED_ENTITIES", "no_such_system_table")
    assert [r["request_id"] for r in _rows(table, "main.ml.m")] == ["r3"]
    assert f"1 request(s) left out: served entity '{ours}': no_such_system_table cannot be " \
           "read: " in capfd.readouterr().err
