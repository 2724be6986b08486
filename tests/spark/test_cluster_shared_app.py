"""Commands whose Spark work is scoring or the executors' probe, on the real standalone cluster
(``tests/cluster.py``: workers that cannot see pytest's temporary root), sharing one Spark
application.

Starting an application on the cluster (executors on both workers, their Python workers
importing torch) took 20-40 s of each of these tests when each ran ``dbspec`` as its own
process. Here they run ``dbspec``'s command line in this process while one application,
started by dbspec's own ``spark_session`` for the cluster's master (the driver's interpreter
for the executors, as for a ``dbspec`` process), is active: dbspec uses an active session
instead of starting one, so each command does on the cluster exactly what it does in a process
of its own, without the start. The application is stopped when the module ends, before any
other test asks the cluster for its workers. What needs a process of its own (a run that starts
its own application, training ranks on the executors) is in ``test_cluster.py``.
"""

from __future__ import annotations

import os
import shlex

import pytest

from tests.cluster import worker_sees
from tests.conftest import run_main
from tests.models.test_self_contained import BLOCKS, LAYERS
from tests.spark.test_cluster import _diabetes_parquet, dbspec

pytestmark = pytest.mark.slow

LOCAL_SPEC = """\
name: cluster-scored
data: {source: {kind: sklearn, name: diabetes}, task: regression,
       preprocessing: [standard_scale]}
model: {layers: [{linear: {out: 8}}, relu, {linear: {out: 1}}]}
training: {epochs: 3}
registry:
  name: cluster_scored
  promotion: {alias: production, gates: [{metric: test_rmse, max: 1000}]}
"""


@pytest.fixture(scope="module")
def scored_model(mlflow_server, tmp_path_factory):
    """A model registered on the server (trained locally, in a process of its own: the scoring
    is what runs on the cluster)."""
    project = tmp_path_factory.mktemp("scored-model")
    (project / "spec.yaml").write_text(LOCAL_SPEC)
    done = dbspec("run", "spec.yaml", "-q", cwd=project, server=mlflow_server)
    assert done.returncode == 0, done.stderr[-3000:]
    return "models:/cluster_scored@production"


@pytest.fixture(scope="module")
def cluster_app(spark_cluster):
    """One Spark application on the cluster, active for this module's commands."""
    from pyspark.sql import SparkSession

    from dbspec.spark import spark_session

    assert SparkSession.getActiveSession() is None  # another module's session would be used
    spark_cluster.wait_for_workers(2)  # a test before may have killed and restarted one
    saved = os.environ.pop("PYSPARK_PYTHON", None)  # as dbspec() leaves it for its processes
    try:
        with spark_session(None, spark_cluster.master) as session:
            assert session.sparkContext.master == spark_cluster.master
            yield session
    finally:
        if saved is not None:
            os.environ["PYSPARK_PYTHON"] = saved
    spark_cluster.wait_until_idle()


@pytest.fixture
def command(cluster_app, mlflow_server, monkeypatch):
    """``dbspec ARGS`` in this process, in ``cwd``, against the tracking server, on the shared
    application: (exit code, stdout, stderr)."""
    from mlflow.tracking._tracking_service import utils

    previous = utils._tracking_uri  # what open_registry's set_tracking_uri replaces
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server.uri)
    monkeypatch.delenv("DBSPEC_SHARED_DIR", raising=False)

    def run(*args: str, cwd) -> tuple[int, str, str]:
        monkeypatch.chdir(cwd)
        code, out, err = run_main(*args)
        print(f"dbspec {shlex.join(args)} -> {code}\n{err[-3000:]}")
        return code, out, err

    yield run
    import mlflow

    mlflow.set_tracking_uri(previous)


@pytest.mark.parametrize("fmt", ["delta", "parquet"])
def test_predict_on_the_cluster_writes_every_row_to_the_shared_dir(
        spark_cluster, command, scored_model, tmp_path, fmt):
    # fails on the old code: the parquet output 'succeeded' with 0 rows, the scored rows left
    # in _temporary/ on a worker's own disk
    shared = spark_cluster.shared_dir / f"predict-{fmt}"
    shared.mkdir()
    rows = _diabetes_parquet(shared / "in.parquet")
    code, out, err = command("predict", scored_model, "--input", str(shared / "in.parquet"),
                             "--output", str(shared / "out"), "--format", fmt, "--engine",
                             "spark", "--master", spark_cluster.master, cwd=tmp_path)
    assert code == 0, err[-3000:]
    assert f"wrote {rows:,} rows to {shared / 'out'}" in out
    if fmt == "delta":
        from deltalake import DeltaTable

        table = DeltaTable(str(shared / "out")).to_pyarrow_table()
    else:
        import pyarrow.dataset as ds

        table = ds.dataset(str(shared / "out"), format="parquet").to_table()
    assert table.num_rows == rows and "prediction" in table.column_names


def test_predict_to_a_path_the_workers_do_not_share_fails_before_scoring(
        spark_cluster, command, scored_model, tmp_path):
    # fails on the old code: exit 0 after writing 0 rows
    shared = spark_cluster.shared_dir / "predict-unshared"
    shared.mkdir()
    _diabetes_parquet(shared / "in.parquet")
    code, _, err = command("predict", scored_model, "--input", str(shared / "in.parquet"),
                           "--output", str(tmp_path / "out"), "--format", "parquet",
                           "--engine", "spark", "--master", spark_cluster.master, cwd=tmp_path)
    assert code == 1
    assert f"does not see {tmp_path} as this machine does" in err
    assert not (tmp_path / "out").exists()
    assert "Traceback" not in err


def test_predict_from_an_input_only_the_driver_has_is_refused(spark_cluster, command,
                                                              scored_model, tmp_path):
    _diabetes_parquet(tmp_path / "in.parquet")
    code, _, err = command("predict", scored_model, "--input", str(tmp_path / "in.parquet"),
                           "--output", str(spark_cluster.shared_dir / "never"), "--engine",
                           "spark", "--master", spark_cluster.master, cwd=tmp_path)
    assert code == 1
    assert f"does not see {tmp_path / 'in.parquet'}: it is on this machine only" in err


def test_a_data_file_only_the_driver_has_is_refused_before_spark_reads_it(
        spark_cluster, command, tmp_path):
    # fails on the old code: Spark listed the file on the driver, then every executor failed
    # with FileNotFoundException inside a Java stack
    from sklearn.datasets import load_diabetes

    load_diabetes(as_frame=True).frame.to_csv(tmp_path / "rows.csv", index=False)
    (tmp_path / "spec.yaml").write_text(LOCAL_SPEC.replace(
        "source: {kind: sklearn, name: diabetes}", "source: {kind: csv, path: rows.csv}"))
    code, _, err = command("run", "spec.yaml", "--master", spark_cluster.master, cwd=tmp_path)
    assert code == 1
    assert f"does not see {tmp_path / 'rows.csv'}: it is on this machine only" in err
    assert "Traceback" not in err
    assert not (tmp_path / ".dbspec/runs/cluster-scored/stages/load_data").exists()


PACKAGE = "dbspec_clusternet_zz"  # not the self-contained test's: both may run in one process
CUSTOM_SPEC = f"""\
name: cluster-custom
data: {{source: {{kind: sklearn, name: diabetes}}, task: regression,
       preprocessing: [standard_scale]}}
model: {{custom: {{class: "{PACKAGE}.layers:TinyNet", kwargs: {{hidden: 8}}}}}}
training: {{epochs: 2, batch_size: 64}}
tracking: {{system_metrics: false}}
registry: {{name: cluster_custom}}
"""


def test_a_custom_network_scores_on_executors_that_never_saw_its_module(
        spark_cluster, mlflow_server, command, tmp_path):
    # batch scoring with a model.custom network: the user's package exists only in the
    # driver's project directory (a tmpfs hides it from the workers), so the executors can
    # rebuild the network only from what dbspec ships them
    package = tmp_path / PACKAGE
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "layers.py").write_text(LAYERS)
    (package / "blocks.py").write_text(BLOCKS)
    (tmp_path / "spec.yaml").write_text(CUSTOM_SPEC)
    assert not worker_sees(spark_cluster, package / "layers.py")
    trained = dbspec("run", "spec.yaml", "-q", cwd=tmp_path, server=mlflow_server)
    assert trained.returncode == 0, trained.stderr[-3000:]
    shared = spark_cluster.shared_dir / "custom-code"
    shared.mkdir()
    rows = _diabetes_parquet(shared / "in.parquet")
    code, out, err = command("predict", "models:/cluster_custom/1", "--input",
                             str(shared / "in.parquet"), "--output", str(shared / "out"),
                             "--format", "parquet", "--engine", "spark", "--master",
                             spark_cluster.master, cwd=tmp_path)
    assert code == 0, err[-3000:]
    assert f"wrote {rows:,} rows" in out
    import pyarrow.dataset as ds

    table = ds.dataset(str(shared / "out"), format="parquet").to_table()
    assert table.num_rows == rows and table.column("prediction").null_count == 0
