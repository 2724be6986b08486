"""Reading sources, checking columns, splitting and fitting preprocessing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dbspec.data.prepare import build_table, fit_preprocessing, split_rows
from dbspec.data.sources import DataError
from dbspec.seams.sources import source_kind
from dbspec.spec.sections.data import DataSpec


def data_spec(**overrides) -> DataSpec:
    base = {"source": {"kind": "csv", "path": "rows.csv"}, "task": "regression"}
    return DataSpec.model_validate({**base, **overrides})


@pytest.fixture
def frame():
    rng = np.random.default_rng(0)
    return pd.DataFrame({"a": rng.normal(5, 2, 100), "b": rng.normal(-1, 0.5, 100),
                         "label": rng.integers(0, 3, 100), "y": rng.normal(0, 1, 100)})


def test_target_missing_lists_the_columns(frame):
    with pytest.raises(DataError, match=r"no column 'z'; the data has: a, b, label, y"):
        build_table(frame, data_spec(target="z"))


def test_target_typo_suggests(frame):
    with pytest.raises(DataError, match=r"no column 'lable' \(did you mean 'label'\?\)"):
        build_table(frame, data_spec(target="lable"))


def test_non_numeric_features_are_named(frame):
    frame["city"] = "x"
    with pytest.raises(DataError, match=r"non-numeric columns city \((object|str)\)"):
        build_table(frame, data_spec(target="y"))


def test_infinite_values_are_refused(frame):
    frame.loc[3, "b"] = np.inf
    with pytest.raises(DataError, match="infinite values in b"):
        build_table(frame, data_spec(target="y"))


def test_missing_values_need_an_impute_step(frame):
    frame.loc[3, "a"] = np.nan
    spec = data_spec(target="y", features=["a", "b"], preprocessing=["standard_scale"])
    table = build_table(frame, spec)
    splits = split_rows(table, spec)
    with pytest.raises(DataError, match="missing values in a; put an impute step before it"):
        fit_preprocessing(spec, table, np.arange(100))
    fixed = data_spec(target="y", features=["a", "b"],
                      preprocessing=[{"impute": {"strategy": "median"}}, "standard_scale"])
    steps = fit_preprocessing(fixed, table, splits.train)
    assert [s.kind for s in steps] == ["impute", "scale"]


def test_binary_needs_two_classes(frame):
    with pytest.raises(DataError, match="binary needs exactly 2 target classes, found 3"):
        build_table(frame, data_spec(target="label", task="binary"))


def test_labels_are_encoded_and_kept(frame):
    frame["label"] = frame["label"].map({0: "cat", 1: "dog", 2: "eel"})
    table = build_table(frame, data_spec(target="label", task="multiclass", features=["a", "b"]))
    assert table.classes == ["cat", "dog", "eel"]
    assert set(np.unique(table.target)) == {0, 1, 2}


def test_split_is_reproducible_stratified_and_disjoint(frame):
    spec = data_spec(target="label", task="multiclass",
                     split={"validation": 0.2, "test": 0.2, "seed": 3})
    table = build_table(frame, spec)
    first, again = split_rows(table, spec), split_rows(table, spec)
    assert np.array_equal(first.test, again.test)
    sizes = (len(first.train), len(first.validation), len(first.test))
    assert sizes == (60, 20, 20)
    assert not set(first.train) & set(first.test)
    overall = np.bincount(table.target) / len(table.target)
    test_share = np.bincount(table.target[first.test], minlength=3) / len(first.test)
    assert np.abs(overall - test_share).max() < 0.06


def test_preprocessing_is_fitted_on_training_rows_only(frame):
    spec = data_spec(target="y", features=["a"], preprocessing=["standard_scale"])
    table = build_table(frame, spec)
    train = np.arange(50)
    (step,) = fit_preprocessing(spec, table, train)
    assert step.params["center"][0] == pytest.approx(table.features[train, 0].mean(), rel=1e-5)


def test_csv_source_and_version(tmp_path, frame):
    path = tmp_path / "rows.csv"
    frame.to_csv(path, index=False)
    spec = data_spec(source={"kind": "csv", "path": str(path)}, target="y")
    read = source_kind(spec).read(spec, base=Path.cwd())
    assert len(read.frame) == 100 and read.version == source_kind(spec).version(spec, base=Path.cwd())
    frame.iloc[:50].to_csv(path, index=False)
    assert source_kind(spec).version(spec, base=Path.cwd()) != read.version


def test_missing_file_is_a_data_error(tmp_path):
    spec = data_spec(source={"kind": "parquet", "path": str(tmp_path / "none.parquet")})
    with pytest.raises(DataError, match="does not exist"):
        source_kind(spec).read(spec, base=tmp_path)


def test_delta_time_travel_records_the_version(tmp_path, frame):
    from deltalake import write_deltalake

    path = tmp_path / "table"
    write_deltalake(str(path), frame.iloc[:40])
    write_deltalake(str(path), frame.iloc[40:], mode="append")
    latest = data_spec(source={"kind": "delta", "path": str(path)}, target="y")
    old = data_spec(source={"kind": "delta", "path": str(path), "version": 0}, target="y")
    assert len(source_kind(latest).read(latest, base=tmp_path).frame) == 100
    first = source_kind(old).read(old, base=tmp_path)
    assert len(first.frame) == 40 and first.version == "delta-v0"
    assert source_kind(latest).version(latest, base=tmp_path) == "delta-v1"
    missing = data_spec(source={"kind": "delta", "path": str(path), "version": 7}, target="y")
    with pytest.raises(DataError, match="cannot open Delta table .* at version 7"):
        source_kind(missing).read(missing, base=tmp_path)


def test_delta_timestamp_before_the_first_commit_is_refused(tmp_path, frame):
    """delta-rs would read version 0 for a time at which the table did not exist."""
    import time
    from datetime import datetime, timezone

    from deltalake import DeltaTable, write_deltalake

    path = tmp_path / "table"
    write_deltalake(str(path), frame.iloc[:40])
    time.sleep(1.1)
    write_deltalake(str(path), frame.iloc[40:], mode="append")
    before = data_spec(source={"kind": "delta", "path": str(path),
                               "timestamp": "2001-01-01T00:00:00Z"}, target="y")
    with pytest.raises(DataError, match=r"data.source.timestamp: 2001-01-01T00:00:00\+00:00 is "
                                        "before the first commit"):
        source_kind(before).read(before, base=tmp_path)
    with pytest.raises(DataError, match="before the first commit"):
        source_kind(before).version(before, base=tmp_path)
    # between the commits, written without a zone (taken as UTC): version 0's rows
    first, second = sorted(entry["timestamp"] for entry in DeltaTable(str(path)).history())
    between = datetime.fromtimestamp((first + second) / 2000, tz=timezone.utc) \
        .replace(tzinfo=None).isoformat()
    middle = data_spec(source={"kind": "delta", "path": str(path), "timestamp": between},
                       target="y")
    read = source_kind(middle).read(middle, base=tmp_path)
    assert read.version == "delta-v0" and len(read.frame) == 40


def test_repeated_csv_column_names_are_refused(tmp_path):
    """pandas would read them as ``a`` and ``a.1`` without a word."""
    path = tmp_path / "rows.csv"
    path.write_text("a;b;a;y\n1;2;3;4\n5;6;7;8\n")
    spec = data_spec(source={"kind": "csv", "path": str(path), "delimiter": ";"}, target="y")
    with pytest.raises(DataError, match=r"rows.csv:1: repeated column name\(s\) 'a'"):
        source_kind(spec).read(spec, base=tmp_path)


def test_not_a_delta_table(tmp_path):
    (tmp_path / "plain").mkdir()
    spec = data_spec(source={"kind": "delta", "path": str(tmp_path / "plain")})
    with pytest.raises(DataError, match="not a Delta table"):
        source_kind(spec).read(spec, base=tmp_path)


def test_synthetic_source_is_deterministic():
    spec = data_spec(source={"kind": "synthetic", "rows": 300, "features": 7, "classes": 3,
                             "seed": 5}, task="multiclass")
    a, b = source_kind(spec).read(spec, base=Path.cwd()), source_kind(spec).read(spec, base=Path.cwd())
    assert a.frame.equals(b.frame) and a.frame.shape == (300, 8)
    assert set(a.frame["target"]) == {0, 1, 2}


def test_a_table_of_100000_feature_columns_is_built_and_scaled():
    """Feature and step columns are looked up by hash (lists made this minutes long)."""
    names = [f"f{i}" for i in range(100_000)]
    wide = pd.DataFrame(np.arange(200_000, dtype=np.float32).reshape(2, -1), columns=names)
    wide["y"] = [0.5, 1.5]
    spec = data_spec(target="y", preprocessing=[{"standard_scale": {"columns": names[::-1]}}])
    table = build_table(wide, spec)
    assert table.features.shape == (2, 100_000) and table.feature_names[-1] == "f99999"
    (step,) = fit_preprocessing(spec, table, np.arange(2))
    assert step.columns[:2] == [99_999, 99_998] and len(step.columns) == 100_000
