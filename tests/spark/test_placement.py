"""The placement rules (pure) and the wording of executor errors, without a cluster."""

from __future__ import annotations

import re

import pytest

from dbspec.spark import executor_python, python_cause
from dbspec.spark.placement import (
    PlacementError,
    check_placement,
    is_local_master,
    is_local_store,
    normalise_shared_dir,
    resolve_shared_dir,
)
from dbspec.spec.loader import load_spec
from tests.conftest import MINIMAL, run_main

DDP = MINIMAL + "compute: {kind: torch_distributor, num_processes: 2, local_mode: false}\n"
SEARCH = MINIMAL + """\
search:
  n_trials: 2
  metric: val_loss
  space: {training.optimizer.lr: {float: [0.001, 0.1], log: true}}
"""


def spec_of(write_spec, text):
    return load_spec(write_spec(text)).spec


@pytest.mark.parametrize("url, local", [("local", True), ("local[2]", True), ("local[*]", True),
                                        ("spark://h:7077", False), ("yarn", False),
                                        ("local-cluster[2,1,1024]", False)])
def test_local_masters(url, local):
    assert is_local_master(url) is local


@pytest.mark.parametrize("uri, local", [("sqlite:///x.db", True), ("file:///tmp/m", True),
                                        ("/tmp/mlruns", True), ("mlruns", True),
                                        ("http://h:5000", False), ("databricks", False),
                                        ("databricks://profile", False),
                                        ("postgresql://u@h/db", False)])
def test_local_stores(uri, local):
    assert is_local_store(uri) is local


def test_a_cluster_needs_a_shared_dir_and_a_tracking_server(write_spec):
    spec = spec_of(write_spec, DDP)
    common = dict(master="spark://h:7077", executor="local", study_storage=None)
    with pytest.raises(PlacementError, match="spark.shared_dir: the training ranks"):
        check_placement(spec, shared_dir=None, tracking_uri="http://t", **common)
    with pytest.raises(PlacementError, match="tracking.tracking_uri: .* sqlite:///m.db is a file"):
        check_placement(spec, shared_dir="/shared", tracking_uri="sqlite:///m.db", **common)
    notes = check_placement(spec, shared_dir="/shared", tracking_uri="http://t", **common)
    assert notes == ["training ranks (compute.local_mode: false) on spark://h:7077: shared dir "
                     "/shared"]
    # on one machine nothing is needed
    assert check_placement(spec, shared_dir=None, tracking_uri="sqlite:///m.db",
                           master="local[2]", executor="local", study_storage=None) == []


def test_trials_on_a_cluster_refuse_a_sqlite_study(write_spec):
    spec = spec_of(write_spec, SEARCH)
    with pytest.raises(PlacementError, match="search.storage: sqlite:///o.db is a SQLite file"):
        check_placement(spec, master="spark://h:7077", executor="spark", shared_dir="/s",
                        tracking_uri="http://t", study_storage="sqlite:///o.db")
    # the local executor runs trials in processes on this machine
    assert check_placement(spec, master="spark://h:7077", executor="local", shared_dir=None,
                           tracking_uri="sqlite:///m.db", study_storage="sqlite:///o.db") == []


@pytest.mark.parametrize("value, message", [
    ("scratch", "is relative"),
    ("/local_disk0/dbspec", "on a node's local disk"),
    ("s3://bucket/dbspec", "object storage does not offer"),
    ("/Volumes/main/ml", "stops before the volume"),
])
def test_bad_shared_dirs_are_refused(value, message):
    with pytest.raises(PlacementError, match=message):
        normalise_shared_dir(value)


def test_shared_dir_precedence_and_dbfs(write_spec, monkeypatch):
    spec = spec_of(write_spec, MINIMAL + "spark: {shared_dir: /mnt/spec}\n")
    monkeypatch.delenv("DBSPEC_SHARED_DIR", raising=False)
    assert resolve_shared_dir(spec) == "/mnt/spec"
    monkeypatch.setenv("DBSPEC_SHARED_DIR", "dbfs:/team/dbspec")
    assert resolve_shared_dir(spec) == "/dbfs/team/dbspec"
    assert resolve_shared_dir(spec, "/mnt/flag") == "/mnt/flag"


def test_a_bad_shared_dir_flag_is_a_clear_error(write_spec, workdir):
    code, _, err = run_main("run", write_spec(DDP), "--shared-dir", "relative/dir")
    assert code == 1 and "shared dir: 'relative/dir' is relative" in err


def test_a_cluster_run_without_a_shared_dir_stops_before_any_stage(write_spec, workdir,
                                                                   monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")
    code, _, err = run_main("run", write_spec(DDP), "--master", "spark://127.0.0.1:9")
    assert code == 1 and "spark.shared_dir: the training ranks" in err
    assert not (workdir / ".dbspec" / "runs").exists()


def test_executors_get_the_drivers_python_on_standalone_masters(write_spec, monkeypatch):
    import sys

    spec = spec_of(write_spec, MINIMAL)
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    assert executor_python(spec, "spark://h:7077") == sys.executable
    assert executor_python(spec, "local[2]") is None
    monkeypatch.setenv("PYSPARK_PYTHON", "/opt/py")
    assert executor_python(spec, "spark://h:7077") is None
    monkeypatch.delenv("PYSPARK_PYTHON")
    chosen = spec_of(write_spec, MINIMAL + "spark: {conf: {spark.pyspark.python: /opt/py}}\n")
    assert executor_python(chosen, "spark://h:7077") == "/opt/py"
    assert executor_python(chosen, "local[2]") == "/opt/py"


PY4J = """An error occurred while calling o56.collectToPython.
: org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 1.0 failed 4 times, most recent failure: Lost task 0.3 in stage 1.0 (TID 7) (127.0.0.1 executor 1): org.apache.spark.api.python.PythonException: Traceback (most recent call last):
  File "/opt/spark/python/pyspark/worker.py", line 1800, in main
    func, profiler, deserializer, serializer = read_command(pickleSer, infile)
  File "/opt/spark/python/pyspark/serializers.py", line 473, in loads
    return cloudpickle.loads(obj, encoding=encoding)
ModuleNotFoundError: No module named 'dbspec'

\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException(PythonRunner.scala:581)
\tat org.apache.spark.scheduler.Task.run(Task.scala:147)
"""
LOST = """An error occurred while calling o90.collectToPython.
: org.apache.spark.SparkException: Job aborted due to stage failure: Task 1 in stage 3.0 failed 1 times, most recent failure: Lost task 1.0 in stage 3.0 (TID 9) (127.0.0.1 executor 2): ExecutorLostFailure (executor 2 exited caused by one of the running tasks) Reason: Remote RPC client disassociated.
\tat org.apache.spark.scheduler.DAGScheduler.failJobAndIndependentStages(DAGScheduler.scala:2900)
"""


def test_the_python_cause_comes_out_of_a_py4j_error():
    assert python_cause(RuntimeError(PY4J)) == "ModuleNotFoundError: No module named 'dbspec'"
    lost = python_cause(RuntimeError(LOST))
    assert lost.startswith("ExecutorLostFailure (executor 2 exited caused by one of the running "
                           "tasks) Reason: Remote RPC client disassociated")
    assert python_cause(RuntimeError("plain")) == "plain"


@pytest.mark.parametrize("report, message", [
    (("h", "1", "/usr/bin/python3", "!ModuleNotFoundError: No module named 'dbspec'", (True,),
      (True,)), "executor 1 on h (/usr/bin/python3) cannot import dbspec: ModuleNotFoundError"),
    (("h", "1", "/py", "0.0.1", (True,), (True,)), "has dbspec 0.0.1, the driver"),
    (("h", "2", "/py", None, (False,), (True,)), "does not see /shared as this machine does"),
    (("h", "2", "/py", None, (True,), (False,)), "cannot write /shared"),
])
def test_what_an_executor_lacks_is_worded(report, message):
    # the probe's verdicts, from reports as executors send them (the cluster tests run the
    # probe itself; a version mismatch cannot be staged there)
    import dbspec
    from dbspec.spark.probe import ExecutorCheckFailed, ExecutorReport, _check_report

    fields = list(report)
    fields[3] = fields[3] or dbspec.__version__
    with pytest.raises(ExecutorCheckFailed, match=re.escape(message)):
        _check_report(ExecutorReport(*fields), ("/shared",), ("marker",), dbspec.__version__)


def test_an_input_only_this_machine_sees_is_worded():
    import dbspec
    from dbspec.spark.probe import ExecutorCheckFailed, ExecutorReport, _check_report

    report = ExecutorReport("h", "1", "/py", dbspec.__version__, (False,), (False,))
    with pytest.raises(ExecutorCheckFailed, match="does not see /in.parquet: it is on this "
                                                  "machine only"):
        _check_report(report, ("/in.parquet",), (None,), dbspec.__version__)


def test_zero_rows_written_for_scored_rows_is_an_error(spark):
    # what predict --engine spark checks after writing: the case of executors writing to
    # their own disks, where the driver reads back 0 rows
    from dbspec.data.sources import DataError
    from dbspec.serving.batch_spark import _check_written

    frame = spark.range(10)
    with pytest.raises(DataError, match="Spark scored 10 rows but 0 reached it"):
        _check_written(frame, 0, 10, "/out")
    _check_written(frame, 10, 10, "/out")  # all there
    _check_written(frame, 10, 14, "/out")  # a retried task counted twice: confirmed, fine
