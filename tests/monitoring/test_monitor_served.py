"""``dbspec monitor`` end to end: a registered model served by a real ``dbspec serve`` on
127.0.0.1, real HTTP requests, its real Delta inference table, MLflow on SQLite.

The traffic, sent once for the module: a burst whose ``bmi`` is shifted by five standard
deviations, then (from ``since``) unshifted bursts in consecutive 2-second windows.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import numpy as np
import pytest

from dbspec.monitoring.monitor import iso_utc
from tests.conftest import ROOT, run_in_process
from tests.serving import conftest as serving
from tests.serving.conftest import AUTH, FEATURES, NAME, start_server

registered = serving.registered  # the serving tests' two registered versions, as a fixture

WINDOW_S = 2


def _burst(url: str, rows: np.ndarray, rng, *, shift: float = 0.0, requests: int = 30) -> None:
    for _ in range(requests):
        batch = rows[rng.integers(0, len(rows), 8)].copy()
        batch[:, FEATURES.index("bmi")] += shift
        answer = httpx.post(url + "/invocations", headers=AUTH, timeout=30,
                            json={"dataframe_split": {"columns": FEATURES,
                                                      "data": batch.tolist()}})
        assert answer.status_code == 200, answer.text


def _next_window() -> float:
    """Sleep to the start of the next window; its start (epoch seconds)."""
    start = (int(time.time()) // WINDOW_S + 1) * WINDOW_S
    time.sleep(max(0.0, start - time.time()) + 0.01)
    return float(start)


@pytest.fixture(scope="module")
def traffic(registered, tmp_path_factory):
    from sklearn.datasets import load_diabetes

    env = {"MLFLOW_TRACKING_URI": registered.tracking_uri}
    for version in ("1", "2"):  # v1 then v2 hold @production: a rollback returns to v1
        moved = run_in_process("promote", NAME, version, "--alias", "production", "--force",
                               cwd=registered.workdir, env=env)
        assert moved.returncode == 0, moved.stderr
    table = tmp_path_factory.mktemp("monitor") / "inference"
    server = start_server(registered, f"models:/{NAME}@production", "--inference-table",
                          str(table), log=table.parent / "serve.log")
    rows = load_diabetes().data
    rng = np.random.default_rng(17)
    try:
        _burst(server.url, rows, rng, shift=5 * rows[:, FEATURES.index("bmi")].std())
        since = _next_window()
        for _ in range(3):
            _burst(server.url, rows, rng)
            _next_window()
    finally:
        assert server.stop() == 0, server.output()
    return SimpleNamespace(table=str(table), since=since, env=env, workdir=registered.workdir,
                           uri=registered.tracking_uri)


def monitor(traffic, *args: str):
    return run_in_process("monitor", *args, cwd=traffic.workdir, env=traffic.env, timeout=300)


def _client(traffic):
    from mlflow import MlflowClient

    return MlflowClient(traffic.uri)


def test_a_shifted_feature_makes_monitor_exit_3_naming_it(traffic):
    result = monitor(traffic, f"models:/{NAME}/2", "--table", traffic.table,
                     "--window", f"{WINDOW_S}s")
    assert result.returncode == 3, result.stdout + result.stderr
    alert = result.stderr.strip().splitlines()[-1]
    assert alert.startswith(f"alert: {NAME} v2: drift in ") and "bmi" in alert
    named = set(alert.split("drift in ")[1].split(" (exit")[0].split(", "))
    assert named <= {"bmi", "prediction"}, alert
    assert "ALERT" in result.stdout and "bmi: PSI" in result.stdout
    # the pass is an MLflow run linked to the version, with per-window metrics and plots
    client = _client(traffic)
    run_id = client.get_model_version(NAME, "2").tags["dbspec.monitoring.last_run"]
    run = client.get_run(run_id)
    assert run.data.tags["dbspec.model_version"] == "2"
    assert run.data.tags["dbspec.monitoring.status"] == "alert"
    history = client.get_metric_history(run_id, "psi.bmi")
    assert len(history) >= 2 and max(m.value for m in history) > 1.0
    assert sorted({m.step for m in history}) == list(range(len(history)))
    logged = {a.path for a in client.list_artifacts(run_id, "plots")} | \
        {a.path for a in client.list_artifacts(run_id, "monitoring")}
    assert {"plots/drift_over_time.png", "plots/distributions.png",
            "monitoring/drift_table.csv", "monitoring/report.json"} <= logged


def test_unshifted_requests_do_not_alarm_over_repeated_windows(traffic):
    # each burst starts a window; one slowed past its window's end (a loaded machine) still
    # leaves at least half its 240 rows in one window: --min-rows 60 checks every burst
    result = monitor(traffic, f"models:/{NAME}/2", "--table", traffic.table, "--since",
                     iso_utc(traffic.since), "--window", f"{WINDOW_S}s", "--min-rows", "60",
                     "--format", "json")
    assert result.returncode == 0, result.stdout + result.stderr
    [version] = json.loads(result.stdout)["versions"]
    checked = [w for w in version["windows"] if w["status"] != "too few rows"]
    assert len(checked) >= 3, version["windows"]
    # the spill of a slowed burst is a window of too few rows: reported, not checked
    assert all(w["status"] != "alert" and not w["alerts"] for w in version["windows"]), \
        [(w["status"], w["rows"], w["alerts"]) for w in version["windows"]]
    assert sum(w["rows"] for w in version["windows"]) == 3 * 30 * 8
    assert sum(w["requests"] for w in version["windows"]) == 3 * 30
    # no alert, no plots (matplotlib costs a second a pass): MLflow charts the window metrics
    assert _client(traffic).list_artifacts(version["run_id"], "plots") == []


def _labels(traffic, path: Path, offset: float) -> str:
    """Labels for the unshifted rows: each row's prediction plus ``offset`` (and noise), one
    per row of a request (request_id, row)."""
    from deltalake import DeltaTable

    frame = DeltaTable(traffic.table).to_pandas(columns=["request_id", "timestamp",
                                                         "prediction"])
    frame["row"] = frame.groupby("request_id").cumcount()
    frame = frame[frame["timestamp"].astype("int64") >= traffic.since * 1e6]  # UTC us
    noise = np.random.default_rng(0).normal(scale=5.0, size=len(frame))
    frame["target"] = frame["prediction"] + offset + noise
    frame[["request_id", "row", "target"]].to_csv(path, index=False)
    return str(path)


def test_labels_give_quality_metrics_and_a_drop_alerts(traffic, tmp_path):
    close = _labels(traffic, tmp_path / "close.csv", 0.0)
    result = monitor(traffic, f"models:/{NAME}/2", "--table", traffic.table, "--since",
                     iso_utc(traffic.since), "--window", "1d", "--labels", close,
                     "--format", "json")
    assert result.returncode == 0, result.stdout + result.stderr
    windows = json.loads(result.stdout)["versions"][0]["windows"]  # one, unless a day began
    assert sum(w["labelled"] for w in windows) == 720
    window = max(windows, key=lambda w: w["labelled"])
    test_rmse = float(_client(traffic).get_model_version(NAME, "2").tags["metric.test_rmse"])
    assert window["quality"]["rmse"]["reference"] == pytest.approx(test_rmse, rel=1e-5)
    assert 3.0 < window["quality"]["rmse"]["value"] < 7.0
    far = _labels(traffic, tmp_path / "far.csv", 3 * test_rmse)
    result = monitor(traffic, f"models:/{NAME}/2", "--table", traffic.table, "--since",
                     iso_utc(traffic.since), "--window", "1d", "--labels", far)
    assert result.returncode == 3, result.stdout + result.stderr
    assert "quality: rmse" in result.stdout and "quality drop" in result.stderr


def test_on_alert_rollback_moves_the_alias_back_and_says_why(traffic):
    """The documented loop on the diabetes spec (docs/operations/monitoring.md): its monitoring
    section rolls @production back."""
    client = _client(traffic)
    assert str(client.get_model_version_by_alias(NAME, "production").version) == "2"
    try:
        result = monitor(traffic, str(ROOT / "specs" / "diabetes.yaml"), "--set",
                         f"registry.name={NAME}", "--table", traffic.table)
        assert result.returncode == 3, result.stdout + result.stderr
        assert f"rolled back {NAME}@production: v2 -> v1" in result.stdout
        assert str(client.get_model_version_by_alias(NAME, "production").version) == "1"
        run_id = client.get_model_version(NAME, "2").tags["dbspec.monitoring.last_run"]
        assert "v1" in client.get_model_version(NAME, "2").tags["dbspec.monitoring.rolled_back"]
        restored = client.get_model_version(NAME, "1").tags["dbspec.monitoring.restored"]
        assert "from v2" in restored and run_id in restored and "bmi" in restored
    finally:
        moved = run_in_process("promote", NAME, "2", "--alias", "production", "--force",
                               cwd=traffic.workdir, env=traffic.env)
        assert moved.returncode == 0, moved.stderr


def test_a_spec_monitors_with_its_section_and_tags_on_alert(traffic, tmp_path):
    spec = tmp_path / "monitored.yaml"
    spec.write_text(f"""\
name: monitored
data: {{source: {{kind: sklearn, name: diabetes}}, task: regression}}
model: {{layers: [{{linear: {{out: 1}}}}]}}
registry: {{name: {NAME}}}
serving: {{model_alias: production}}
monitoring:
  table: {traffic.table}
  window: 1h
  lookback: 1d
  on_alert: tag
  experiment: monitored-drift
""")
    assert monitor(traffic, str(spec), "--since", "all").returncode == 3
    result = monitor(traffic, str(spec))  # the last day: all of this traffic
    assert result.returncode == 3, result.stdout + result.stderr
    assert f"tagged {NAME} v2 dbspec.monitoring.alert" in result.stdout
    client = _client(traffic)
    assert "bmi" in client.get_model_version(NAME, "2").tags["dbspec.monitoring.alert"]
    assert str(client.get_model_version_by_alias(NAME, "production").version) == "2"  # tagged
    experiment = client.get_experiment_by_name("monitored-drift")
    assert client.search_runs([experiment.experiment_id])


@pytest.mark.parametrize("args, code, message", [
    (["--table", "{tmp}/nowhere"], 1, "does not exist: serve the model"),
    ([], 2, "give --table PATH"),
    (["--table", "{table}", "--since", "yesterday"], 2, "--since 'yesterday': expected"),
    (["--table", "{table}", "--window", "5 minutes"], 2, "--window '5 minutes' is not a"),
    (["--table", "{table}", "--since", "2099-01-01T00:00Z"], 1, "no rows of"),
    (["--table", "{table}", "--labels", "{tmp}/none.csv"], 1, "labels {tmp}/none.csv do not"),
    (["--table", "{table}", "--min-rows", "0"], 2, "--min-rows must be at least 1"),
    (["--table", "{table}", "--tracking-uri", "sqlite:///{tmp}/none.db"], 1, "none.db"),
])
def test_mistakes_are_clear_errors(traffic, tmp_path, args, code, message):
    filled = [a.format(tmp=tmp_path, table=traffic.table) for a in args]
    result = monitor(traffic, f"models:/{NAME}/2", *filled)
    assert result.returncode == code, result.stdout + result.stderr
    assert message.format(tmp=tmp_path) in result.stderr
    assert "Traceback" not in result.stderr


def test_a_version_without_a_reference_profile_is_named(traffic, tmp_path):
    """A version registered from a run that logged no profile (trained before dbspec wrote
    them): rows of it in the table are an error that names it."""
    from dbspec.serving.inference_table import InferenceTable, Record

    client = _client(traffic)
    trained = client.get_run(client.get_model_version(NAME, "1").run_id)
    bare = client.create_run(trained.info.experiment_id)
    client.set_terminated(bare.info.run_id)
    client.create_registered_model("unprofiled")
    client.create_model_version("unprofiled", str(tmp_path / "model"), run_id=bare.info.run_id)
    table = InferenceTable(tmp_path / "t", flush_seconds=0.05)
    table.check()
    table.start()
    table.offer(Record("r1", time.time(), "unprofiled", "1", 1.0, tuple(FEATURES),
                       np.zeros((1, 10), dtype=np.float32), {"prediction": np.zeros(1)}))
    table.close()
    result = monitor(traffic, "models:/unprofiled/1", "--table", str(tmp_path / "t"))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "unprofiled v1 has no reference profile" in result.stderr
    # next to a version that has one, it is left out with a warning, the other is monitored
    profiled = client.get_model_version(NAME, "2").run_id
    client.create_model_version("unprofiled", str(tmp_path / "model"), run_id=profiled)
    table = InferenceTable(tmp_path / "t", flush_seconds=0.05)
    table.start()
    table.offer(Record("r2", time.time(), "unprofiled", "2", 1.0, tuple(FEATURES),
                       np.zeros((1, 10), dtype=np.float32), {"prediction": np.zeros(1)}))
    table.close()
    result = monitor(traffic, "models:/unprofiled", "--table", str(tmp_path / "t"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "warning: unprofiled v1 has no reference profile" in result.stderr
    assert "its rows are left out" in result.stderr
    assert "unprofiled v2 in" in result.stdout and "too few rows" in result.stdout


def _task_values(stderr: str) -> str:
    return next(line for line in stderr.splitlines() if line.startswith("task values"))


def test_task_values_tell_an_alert_from_a_crash_and_defer_the_rollback(traffic):
    """A Databricks job's monitor task (--task-values): an alert exits 0 with alert=true and,
    with --defer-rollback, the version @production goes back to (moving nothing); calm traffic
    exits 0 with alert=false; an error exits 1 and sets nothing."""
    client = _client(traffic)
    spec = ["--set", f"registry.name={NAME}", "--table", traffic.table]
    result = monitor(traffic, str(ROOT / "specs" / "diabetes.yaml"), *spec, "--task-values",
                     "--defer-rollback")
    assert result.returncode == 0, result.stdout + result.stderr
    assert _task_values(result.stderr) == ("task values (not in a Databricks job: unset): "
                                           "alert=true rollback_to=1 rollback_from=2")
    assert f"rollback of {NAME}@production v2 -> v1 handed to the deployment job" in \
        result.stdout
    assert str(client.get_model_version_by_alias(NAME, "production").version) == "2"
    assert "bmi" in client.get_model_version(NAME, "2").tags["dbspec.monitoring.alert"]
    calm = monitor(traffic, f"models:/{NAME}/2", "--table", traffic.table, "--since",
                   iso_utc(traffic.since), "--window", f"{WINDOW_S}s", "--min-rows", "60",
                   "--task-values")
    assert calm.returncode == 0, calm.stdout + calm.stderr
    assert _task_values(calm.stderr).endswith("alert=false rollback_to=none rollback_from=none")
    crash = monitor(traffic, f"models:/{NAME}/2", "--table", traffic.table + "-gone",
                    "--task-values")
    assert crash.returncode == 1 and "task values" not in crash.stderr
    usage = monitor(traffic, f"models:/{NAME}/2", "--table", traffic.table, "--defer-rollback")
    assert usage.returncode == 2 and "give --task-values" in usage.stderr


def test_on_databricks_the_task_values_go_to_the_runtime_dbutils(traffic, tmp_path):
    """On a cluster, databricks-sdk's runtime dbutils is the runtime's own: a stand-in for the
    runtime's namespace records what dbspec sets. Where the runtime gives no dbutils, setting
    them fails, and so does the task (an alert never passes for success unseen)."""
    from tests.conftest import run_cli

    stand_in = tmp_path / "runtime" / "dbruntime"
    stand_in.mkdir(parents=True)
    (stand_in / "__init__.py").write_text("""\
import json, os
class _TaskValues:
    def set(self, key, value):
        with open(os.environ["TASK_VALUES_LOG"], "a") as log:
            log.write(json.dumps([key, value]) + "\\n")
class _Jobs:
    taskValues = _TaskValues()
class _DbUtils:
    jobs = _Jobs()
class UserNamespaceInitializer:
    @classmethod
    def getOrCreate(cls):
        return cls()
    def get_namespace_globals(self):
        return {"dbutils": _DbUtils()}
""")
    log = tmp_path / "values.jsonl"
    args = ["monitor", f"models:/{NAME}/2", "--table", traffic.table, "--window",
            f"{WINDOW_S}s", "--task-values"]
    env = {**traffic.env, "DATABRICKS_RUNTIME_VERSION": "16.4", "TASK_VALUES_LOG": str(log),
           "PYTHONPATH": str(stand_in.parent)}  # after this checkout's (run_cli)
    done = run_cli(*args, cwd=traffic.workdir, env=env, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert [json.loads(line) for line in log.read_text().splitlines()] == [
        ["alert", "true"], ["rollback_to", "none"], ["rollback_from", "none"]]
    assert _task_values(done.stderr) == "task values: alert=true rollback_to=none " \
                                        "rollback_from=none"
    env["PYTHONPATH"] = ""  # no runtime namespace: databricks-sdk's remote dbutils sets nothing
    failed = run_cli(*args, cwd=traffic.workdir, env=env, timeout=600)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "cannot set the task values alert, rollback_to, rollback_from" in failed.stderr
    assert "Traceback" not in failed.stderr
    # the pass's report is shown before the refusal (its MLflow run and rates differ)
    assert failed.stdout.splitlines()[:3] == done.stdout.splitlines()[:3] != []
