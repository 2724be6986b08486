"""A monitoring pass over a real Delta inference table written by the serving writer
(:class:`InferenceTable`), with timestamps laid out in windows."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dbspec.errors import DbspecError
from dbspec.evaluation.metrics import task_metrics
from dbspec.monitoring import monitor
from dbspec.monitoring.labels import read_labels
from dbspec.monitoring.monitor import MonitorSettings, open_inference_table, scan_table
from dbspec.monitoring.windows import evaluate_windows
from dbspec.monitoring.profile import build_profile
from dbspec.serving.inference_table import InferenceTable, Record

FEATURES = tuple(f"x{j}" for j in range(10))
HOUR = 3600.0
T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z, on an hour


def _profile(rng):
    train = rng.normal(size=(400, 10))
    return build_profile(dict(zip(FEATURES, train.T)), {"prediction": train.sum(axis=1)},
                         task="regression")


def _write(path, rng, windows, *, rows_per_request=10, requests=60, version="1",
           shift=None):
    """One burst of requests per hour ``windows``; ``shift`` = (window, feature, by)."""
    table = InferenceTable(path, flush_seconds=0.05)
    table.check()
    table.start()
    number = 0
    for window in windows:
        for _ in range(requests):
            x = rng.normal(size=(rows_per_request, 10)).astype(np.float32)
            if shift is not None and shift[0] == window:
                x[:, FEATURES.index(shift[1])] += shift[2]
            number += 1
            table.offer(Record(f"r{number:06d}-{window}", T0 + window * HOUR + number * 0.01,
                               "m", version, 2.0 + rng.random(), FEATURES, x,
                               {"prediction": x.sum(axis=1).astype(np.float64)}))
    table.close()
    return number


def _pass(path, profile, settings=MonitorSettings(), **kwargs):
    scans = scan_table(open_inference_table(str(path)), "m", lambda version: profile, settings,
                       **{k: v for k, v in kwargs.items() if k == "labels"})
    return [evaluate_windows(s, settings, **kwargs) for s in scans]


def test_a_shifted_feature_alerts_in_its_window_only(tmp_path, monkeypatch):
    monkeypatch.setattr(monitor, "BATCH_ROWS", 250)  # requests run across batch boundaries
    rng = np.random.default_rng(0)
    profile = _profile(rng)
    _write(tmp_path / "t", rng, [0, 1, 2, 3], shift=(3, "x3", 5.0))
    [report] = _pass(tmp_path / "t", profile)
    assert [w.rows for w in report.windows] == [600] * 4
    assert [w.requests for w in report.windows] == [60] * 4
    assert [w.status for w in report.windows] == ["ok", "ok", "ok", "alert"]
    alerted = {a.split(":")[0] for a in report.windows[3].alerts}
    assert "x3" in alerted and alerted <= {"x3", "prediction"}
    assert report.drifted_columns()[0] == "x3"
    assert 2.0 <= report.windows[0].latency_p50_ms <= 3.0
    assert report.windows[0].start == T0


def test_since_leaves_earlier_windows_out(tmp_path):
    rng = np.random.default_rng(1)
    profile = _profile(rng)
    _write(tmp_path / "t", rng, [0, 1, 2])
    [report] = _pass(tmp_path / "t", profile, MonitorSettings(since=T0 + 2 * HOUR))
    assert [w.start for w in report.windows] == [T0 + 2 * HOUR]


def test_small_windows_are_reported_not_checked(tmp_path):
    rng = np.random.default_rng(2)
    profile = _profile(rng)
    _write(tmp_path / "t", rng, [0], requests=3, shift=(0, "x1", 9.0))
    [report] = _pass(tmp_path / "t", profile)
    assert report.windows[0].status == "too few rows" and not report.windows[0].alerts


def test_each_version_is_compared_with_its_own_profile(tmp_path):
    rng = np.random.default_rng(3)
    profile = _profile(rng)
    _write(tmp_path / "t", rng, [0], version="1")
    _write(tmp_path / "t", rng, [0], version="2")
    asked = []
    scans = scan_table(open_inference_table(str(tmp_path / "t")), "m",
                       lambda version: asked.append(version) or profile, MonitorSettings())
    assert sorted(asked) == ["1", "2"] and len(scans) == 2


def test_labels_give_quality_metrics_per_window(tmp_path):
    rng = np.random.default_rng(4)
    profile = _profile(rng)
    _write(tmp_path / "t", rng, [0, 1], rows_per_request=2, requests=100)
    rows = open_inference_table(str(tmp_path / "t")).dataset.to_table(
        columns=["request_id", "prediction", "timestamp"]).to_pandas()
    rows["row"] = rows.groupby("request_id").cumcount()
    late = rows["timestamp"] >= pd_timestamp(T0 + HOUR)
    # labels equal the predictions in the first hour, far off in the second
    rows["target"] = rows["prediction"] + np.where(late, 50.0, 0.1)
    pq.write_table(pa.Table.from_pandas(rows[["request_id", "row", "target"]]),
                   tmp_path / "labels.parquet")
    labels = read_labels(str(tmp_path / "labels.parquet"), "request_id", "target")
    [report] = _pass(tmp_path / "t", profile, labels=labels, score=task_metrics,
                     reference_metrics={"rmse": 1.0})
    first, second = report.windows
    assert first.labelled == second.labelled == 200
    assert first.quality["rmse"]["value"] == pytest.approx(0.1, rel=1e-4)
    assert not any(a.startswith("quality") for a in first.alerts)
    assert second.quality["rmse"]["drop"] == pytest.approx(49.0, rel=1e-3)
    assert any(a.startswith("quality: rmse") for a in second.alerts)


def pd_timestamp(seconds: float):
    import pandas as pd

    return pd.Timestamp(seconds, unit="s", tz="UTC")


def test_a_missing_table_is_a_clear_error(tmp_path):
    with pytest.raises(DbspecError, match="does not exist: serve the model"):
        open_inference_table(str(tmp_path / "nowhere"))
    (tmp_path / "plain").mkdir()
    with pytest.raises(DbspecError, match="is not a Delta table"):
        open_inference_table(str(tmp_path / "plain"))


def test_a_delta_table_of_another_kind_is_refused(tmp_path):
    from deltalake import write_deltalake

    write_deltalake(str(tmp_path / "other"), pa.table({"a": [1, 2]}))
    with pytest.raises(DbspecError, match="not an inference table: it has no request_id"):
        open_inference_table(str(tmp_path / "other"))


def test_labels_errors_are_clear(tmp_path):
    with pytest.raises(DbspecError, match="do not exist"):
        read_labels(str(tmp_path / "none.csv"), "request_id", "target")
    (tmp_path / "l.csv").write_text("request_id,y\na,1\na,2\n")
    with pytest.raises(DbspecError, match="no column 'target'"):
        read_labels(str(tmp_path / "l.csv"), "request_id", "target")
    with pytest.raises(DbspecError, match="more than once"):
        read_labels(str(tmp_path / "l.csv"), "request_id", "y")
    (tmp_path / "l.txt").write_text("x")
    with pytest.raises(DbspecError, match="expected a Delta table"):
        read_labels(str(tmp_path / "l.txt"), "request_id", "y")


def test_features_renamed_on_a_clash_are_found(tmp_path):
    """A feature named like a table column is stored as feature_<name>; the scan maps it."""
    rng = np.random.default_rng(5)
    names = ("timestamp", "x1")
    train = rng.normal(size=(300, 2))
    profile = build_profile(dict(zip(names, train.T)), {"prediction": train[:, 0]},
                            task="regression")
    table = InferenceTable(tmp_path / "t", flush_seconds=0.05)
    table.check()
    table.start()
    x = rng.normal(size=(200, 2)).astype(np.float32)
    x[:, 0] += 6.0
    table.offer(Record("r1", T0, "m", "1", 1.0, names, x, {"prediction": x[:, 1] * 0.0}))
    table.close()
    [report] = _pass(tmp_path / "t", profile)
    assert [c.column for c in report.windows[0].columns] == ["timestamp", "x1", "prediction"]
    assert report.drifted_columns()[0] == "timestamp"


def test_a_binary_classifier_gets_accuracy_from_labels(tmp_path):
    rng = np.random.default_rng(6)
    train = rng.normal(size=(500, 2))
    probability = 1 / (1 + np.exp(-train[:, 0]))
    profile = build_profile({"a": train[:, 0], "b": train[:, 1]},
                            {"prediction": np.where(probability >= 0.5, "yes", "no"),
                             "probability": probability},
                            task="binary", classes=["no", "yes"])
    table = InferenceTable(tmp_path / "t", flush_seconds=0.05)
    table.check()
    table.start()
    x = rng.normal(size=(400, 2)).astype(np.float32)
    p = 1 / (1 + np.exp(-x[:, 0].astype(np.float64)))
    table.offer(Record("r1", T0, "m", "1", 1.0, ("a", "b"), x,
                       {"prediction": np.where(p >= 0.5, "yes", "no"), "probability": p}))
    table.close()
    truth = np.where(p >= 0.5, "yes", "no")
    truth[:100] = np.where(truth[:100] == "yes", "no", "yes")  # 75% right
    pq.write_table(pa.table({"request_id": ["r1"] * 400, "row": np.arange(400), "label": truth}),
                   tmp_path / "labels.parquet")
    labels = read_labels(str(tmp_path / "labels.parquet"), "request_id", "label")
    [report] = _pass(tmp_path / "t", profile, labels=labels, score=task_metrics,
                     reference_metrics={"accuracy": 0.95})
    [window] = report.windows
    assert window.labelled == 400
    assert window.quality["accuracy"]["value"] == pytest.approx(0.75)
    assert any(a.startswith("quality: accuracy 0.75") for a in window.alerts)
    assert not any(c.drifted for c in window.columns)


def test_labels_on_a_key_the_table_lacks_are_a_clear_error(tmp_path):
    rng = np.random.default_rng(8)
    profile = _profile(rng)
    _write(tmp_path / "t", rng, [0], requests=2)
    (tmp_path / "l.csv").write_text("customer,target\na,1\n")
    labels = read_labels(str(tmp_path / "l.csv"), "customer", "target")
    with pytest.raises(DbspecError, match="labels join on 'customer', which the inference"):
        _pass(tmp_path / "t", profile, labels=labels, score=task_metrics,
              reference_metrics={"rmse": 1.0})


def test_one_label_per_multi_row_request_is_refused(tmp_path):
    """Labels keyed by request_id alone would give each row of a request the same label."""
    rng = np.random.default_rng(9)
    profile = _profile(rng)
    _write(tmp_path / "t", rng, [0], rows_per_request=3, requests=5)
    ids = open_inference_table(str(tmp_path / "t")).dataset.to_table(columns=["request_id"])
    first = ids.column("request_id")[0].as_py()
    (tmp_path / "l.csv").write_text(f"request_id,target\n{first},1\n")
    labels = read_labels(str(tmp_path / "l.csv"), "request_id", "target")
    with pytest.raises(DbspecError, match="add a 'row' column"):
        _pass(tmp_path / "t", profile, labels=labels, score=task_metrics,
              reference_metrics={"rmse": 1.0})


def test_a_table_without_the_model_features_is_a_clear_error(tmp_path):
    rng = np.random.default_rng(10)
    profile = _profile(rng)
    other = {**profile, "features": [f"z{j}" for j in range(10)],
             "columns": {**{f"z{j}": profile["columns"][f"x{j}"] for j in range(10)},
                         "prediction": profile["columns"]["prediction"]}}
    _write(tmp_path / "t", rng, [0], requests=2)
    with pytest.raises(DbspecError, match="has no column z0, z1, .*, z9 of m v1 .*is it the "
                                          "table this model's server writes"):
        _pass(tmp_path / "t", other)


def test_tables_it_cannot_read_are_clear_errors(tmp_path):
    """The inference table and the labels are read by their source kinds; the kinds' errors
    name the table, not ``data.source``."""
    (tmp_path / "t" / "_delta_log").mkdir(parents=True)
    with pytest.raises(DbspecError, match="cannot open the inference table") as refused:
        open_inference_table(str(tmp_path / "t"))
    assert "data.source" not in str(refused.value)
    (tmp_path / "l.parquet").write_text("not parquet")
    with pytest.raises(DbspecError, match="cannot read the labels .*l.parquet"):
        read_labels(str(tmp_path / "l.parquet"), "request_id", "y")
