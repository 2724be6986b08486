"""What a Spark session dbspec starts prints: only what a run can act on, unless --verbose."""

from __future__ import annotations

import subprocess
import sys

import pytest

from dbspec.spark import QUIET_LOG4J, quiet_java_options
from tests.conftest import checkout_env

pytestmark = pytest.mark.slow

START = """\
from dbspec.spark import spark_session
with spark_session(None, "local[1]") as spark:
    assert spark.range(5).toPandas().shape == (5, 1)  # pyspark warns about pandas 3 here
print("counted")
"""
NOTICES = ("log4j profile", "Setting default log level", "FutureWarning",
           "NativeCodeLoader")


def start_spark(verbose: bool) -> str:
    env = checkout_env({"DBSPEC_VERBOSE": "1" if verbose else ""})
    done = subprocess.run([sys.executable, "-c", START], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0 and "counted" in done.stdout, done.stderr
    return done.stderr


def test_a_session_starts_quietly_and_verbose_shows_what_spark_says():
    # fails on the old code: every Spark run printed the log4j profile, "Setting default log
    # level", loopback-hostname and native-Hadoop warnings and pyspark's pandas warning
    quiet = start_spark(verbose=False)
    assert not [n for n in NOTICES if n in quiet], quiet
    assert "WARN" not in quiet.replace("WARNING: Using incubator modules", ""), quiet
    loud = start_spark(verbose=True)
    assert "Setting default log level" in loud and "FutureWarning" in loud, loud


def test_the_specs_own_log4j_configuration_is_left_alone(monkeypatch):
    monkeypatch.delenv("DBSPEC_VERBOSE", raising=False)
    own = {"spark.driver.extraJavaOptions": "-Dlog4j2.configurationFile=file:/etc/mine"}
    assert quiet_java_options(own) is None
    options = quiet_java_options({"spark.driver.extraJavaOptions": "-Xss4m"})
    assert options.startswith("-Xss4m -Dlog4j2.configurationFile=file:")
    path = options.split("file:", 1)[1]
    assert open(path, encoding="utf-8").read() == QUIET_LOG4J
    monkeypatch.setenv("DBSPEC_VERBOSE", "1")
    assert quiet_java_options({}) is None


ON_DATABRICKS = """\
from pyspark.sql import SparkSession
from dbspec.spark import spark_session
for _ in range(2):  # two stages of one task
    with spark_session(None, "local[1]") as spark:
        assert spark.range(3).count() == 3
assert SparkSession.getActiveSession() is spark  # the cluster's session outlives dbspec's use
assert spark.range(2).count() == 2
print("still running")
"""


def test_on_a_databricks_cluster_the_session_is_the_cluster_s_and_never_stopped():
    # fails on the old code: with no active session yet (a python_wheel_task's process) dbspec
    # built its own with a local master and stopped it, the cluster's SparkContext with it
    env = checkout_env({"DATABRICKS_RUNTIME_VERSION": "17.3"})
    done = subprocess.run([sys.executable, "-c", ON_DATABRICKS], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0 and "still running" in done.stdout, done.stderr
