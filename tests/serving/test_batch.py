"""Batch inference: the local Arrow engine, the Spark engine, ``dbspec predict`` and the
``batch_predict`` stage, on real Parquet and Delta tables."""

from __future__ import annotations

import re
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from dbspec.data.sources import DataError
from tests.conftest import ROOT, run_cli, run_in_process
from tests.serving.conftest import FEATURES, NAME


@pytest.fixture(scope="module")
def model(registered):
    import mlflow

    from dbspec.serving.source import ModelTarget, load_version

    client = mlflow.MlflowClient(tracking_uri=registered.tracking_uri)
    return load_version(client, ModelTarget(NAME, version="1"), "1")


def rows_table(n: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    columns = {name: rng.normal(0, 0.05, n) for name in FEATURES}
    return pa.table({"id": np.arange(n), **columns})


def features_of(table) -> np.ndarray:
    return np.column_stack([np.asarray(table[name], dtype=np.float32) for name in FEATURES])


def read_output(path) -> pa.Table:
    return DeltaTable(str(path)).to_pyarrow_table().sort_by("id")


def _far_outside(n: int, rows: list[int], feature: str) -> pa.Table:
    """``n`` rows near the diabetes features' centre, with ``feature`` of ``rows`` far off."""
    rng = np.random.default_rng(1)
    columns = {name: rng.uniform(-0.02, 0.02, n) for name in FEATURES}
    columns[feature][rows] = 5.0  # the diabetes features lie within about +-0.2
    return pa.table({"id": np.arange(n), **columns})


def test_rows_far_outside_the_training_range_are_flagged_in_their_own_column(model, tmp_path):
    from dbspec.serving.batch import predict_local

    source = tmp_path / "in.parquet"
    pq.write_table(_far_outside(300, [3, 250], "bmi"), source)
    result = predict_local(model, str(source), str(tmp_path / "out"), batch_rows=128)
    assert result.out_of_range_rows == 2
    flags = read_output(tmp_path / "out")["out_of_range"].to_pylist()
    assert [i for i, flag in enumerate(flags) if flag is not None] == [3, 250]
    assert flags[3] == "bmi"
    off = predict_local(model, str(source), str(tmp_path / "off"), out_of_range=("off", 0.5))
    assert off.out_of_range_rows == 0
    assert "out_of_range" not in read_output(tmp_path / "off").column_names


def test_reject_fails_the_batch_before_anything_is_written(model, tmp_path):
    from dbspec.serving.batch import predict_local

    source = tmp_path / "in.parquet"
    pq.write_table(_far_outside(300, [250], "s5"), source)
    with pytest.raises(DataError, match=r"1 row\(s\) of rows 128..255 lie far outside the "
                                        r"model's training range \(serving.out_of_range: reject; "
                                        r"nothing was written\): row 250: s5=5 \(trained on "):
        predict_local(model, str(source), str(tmp_path / "out"), batch_rows=128,
                      out_of_range=("reject", 0.5))
    assert not (tmp_path / "out" / "_delta_log").exists()  # no table version was committed


def test_spark_scoring_flags_and_rejects_as_local_scoring_does(model, spark, tmp_path):
    from dbspec.serving.batch import predict_spark

    source = tmp_path / "in.parquet"
    pq.write_table(_far_outside(200, [7], "age"), source)
    result = predict_spark(spark, model, str(source), str(tmp_path / "out"), fmt="parquet")
    assert result.out_of_range_rows == 1
    written = pq.read_table(tmp_path / "out").sort_by("id")
    assert [i for i, f in enumerate(written["out_of_range"].to_pylist()) if f] == [7]
    with pytest.raises(DataError, match="lie far outside the model's training range"):
        predict_spark(spark, model, str(source), str(tmp_path / "refused"), fmt="parquet",
                      out_of_range=("reject", 0.5))
    assert not (tmp_path / "refused").exists()


def test_local_scoring_streams_batches_and_keeps_every_column(model, tmp_path):
    from dbspec.serving.batch import predict_local

    source = tmp_path / "in.parquet"
    pq.write_table(rows_table(1000), source)
    seen = []
    result = predict_local(model, str(source), str(tmp_path / "out"), batch_rows=128,
                           progress=lambda rows, seconds: seen.append(rows))
    assert result.rows == 1000 and result.output_version == 0
    assert len(seen) == 8 and seen[-1] == 1000  # 128-row record batches, streamed
    written = read_output(tmp_path / "out")
    assert written.column_names == ["id", *FEATURES, "prediction", "out_of_range", "model_name",
                                    "model_version"]
    want = model.model.predict_frame(features_of(written))["prediction"].to_numpy()
    assert np.allclose(written["prediction"].to_numpy(), want, rtol=1e-5)
    assert set(written["model_name"].to_pylist()) == {NAME}
    assert set(written["model_version"].to_pylist()) == {"1"}


def test_delta_input_at_any_version_and_a_rerun_replaces_the_output(model, tmp_path):
    from dbspec.serving.batch import predict_local

    source = tmp_path / "in"
    write_deltalake(str(source), rows_table(10))
    write_deltalake(str(source), rows_table(5, seed=1).set_column(
        0, "id", pa.array(np.arange(10, 15))), mode="append")
    old = predict_local(model, str(source), str(tmp_path / "out"), input_version=0)
    assert (old.rows, old.input_version) == (10, "delta-v0")
    new = predict_local(model, str(source), str(tmp_path / "out"))
    assert (new.rows, new.input_version, new.output_version) == (15, "delta-v1", 1)
    assert read_output(tmp_path / "out")["id"].to_pylist() == list(range(15))


def test_parquet_output_is_replaced_whole(model, tmp_path):
    from dbspec.serving.batch import predict_local

    source = tmp_path / "in.parquet"
    pq.write_table(rows_table(20), source)
    for _ in range(2):
        result = predict_local(model, str(source), str(tmp_path / "out"), fmt="parquet")
    assert result.output_version is None
    assert len(list((tmp_path / "out").glob("*.parquet"))) == 1
    assert pq.read_table(tmp_path / "out").num_rows == 20


@pytest.mark.parametrize("change, message", [
    (lambda t: t.drop_columns(["bmi", "s6"]), "lacks the model's feature column(s) bmi, s6"),
    (lambda t: t.set_column(3, "bmi", pa.array(["x"] * t.num_rows)),
     "feature column(s) bmi (string) are not numeric"),
    (lambda t: t.append_column("prediction", pa.array([0.0] * t.num_rows)),
     "already has column(s) prediction"),
    (lambda t: t.set_column(3, "bmi", pa.array([None] + [0.1] * (t.num_rows - 1), pa.float64())),
     "1 row(s) scored NaN (missing values in bmi): the model has no impute step"),
])
def test_bad_input_is_refused_and_the_existing_output_is_untouched(model, tmp_path, change,
                                                                   message):
    from dbspec.serving.batch import predict_local

    good, bad = tmp_path / "good.parquet", tmp_path / "bad.parquet"
    pq.write_table(rows_table(300), good)
    pq.write_table(change(rows_table(300)), bad)
    predict_local(model, str(good), str(tmp_path / "out"))
    with pytest.raises(DataError, match=message.replace("(", r"\(").replace(")", r"\)")):
        predict_local(model, str(bad), str(tmp_path / "out"), batch_rows=100)
    table = DeltaTable(str(tmp_path / "out"))
    assert table.version() == 0 and table.to_pyarrow_table().num_rows == 300


@pytest.mark.parametrize("make, version, message", [
    (None, None, "does not exist"),
    ("text", None, "is not a Delta table, Parquet or CSV"),
    ("bad-csv", None, "is not a CSV file pyarrow can read"),
    ("parquet", 3, "is not a Delta table, so it has no version 3"),
    ("delta", 7, "cannot open Delta version 7"),
])
def test_unreadable_inputs_are_clear_errors(model, tmp_path, make, version, message):
    from dbspec.serving.batch import predict_local

    source = tmp_path / "in"
    if make == "text":
        source.mkdir()
        (source / "part.parquet").write_text("not parquet")
    elif make == "bad-csv":
        source = tmp_path / "in.csv"
        source.write_bytes(b"age,bmi\n1,2\n3,4,5\n")  # a row with one value too many
    elif make == "parquet":
        pq.write_table(rows_table(3), tmp_path / "in.parquet")
        source = tmp_path / "in.parquet"
    elif make == "delta":
        write_deltalake(str(source), rows_table(3))
    with pytest.raises(DataError, match=message):
        predict_local(model, str(source), str(tmp_path / "out"), input_version=version)


def test_csv_is_scored_like_the_parquet_it_holds(model, spark, tmp_path):
    # fails on the old code: a CSV input was "neither a Delta table nor Parquet", although
    # the model trained on CSV
    from dbspec.serving.batch import predict_local, predict_spark

    table = rows_table(300)
    pq.write_table(table, tmp_path / "in.parquet")
    table.to_pandas().to_csv(tmp_path / "in.csv", index=False)
    (tmp_path / "parts").mkdir()
    table.slice(0, 100).to_pandas().to_csv(tmp_path / "parts" / "a.csv", index=False)
    table.slice(100).to_pandas().to_csv(tmp_path / "parts" / "b.csv", index=False)
    want = predict_local(model, str(tmp_path / "in.parquet"), str(tmp_path / "want"))
    expected = read_output(tmp_path / "want")["prediction"].to_numpy()
    for source in ("in.csv", "parts"):
        got = predict_local(model, str(tmp_path / source), str(tmp_path / f"{source}.out"))
        assert got.rows == want.rows == 300
        predicted = read_output(tmp_path / f"{source}.out")["prediction"].to_numpy()
        assert np.allclose(predicted, expected, rtol=1e-5)
    spark_out = tmp_path / "spark.out"
    predict_spark(spark, model, str(tmp_path / "in.csv"), str(spark_out), fmt="parquet")
    on_spark = pq.read_table(spark_out).sort_by("id")["prediction"].to_numpy()
    assert np.allclose(on_spark, expected, rtol=1e-5)


def test_predict_command_scores_a_table_with_a_registered_model(registered, tmp_path):
    source = tmp_path / "in.parquet"
    pq.write_table(rows_table(50), source)
    result = run_in_process("predict", f"models:/{NAME}/2", "--input", str(source),
                            "--output", str(tmp_path / "out"), cwd=registered.workdir,
                            env={"MLFLOW_TRACKING_URI": registered.tracking_uri})
    assert result.returncode == 0, result.stderr
    assert f"wrote 50 rows to {tmp_path / 'out'} (Delta version 0)" in result.stdout
    assert set(read_output(tmp_path / "out")["model_version"].to_pylist()) == {"2"}


@pytest.mark.parametrize("args, message", [
    ([f"models:/{NAME}/1"], "predict needs --input and --output"),
    ([f"models:/{NAME}/1", "--input", "x", "--output", "y", "--input-version", "-1"],
     "--input-version must be 0 or more"),
    ([f"models:/{NAME}/1", "--input", "nowhere.parquet", "--output", "y"],
     "input nowhere.parquet does not exist"),
])
def test_bad_predict_arguments_are_clear_errors(registered, args, message):
    result = run_in_process("predict", *args, cwd=registered.workdir,
                            env={"MLFLOW_TRACKING_URI": registered.tracking_uri})
    assert result.returncode in (1, 2) and message in result.stderr
    assert "Traceback" not in result.stderr


def test_a_batch_spec_ends_with_predictions_and_rescores_on_every_run(workdir):
    (workdir / "specs" / "data").mkdir(parents=True)
    shutil.copy(ROOT / "specs" / "data" / "diabetes_scoring.parquet", workdir / "specs" / "data")
    spec = str(ROOT / "specs" / "diabetes_batch.yaml")
    for attempt in range(2):
        result = run_in_process("run", spec, "--smoke", "--quiet", "--summary-json",
                                "summary.json", cwd=workdir)
        assert result.returncode == 0, result.stderr
    import json

    summary = json.loads((workdir / "summary.json").read_text())
    assert [s["name"] for s in summary["stages"] if s["action"] == "ran"] == ["batch_predict"]
    batch = summary["batch_predict"]
    assert batch["rows"] == 442 and batch["model_uri"] == "models:/diabetes_batch_smoke/1"
    written = DeltaTable(batch["output"]).to_pyarrow_table()
    assert written.num_rows == 442 and "patient_id" in written.column_names
    assert not (workdir / ".dbspec" / "diabetes-batch").exists()  # smoke keeps its output aside


# -- Spark ----------------------------------------------------------------------------------

@pytest.mark.slow
def test_spark_scoring_matches_local_scoring(model, spark, tmp_path):
    from dbspec.serving.batch import predict_local, predict_spark

    source = tmp_path / "in"
    write_deltalake(str(source), rows_table(2000))
    write_deltalake(str(source), rows_table(10, seed=3), mode="append")
    assert predict_local(model, str(source), str(tmp_path / "local"), input_version=0).rows == 2000
    on_spark = predict_spark(spark, model, str(source), str(tmp_path / "spark"), input_version=0,
                             batch_rows=300)
    assert (on_spark.rows, on_spark.input_version, on_spark.output_version) == \
        (2000, "delta-v0", 0)
    a, b = read_output(tmp_path / "local"), read_output(tmp_path / "spark")
    assert b.column_names == a.column_names
    assert np.allclose(b["prediction"].to_numpy(), a["prediction"].to_numpy(), rtol=1e-5)
    assert b["model_version"].to_pylist() == a["model_version"].to_pylist()
    assert not list(tmp_path.glob(".spark.staging-*"))  # the staging files are gone


@pytest.mark.slow
def test_spark_scores_parquet_files_in_python_tasks_into_the_table_its_udf_writes(model, spark,
                                                                                  tmp_path):
    """Plain Parquet files skip the JVM (issue 35: through the Arrow UDF, scoring ran at 0.46x
    of a Spark copy): each Spark task writes its own part, and the table is the UDF path's."""
    from dbspec.serving.batch import predict_spark

    table = rows_table(3000)
    pq.write_table(table, tmp_path / "in.parquet", row_group_size=500)  # 6 groups, 2 tasks
    write_deltalake(str(tmp_path / "delta"), table)  # read by Spark: the Arrow UDF
    fast = predict_spark(spark, model, str(tmp_path / "in.parquet"), str(tmp_path / "fast"),
                         fmt="parquet", batch_rows=256)
    udf = predict_spark(spark, model, str(tmp_path / "delta"), str(tmp_path / "udf"),
                        fmt="parquet")
    assert fast.rows == udf.rows == 3000
    assert sorted(p.name for p in (tmp_path / "fast").glob("*.parquet")) == \
        ["part-00000-dbspec.parquet", "part-00001-dbspec.parquet"]
    assert not list((tmp_path / "udf").glob("*-dbspec.parquet"))
    a, b = pq.read_table(tmp_path / "fast").sort_by("id"), pq.read_table(tmp_path / "udf").sort_by("id")
    assert a.schema.remove_metadata() == b.schema.remove_metadata()
    assert a.drop(["prediction"]).equals(b.drop(["prediction"]))
    assert np.allclose(a["prediction"].to_numpy(), b["prediction"].to_numpy(), rtol=1e-6)
    again = predict_spark(spark, model, str(tmp_path / "in.parquet"), str(tmp_path / "fast"))
    assert (again.rows, again.output_version) == (3000, 0)  # the Parquet output became Delta
    assert read_output(tmp_path / "fast").num_rows == 3000


@pytest.mark.slow
def test_spark_scores_a_table_by_name_to_parquet(model, spark, tmp_path):
    from dbspec.serving.batch import predict_spark

    spark.createDataFrame(rows_table(100).to_pandas()).write.saveAsTable("scoring_rows")
    result = predict_spark(spark, model, "scoring_rows", str(tmp_path / "out"), fmt="parquet")
    assert result.rows == 100
    assert pq.read_table(tmp_path / "out").num_rows == 100


@pytest.mark.slow
@pytest.mark.parametrize("source, message", [
    ("no_such_table", "Spark cannot read it"),
    ("./missing/path", "does not exist"),
])
def test_spark_input_errors_are_clear(model, spark, tmp_path, source, message):
    from dbspec.serving.batch import predict_spark

    with pytest.raises(DataError, match=message):
        predict_spark(spark, model, source, str(tmp_path / "out"))


@pytest.mark.slow
def test_spark_refuses_rows_it_cannot_score(model, spark, tmp_path):
    from dbspec.serving.batch import predict_spark

    table = rows_table(50).set_column(2, "sex", pa.array([None] * 50, pa.float64()))
    pq.write_table(table, tmp_path / "in.parquet")
    with pytest.raises(DataError, match=r"scored NaN \(missing values in sex\)"):
        predict_spark(spark, model, str(tmp_path / "in.parquet"), str(tmp_path / "out"))


@pytest.mark.parametrize("output", ["in", "in/predictions", "."])
def test_an_output_that_overlaps_the_input_is_refused(model, tmp_path, output):
    from dbspec.serving.batch import predict_local

    (tmp_path / "in").mkdir()
    pq.write_table(rows_table(10), tmp_path / "in" / "a.parquet")
    with pytest.raises(DataError, match="overlaps the input"):
        predict_local(model, str(tmp_path / "in"), str(tmp_path / output))
    assert (tmp_path / "in" / "a.parquet").exists()


def test_parquet_output_never_deletes_files_it_did_not_write(model, tmp_path):
    from dbspec.serving.batch import predict_local

    pq.write_table(rows_table(10), tmp_path / "in.parquet")
    (tmp_path / "out").mkdir()
    pq.write_table(rows_table(3), tmp_path / "out" / "precious.parquet")
    with pytest.raises(DataError, match="holds Parquet files dbspec did not write "
                                        r"\(precious.parquet\)"):
        predict_local(model, str(tmp_path / "in.parquet"), str(tmp_path / "out"), fmt="parquet")
    assert (tmp_path / "out" / "precious.parquet").exists()
    assert not list((tmp_path / "out").glob("*.partial"))


def test_a_delta_write_failure_is_a_clear_error(model, tmp_path):
    from dbspec.serving.batch import predict_local

    table = rows_table(5).append_column("half", pa.array(np.zeros(5, dtype=np.float16)))
    pq.write_table(table, tmp_path / "in.parquet")
    with pytest.raises(DataError, match="cannot write Delta table"):
        predict_local(model, str(tmp_path / "in.parquet"), str(tmp_path / "out"))


def test_a_clash_with_different_case_is_caught(model, tmp_path):
    from dbspec.serving.batch import predict_local

    pq.write_table(rows_table(5).append_column("Prediction", pa.array([0.0] * 5)),
                   tmp_path / "in.parquet")
    with pytest.raises(DataError, match="already has column"):
        predict_local(model, str(tmp_path / "in.parquet"), str(tmp_path / "out"))


@pytest.mark.slow
def test_spark_refuses_to_overwrite_a_directory_of_other_files(model, spark, tmp_path):
    from dbspec.serving.batch import predict_spark

    pq.write_table(rows_table(5), tmp_path / "in.parquet")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("keep me")
    with pytest.raises(DataError, match="Spark would replace all of them"):
        predict_spark(spark, model, str(tmp_path / "in.parquet"), str(tmp_path / "out"),
                      fmt="parquet")
    assert (tmp_path / "out" / "notes.txt").exists()


def test_a_spark_master_that_does_not_start_is_a_clear_error(registered, tmp_path):
    # a process of its own: in this one, dbspec would use the Spark session of the tests above
    pq.write_table(rows_table(5), tmp_path / "in.parquet")
    result = run_cli("predict", f"models:/{NAME}/1", "--input", str(tmp_path / "in.parquet"),
                     "--output", str(tmp_path / "out"), "--engine", "spark", "--master",
                     "bogus://nowhere", cwd=registered.workdir,
                     env={"MLFLOW_TRACKING_URI": registered.tracking_uri})
    assert result.returncode == 1 and "cannot start Spark on bogus://nowhere" in result.stderr
    assert "Traceback" not in result.stderr


REJECTED = """\
name: never-promoted
data: {source: {kind: sklearn, name: diabetes}, task: regression}
model: {layers: [{linear: {out: 1}}]}
training: {epochs: 2}
registry:
  name: never_promoted
  promotion: {alias: production, gates: [{metric: test_rmse, max: 1}]}
serving:
  mode: %s
  batch: {input: in.parquet, output: out}
"""


def test_with_no_alias_holder_batch_fails_and_serve_says_so(workdir):
    pq.write_table(rows_table(5), workdir / "in.parquet")
    (workdir / "batch.yaml").write_text(REJECTED % "batch")
    batch = run_in_process("run", "batch.yaml", "-q", cwd=workdir)
    assert batch.returncode == 1
    assert "stage 'batch_predict' failed: nothing to serve: no version of 'never_promoted' " \
           "holds the alias 'production'" in batch.stderr
    assert "did not pass the gates" in batch.stderr
    (workdir / "live.yaml").write_text(REJECTED % "realtime")
    live = run_in_process("run", "live.yaml", "--summary-json", "s.json", cwd=workdir)
    assert live.returncode == 0, live.stderr  # the run did its job; the endpoint has nothing
    assert re.search(r"\n  serving +nothing to serve", live.stdout), live.stdout


def _parquet_rows(path) -> pa.Table:
    import pyarrow.dataset as ds

    return ds.dataset(str(path), format="parquet").to_table().sort_by("id")


def test_a_failed_spark_parquet_write_keeps_the_previous_output(model, spark, tmp_path):
    """Spark's own ``mode("overwrite")`` deletes the old files before its tasks write: a job
    that failed (here: a row the model cannot score, raised in a task) used to leave nothing."""
    from dbspec.serving.batch import predict_spark

    good, bad, out = tmp_path / "good.parquet", tmp_path / "bad.parquet", tmp_path / "out"
    pq.write_table(rows_table(40), good)
    column = FEATURES[0]
    broken = rows_table(40)
    broken = broken.set_column(broken.schema.get_field_index(column), column,
                               pa.array([0.0] * 39 + [None], pa.float64()))
    pq.write_table(broken, bad)
    predict_spark(spark, model, str(good), str(out), fmt="parquet")
    before = sorted(p.name for p in out.iterdir())
    kept = _parquet_rows(out)
    with pytest.raises(DataError, match=f"missing values in {column}"):
        predict_spark(spark, model, str(bad), str(out), fmt="parquet")
    assert sorted(p.name for p in out.iterdir()) == before
    assert _parquet_rows(out).equals(kept)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out.")] == []


def test_spark_parquet_leftovers_of_killed_writes_are_cleaned_up(model, spark, tmp_path):
    """A staging directory of a dead writer is deleted; an old output set aside by a write that
    died between its two renames is put back; a live writer's staging is left alone."""
    import subprocess

    from dbspec.atomic import remove_leftovers
    from dbspec.serving.batch import predict_spark

    source, out = tmp_path / "in.parquet", tmp_path / "out"
    pq.write_table(rows_table(12), source)
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = tmp_path / f".out.staging-{dead.pid}-0badf00d"
    stale.mkdir()
    (stale / "part-0.parquet").write_bytes(b"PAR1")
    live = tmp_path / ".out.staging-1-cafe0123"  # pid 1 never dies
    live.mkdir()
    aside = tmp_path / f".out.old-{dead.pid}-feedbeef"
    predict_spark(spark, model, str(source), str(aside), fmt="parquet")
    assert sorted(remove_leftovers(out)) == sorted([aside, stale])
    assert _parquet_rows(out).num_rows == 12  # the set-aside output is back in place
    pq.write_table(rows_table(5), source)
    predict_spark(spark, model, str(source), str(out), fmt="parquet")
    assert _parquet_rows(out).num_rows == 5
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".out.")) == \
        [live.name]


def test_a_missing_batch_input_fails_before_any_stage(workdir):
    """It used to fail in batch_predict, after training and registering."""
    (workdir / "batch.yaml").write_text(REJECTED % "batch")  # in.parquet is not there
    result = run_in_process("run", "batch.yaml", "-q", cwd=workdir)
    assert result.returncode == 1
    assert f"serving.batch.input: in.parquet does not exist (relative paths are read from " \
           f"{workdir})" in result.stderr and "Traceback" not in result.stderr
    assert not (workdir / ".dbspec" / "mlflow.db").exists()  # nothing was trained or logged


def test_the_range_check_skips_missing_values_but_not_the_rows_beside_them(model):
    # a batch's column extremes decide whether the full check runs: a NaN must not hide
    # another row's far value in the same column
    from dbspec.serving.batch import RangeCheck

    x = features_of(_far_outside(50, [9], "bmi")).copy()
    x[[3, 20], FEATURES.index("bmi")] = np.nan
    ranged, flagged = RangeCheck(model.model.card).column(x, "in")
    assert flagged == 1 and ranged.to_pylist()[9] == "bmi"
    clean, none = RangeCheck(model.model.card).column(np.delete(x, 9, axis=0), "in")
    assert none == 0 and clean.null_count == len(x) - 1


def test_a_batch_larger_than_a_forward_chunk_scores_as_one_pass_does(model, tmp_path):
    from dbspec.serving.batch import CHUNK_ROWS
    from dbspec.serving.batch_local import predict_local

    rows = 2 * CHUNK_ROWS + 123  # three chunks, the last a short one
    source = tmp_path / "in.parquet"
    pq.write_table(rows_table(rows), source)
    predict_local(model, str(source), str(tmp_path / "out"), batch_rows=rows)
    written = read_output(tmp_path / "out")
    want = model.model.predict_frame(features_of(written))["prediction"].to_numpy()
    assert np.allclose(written["prediction"].to_numpy(), want, rtol=1e-6)


def test_arrow_batches_grow_for_narrow_rows_and_stay_small_for_wide_ones():
    from pyspark.sql import types as T

    from dbspec.serving.batch_spark import arrow_batch_rows

    def schema(columns: int, kind=T.DoubleType()):
        return T.StructType([T.StructField(f"c{i}", kind) for i in range(columns)])

    assert arrow_batch_rows(schema(11)) == 65_536  # the benchmark's input
    assert arrow_batch_rows(schema(1_000)) == 4_096  # Spark's own default, no smaller
    assert 4_096 < arrow_batch_rows(schema(60, T.StringType())) < 65_536


def test_spark_scoring_gives_the_session_its_batch_settings_back(model, spark, tmp_path):
    from dbspec.serving.batch_spark import predict_spark

    source = tmp_path / "in.parquet"
    pq.write_table(rows_table(30), source)
    arrow, reader = ("spark.sql.execution.arrow.maxRecordsPerBatch",
                     "spark.sql.parquet.columnarReaderBatchSize")
    spark.conf.set(arrow, "123")
    spark.conf.unset(reader)
    try:
        for rows in (None, 7):
            predict_spark(spark, model, str(source), str(tmp_path / f"out{rows}"),
                          fmt="parquet", batch_rows=rows)
            assert spark.conf.get(arrow) == "123"
            assert spark.conf.get(reader) == "4096"  # unset again: Spark's default
        assert pq.read_table(tmp_path / "out7").num_rows == 30
    finally:
        spark.conf.unset(arrow)


def test_a_delta_version_without_data_files_is_a_clear_error_on_spark(model, spark, tmp_path):
    from dbspec.serving.batch_spark import predict_spark

    empty = rows_table(0)
    write_deltalake(str(tmp_path / "in"), empty)  # version 0 lists no Parquet files
    with pytest.raises(DataError, match=r"input .*in has no data files at version 0"):
        predict_spark(spark, model, str(tmp_path / "in"), str(tmp_path / "out"))


def test_a_classifier_row_that_scored_nan_is_caught_by_its_probabilities():
    from dbspec.serving.batch import unscorable_rows

    x = np.array([[1.0, 2.0], [np.nan, 2.0]], dtype=np.float32)
    columns = {"prediction": np.array([0, 0]), "probability": np.array([0.2, np.nan])}
    assert unscorable_rows(x, columns, ["a", "b"]).startswith(
        "1 row(s) scored NaN (missing values in a)")
    columns["probability"] = np.array([0.2, 0.7])
    assert unscorable_rows(x, columns, ["a", "b"]) is None


def test_the_input_is_read_by_its_source_kind(tmp_path):
    """Delta and Parquet inputs open through the source kinds (the same reader training uses):
    a hive-partitioned directory keeps its partition column, a Delta table its version, and a
    damaged table is an error about the input, not about ``data.source``."""
    from dbspec.serving.batch_input import input_kind, open_input

    (tmp_path / "parts" / "bucket=1").mkdir(parents=True)
    pq.write_table(rows_table(5), tmp_path / "parts" / "bucket=1" / "a.parquet")
    dataset, label = open_input(str(tmp_path / "parts"), None)
    assert "bucket" in dataset.schema.names and label.startswith("parquet-")
    write_deltalake(str(tmp_path / "t"), rows_table(5))
    assert input_kind(tmp_path / "t") == "delta"
    assert open_input(str(tmp_path / "t"), 0)[1] == "delta-v0"
    (tmp_path / "broken" / "_delta_log").mkdir(parents=True)
    with pytest.raises(DataError, match=r"^input .*broken: .*is not a Delta table") as refused:
        open_input(str(tmp_path / "broken"), None)
    assert "data.source" not in str(refused.value)
