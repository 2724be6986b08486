"""Every built-in data source behind the seam: the protocol, one reader for every path (the
local read, the batched read shard conversion uses, Spark's), versions and located errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from dbspec.data.sources import DataError
from dbspec.seams.sources import SOURCES, DataSource, source_kind
from dbspec.spec.sections.data import DataSpec

BUILT_IN = ("sklearn", "csv", "parquet", "delta", "synthetic", "spark_table")


@pytest.mark.parametrize("name", BUILT_IN)
def test_every_built_in_kind_keeps_the_protocol(name):
    kind = SOURCES.get(name)
    assert isinstance(kind, DataSource)
    assert kind.name == name
    assert kind.model.model_fields["kind"].annotation.__args__ == (name,)


def _data(source: dict) -> DataSpec:
    return DataSpec.model_validate({"source": source, "task": "regression",
                                    "target": "target"})


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """The diabetes rows as CSV, Parquet and a Delta table."""
    from deltalake import write_deltalake
    from sklearn.datasets import load_diabetes

    root = tmp_path_factory.mktemp("sources")
    frame = load_diabetes(as_frame=True).frame
    frame.to_csv(root / "rows.csv", index=False)
    frame.to_parquet(root / "rows.parquet", index=False)
    write_deltalake(str(root / "rows_delta"), frame)
    return {"csv": root / "rows.csv", "parquet": root / "rows.parquet",
            "delta": root / "rows_delta"}


@pytest.mark.parametrize("name", ("csv", "parquet", "delta"))
def test_the_local_and_the_batched_read_give_the_same_rows(files, name):
    data = _data({"kind": name, "path": str(files[name])})
    kind = source_kind(data)
    read = kind.read(data, base=Path.cwd())
    opened = kind.open(data, base=Path.cwd())
    batched = opened.dataset.to_table().to_pandas()
    assert read.version == opened.version == kind.version(data, base=Path.cwd())
    assert read.version.startswith(f"{name}-")
    assert list(batched.columns) == list(read.frame.columns)
    assert batched.shape == read.frame.shape == (442, 11)
    assert (batched["bmi"].astype(float).values == read.frame["bmi"].astype(float).values).all()


@pytest.mark.parametrize("name", ("sklearn", "synthetic"))
def test_generated_sources_read_the_same_everywhere(name):
    source = {"kind": "sklearn", "name": "diabetes"} if name == "sklearn" else \
        {"kind": "synthetic", "rows": 50, "features": 3}
    data = _data(source)
    kind = source_kind(data)
    read = kind.read(data, base=Path.cwd())
    opened = kind.open(data, base=Path.cwd())
    assert opened.dataset.to_table().num_rows == len(read.frame)
    assert kind.read_spark(None, data, base=Path.cwd()).version == read.version
    assert kind.known_width(data.source) == len(read.frame.columns) - 1


def test_a_spark_table_outside_spark_is_a_clear_error():
    data = _data({"kind": "spark_table", "table": "main.ml.rows"})
    for call in (lambda: source_kind(data).read(data, base=Path.cwd()),
                 lambda: source_kind(data).version(data, base=Path.cwd()),
                 lambda: source_kind(data).open(data, base=Path.cwd())):
        with pytest.raises(DataError, match="spark_table' is read through a Spark session"):
            call()


def test_a_missing_file_is_named(tmp_path):
    data = _data({"kind": "parquet", "path": str(tmp_path / "nowhere.parquet")})
    with pytest.raises(DataError, match=r"data.source.path: .*nowhere.parquet does not exist"):
        source_kind(data).read(data, base=tmp_path)


def test_a_kind_registered_at_run_time_is_asked(files):
    """The registry, not a switch, decides which reader runs."""
    from dbspec.plugins import KindRegistry, UnknownKind

    registry = KindRegistry("dbspec.test_sources", "data source kind",
                            {"csv": "dbspec.sources.csv:SOURCE"})
    assert registry.get("csv") is SOURCES.get("csv")
    with pytest.raises(UnknownKind, match="unknown data source kind 'cvs' \\(did you mean 'csv'"):
        registry.get("cvs")


@pytest.mark.slow
def test_spark_reads_the_same_rows(spark, files):
    for name in ("csv", "parquet", "delta"):
        data = _data({"kind": name, "path": str(files[name])})
        local = source_kind(data).read(data, base=Path.cwd())
        remote = source_kind(data).read_spark(spark, data, base=Path.cwd())
        assert remote.frame.shape == local.frame.shape, name
        assert sorted(remote.frame["bmi"].round(8)) == sorted(local.frame["bmi"].round(8)), name
