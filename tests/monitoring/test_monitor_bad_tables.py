"""``dbspec monitor`` fails closed on an inference table it cannot trust: one located error
(the table, the column), exit 1, nothing rolled back; rows dbspec serve cannot have written
(null values, dated in the future) are left out, counted and named.

The registered diabetes smoke model (two versions, v2 at @production) and tables written here
with ``deltalake`` in the layout ``dbspec serve`` writes, then damaged one way each.
"""

from __future__ import annotations

import time

import numpy as np
import pyarrow as pa
import pytest

from dbspec.errors import DbspecError
from dbspec.monitoring.monitor import MonitorSettings, open_inference_table, scan_table
from dbspec.monitoring.profile import build_profile
from dbspec.monitoring.report import render_version
from dbspec.monitoring.windows import evaluate_windows
from tests.conftest import ROOT, run_in_process
from tests.serving import conftest as serving
from tests.serving.conftest import FEATURES, NAME

registered = serving.registered  # the serving tests' two registered versions, as a fixture

NULL_VALUES = "with a null feature or prediction, which dbspec serve never writes"
YEAR_2100 = 4_102_444_800.0  # 2100-01-01T00:00:00Z
UTC_US = pa.timestamp("us", tz="UTC")


def _rows(n: int, *, at: float, version: str = "2", name: str = NAME, shift: float = 0.0,
          **replaced) -> pa.Table:
    """``n`` rows the way dbspec serve writes them (diabetes features, a prediction), dated
    ``at``; ``replaced``: columns replaced (None: dropped)."""
    from sklearn.datasets import load_diabetes

    x = load_diabetes().data[np.random.default_rng(0).integers(0, 442, n)].astype(np.float32)
    x[:, FEATURES.index("bmi")] += shift
    columns = {"request_id": pa.array([f"r{i}" for i in range(n)]),
               "timestamp": pa.array(np.full(n, int(at * 1e6)), UTC_US),
               "model_name": pa.array([name] * n), "model_version": pa.array([version] * n),
               "latency_ms": pa.array(np.full(n, 2.0))}
    columns.update({f: pa.array(x[:, j]) for j, f in enumerate(FEATURES)})
    columns["prediction"] = pa.array(np.full(n, 150.0))
    for column, values in replaced.items():
        if values is None:
            columns.pop(column)
        else:
            columns[column] = values
    return pa.table(columns)


def _nulls(n: int, kind=pa.float32()) -> pa.Array:
    return pa.nulls(n, kind)


def _table(path, *tables: pa.Table) -> str:
    from deltalake import write_deltalake

    for table in tables:
        write_deltalake(str(path), table, mode="append", schema_mode="merge")
    return str(path)


def _data_file(path):
    [found] = sorted(path.glob("*.parquet"))
    return found


def _truncate(path, keep) -> None:
    data = _data_file(path)
    data.write_bytes(data.read_bytes()[:keep(data.stat().st_size)])


ALL_NULL = {f: _nulls(300) for f in FEATURES} | {"prediction": _nulls(300, pa.float64())}


def _bad_table(case: str, path) -> str:
    """The inference table of one bad case (see ``CASES``), dated two minutes ago."""
    n, now = 300, time.time() - 120
    if case == "all values null":
        return _table(path, _rows(n, at=now, **ALL_NULL))
    if case == "9 of 10 features missing":
        return _table(path, _rows(n, at=now, **{f: None for f in FEATURES[1:]}))
    if case == "dated 2100":
        return _table(path, _rows(n, at=YEAR_2100, shift=0.5))
    if case in ("zero-byte file", "truncated file", "missing file"):
        _table(path, _rows(n, at=now))
        if case == "missing file":
            _data_file(path).unlink()
        else:
            _truncate(path, lambda size: 0 if case == "zero-byte file" else size // 2)
        return str(path)
    text = pa.array(["0.01"] * n)
    if case == "string feature":
        return _table(path, _rows(n, at=now, bmi=text))
    if case == "string prediction":
        return _table(path, _rows(n, at=now, prediction=text))
    if case == "string timestamp":
        return _table(path, _rows(n, at=now, timestamp=pa.array(["2026-12-04T10:00:00Z"] * n)))
    if case == "naive timestamp":
        return _table(path, _rows(n, at=now, timestamp=pa.array(
            np.full(n, int(now * 1e6)), pa.timestamp("us"))))
    stamps = pa.array([None] * 10 + [int(now * 1e6)] * (n - 10), UTC_US)
    if case == "null timestamp":
        return _table(path, _rows(n, at=now, timestamp=stamps))
    assert case == "null model_version"
    return _table(path, _rows(n, at=now, model_version=pa.array([None] * 10 + ["2"] * (n - 10),
                                                                 pa.string())))


#: case -> what the error must say (besides the table's path)
CASES = {
    "all values null": ["300 row(s)", "null feature or prediction", "nothing to monitor"],
    "9 of 10 features missing": ["no column", "sex, bmi, bp, s1, s2"],
    "dated 2100": ["300 row(s)", "dated after"],
    "zero-byte file": ["cannot read", ", data file part-"],
    "truncated file": ["cannot read", ", data file part-"],
    "missing file": ["cannot read", ", data file part-"],
    "string feature": ["column 'bmi'", "string", "expected numbers"],
    "string prediction": ["column 'prediction'", "string", "expected numbers"],
    "string timestamp": ["column 'timestamp'", "string", "time zone"],
    "naive timestamp": ["column 'timestamp'", "timestamp[us]", "no time zone"],
    "null timestamp": ["column 'timestamp' is null", "10 row(s)"],
    "null model_version": ["column 'model_version' is null", "10 row(s)", "not the registry"],
}


@pytest.fixture(scope="module")
def production(registered):
    """v1, then v2 at @production: a rollback would move it back to v1."""
    env = {"MLFLOW_TRACKING_URI": registered.tracking_uri}
    for version in ("1", "2"):
        moved = run_in_process("promote", NAME, version, "--alias", "production", "--force",
                               cwd=registered.workdir, env=env)
        assert moved.returncode == 0, moved.stderr
    return registered


def _holder(registered) -> str:
    from mlflow import MlflowClient

    client = MlflowClient(registered.tracking_uri)
    return str(client.get_model_version_by_alias(NAME, "production").version)


@pytest.mark.parametrize("case", list(CASES))
def test_a_table_it_cannot_trust_is_one_located_error_and_nothing_rolls_back(
        production, tmp_path, case):
    """The diabetes spec's own monitoring section (on_alert: rollback, lookback 2h)."""
    table = _bad_table(case, tmp_path / "inference")
    env = {"MLFLOW_TRACKING_URI": production.tracking_uri}
    try:
        result = run_in_process("monitor", str(ROOT / "specs" / "diabetes.yaml"), "--set",
                                f"registry.name={NAME}", "--table", table,
                                cwd=production.workdir, env=env, timeout=300)
        assert result.returncode == 1, result.stdout + result.stderr
        assert "Traceback" not in result.stderr
        [error] = [line for line in result.stderr.splitlines() if line.startswith("error")]
        assert table in error, error
        for said in CASES[case]:
            assert said in error, error
        assert "rolled back" not in result.stdout
        assert _holder(production) == "2"
    finally:
        if _holder(production) != "2":
            moved = run_in_process("promote", NAME, "2", "--alias", "production", "--force",
                                   cwd=production.workdir, env=env)
            assert moved.returncode == 0, moved.stderr


def test_left_out_rows_are_counted_in_the_report_and_a_version_of_only_them_is_named(
        production, tmp_path):
    """v2: 300 rows, 100 more with null values; v1: only null rows. v2 is monitored on its
    300, the report says what was left out and why; v1 has nothing to monitor and says so."""
    import json

    nulls = {f: _nulls(100) for f in FEATURES} | {"prediction": _nulls(100, pa.float64())}
    now = time.time() - 120
    table = _table(tmp_path / "inference", _rows(300, at=now), _rows(100, at=now, **nulls),
                   _rows(100, at=now, version="1", **nulls))
    result = run_in_process("monitor", f"models:/{NAME}", "--table", table, "--on-alert",
                            "none", "--json", cwd=production.workdir,
                            env={"MLFLOW_TRACKING_URI": production.tracking_uri})
    assert result.returncode in (0, 3), result.stdout + result.stderr
    [v2] = json.loads(result.stdout)["versions"]
    assert v2["version"] == "2" and sum(w["rows"] for w in v2["windows"]) == 300
    assert v2["left_out"] == {NULL_VALUES: 100}
    assert f"warning: {NAME} v1: 100 row(s) left out: 100 {NULL_VALUES}; nothing of it to " \
        "monitor" in result.stderr


# -- the scan itself, on a synthetic profile (no registry) --------------------------------------

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z


def _profile():
    train = np.random.default_rng(0).normal(size=(400, 10)).astype(np.float32)
    return build_profile(dict(zip(FEATURES, train.T)), {"prediction": train.sum(axis=1)},
                         task="regression")


def _synthetic(n: int, *, at: float, **replaced) -> pa.Table:
    x = np.random.default_rng(1).normal(size=(n, 10)).astype(np.float32)
    columns = {f: pa.array(x[:, j]) for j, f in enumerate(FEATURES)}
    columns["prediction"] = pa.array(x.sum(axis=1).astype(np.float64))
    return _rows(n, at=at, name="m", version="1", **{**columns, **replaced})


def _scan(path, settings=MonitorSettings()):
    return scan_table(open_inference_table(str(path)), "m", lambda version: _profile(), settings)


def test_rows_dated_in_the_future_are_left_out_of_every_look_back_and_counted(tmp_path):
    _table(tmp_path / "t", _synthetic(200, at=T0), _synthetic(50, at=YEAR_2100))
    for settings in (MonitorSettings(), MonitorSettings(since=T0 - 3600)):
        [scan] = _scan(tmp_path / "t", settings)
        assert [w.start for w in scan.windows.values()] == [T0]
        assert [w.rows for w in scan.windows.values()] == [200]
        [(reason, count)] = scan.left_out.items()
        assert count == 50 and "dated after" in reason
    # a clock a few seconds ahead of this one is not the future
    _table(tmp_path / "t", _synthetic(10, at=time.time() + 30))
    [scan] = _scan(tmp_path / "t")
    assert sum(w.rows for w in scan.windows.values()) == 210


def test_rows_with_null_values_are_left_out_and_counted(tmp_path):
    """Rows dbspec serve cannot have written (it writes every feature and prediction) never
    reach a window: a window of them alone would alert on 100% missing values."""
    nulls = _synthetic(150, at=T0, bmi=_nulls(150), prediction=_nulls(150, pa.float64()))
    _table(tmp_path / "t", _synthetic(200, at=T0), nulls)
    [scan] = _scan(tmp_path / "t")
    assert [w.rows for w in scan.windows.values()] == [200]
    assert scan.left_out == {NULL_VALUES: 150}
    report = evaluate_windows(scan, MonitorSettings())
    assert report.left_out == {NULL_VALUES: 150}
    shown = render_version(report, table="t", window="1h")
    assert f"150 row(s) left out: 150 {NULL_VALUES}" in shown


def test_a_profiled_column_missing_from_the_table_is_an_error_naming_it(tmp_path):
    _table(tmp_path / "t", _synthetic(20, at=T0, s5=None, prediction=None))
    with pytest.raises(DbspecError, match=r"inference table .*t has no column s5, prediction "
                                          r"of m v1"):
        _scan(tmp_path / "t")


@pytest.mark.parametrize("column, values, said", [
    ("request_id", pa.array([None] * 5 + ["r"] * 15, pa.string()), "is null in at least 5"),
    ("model_name", pa.array([None] * 5 + ["m"] * 15, pa.string()), "is null in at least 5"),
    ("latency_ms", pa.array(["2.0"] * 20), "is string, expected numbers"),
    ("model_version", pa.array([2] * 20), "is int64, expected strings"),
])
def test_each_base_column_is_checked(tmp_path, column, values, said):
    _table(tmp_path / "t", _synthetic(20, at=T0, **{column: values}))
    with pytest.raises(DbspecError, match=f"inference table .*t: column '{column}' {said}"):
        _scan(tmp_path / "t")
