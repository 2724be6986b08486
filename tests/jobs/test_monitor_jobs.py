"""``dbspec jobs`` with a ``monitoring`` section: the scheduled monitor job (``dbspec monitor``
on its own job cluster) and, for a production endpoint with an AI Gateway inference table, a
``quality_monitors`` resource on that table. Checked against the official bundle schema and
databricks-sdk's classes (no workspace here: what Databricks does with them is not run)."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.jobs.helpers import with_job_ids
from tests.jobs.test_jobs import bundle_validator  # noqa: F401  (a fixture)
from tests.jobs.test_roles import generate, resources

MONITORED = """\
name: watched
data: {source: {kind: sklearn, name: diabetes}, task: regression}
model: {layers: [{linear: {out: 1}}]}
tracking: {experiment: /Shared/watched}
registry:
  name: main.ml_models.watched
  promotion: {alias: champion}
serving:
  mode: realtime
  realtime: {inference_table: {path: /Volumes/main/ml_models/serving/inference}}
monitoring:
  window: 1h
  lookback: 2h
  on_alert: rollback
jobs:
  notifications: {on_failure: [oncall@example.com]}
  monitor_schedule: {quartz_cron: "0 10 * * * ?", timezone: Europe/Berlin}
targets:
  dev:
    default: true
  prod:
    mode: production
"""


@pytest.fixture(scope="module")
def monitored(tmp_path_factory):
    return generate(tmp_path_factory.mktemp("monitored"), MONITORED)


def test_the_bundle_has_a_scheduled_monitor_job_that_validates(monitored, bundle_validator):
    from databricks.sdk.service.jobs import JobSettings
    from jsonschema.exceptions import best_match

    files, _ = monitored
    for name, text in files.items():
        if name.endswith(".yml"):
            error = best_match(bundle_validator.iter_errors(yaml.safe_load(text)))
            assert error is None, f"{name}: {list(error.absolute_path)}: {error.message[:300]}"
    for target in ("dev", "prod"):
        jobs = resources(files, target)["jobs"]
        assert set(jobs) == {"watched", "watched_monitor", "watched_deployment"}
        job = with_job_ids(jobs["watched_monitor"])
        job.pop("permissions", None)
        assert JobSettings.from_dict(job).as_dict() == job
        assert job["schedule"] == {"quartz_cron_expression": "0 10 * * * ?",
                                   "timezone_id": "Europe/Berlin", "pause_status": "UNPAUSED"}
        assert job["max_concurrent_runs"] == 1
        assert job["email_notifications"] == {"on_failure": ["oncall@example.com"]}
        task, due, rollback = job["tasks"]  # on_alert: rollback, through the deployment job
        assert (due["task_key"], rollback["task_key"]) == ("rollback_due", "rollback")
        # acting on an alert tells whom a failure would have told
        assert rollback["email_notifications"] == {"on_start": ["oncall@example.com"]}
        parameters = task["python_wheel_task"]["parameters"]
        assert parameters[:4] == ["monitor", "${workspace.file_path}/specs/spec.yaml", "--target",
                                  target]
        # the task monitors the bundle's own registered model (per user in development)
        assert "--set=registry.name=main.ml_models.${resources.registered_models.watched.name}" \
            in parameters
        assert task["job_cluster_key"] == "main" and job["job_clusters"][0]["new_cluster"]
        assert any("mlflow" in lib.get("pypi", {}).get("package", "") for lib in task["libraries"])


def test_a_production_endpoint_gets_a_quality_monitor_on_its_inference_table(monitored):
    files, warnings = monitored
    assert "quality_monitors" not in resources(files, "dev")
    (monitor,) = resources(files, "prod")["quality_monitors"].values()
    assert monitor["table_name"] == "main.ml_models.watched_prod_payload"
    assert monitor["output_schema_name"] == "main.ml_models"
    assert monitor["time_series"] == {"timestamp_col": "request_time",
                                      "granularities": ["1 hour"]}
    assert monitor["slicing_exprs"] == ["served_entity_id"]
    assert monitor["schedule"] == {"quartz_cron_expression": "0 10 * * * ?",
                                   "timezone_id": "Europe/Berlin"}
    assert any(w.startswith("dev: monitoring: no quality monitor in a development target")
               for w in warnings)
    assert any(w.startswith("prod: monitoring: the quality monitor needs the endpoint's "
                            "inference table") for w in warnings)


def test_the_quality_monitor_table_matches_the_endpoint_inference_table(tmp_path):
    from dbspec.jobs.resources import endpoint_name, inference_table_config
    from tests.jobs.test_roles import spec_of

    spec = spec_of(tmp_path, MONITORED, target="prod")
    table = inference_table_config(spec, endpoint_name(spec, "prod"))
    files, _ = generate(tmp_path, MONITORED)
    (monitor,) = resources(files, "prod")["quality_monitors"].values()
    assert monitor["table_name"] == f"main.ml_models.{table.table_name_prefix}_payload"


def test_jobs_json_has_the_monitor_job_with_the_same_access(tmp_path):
    from databricks.sdk.service.jobs import JobSettings

    text = MONITORED + "roles: {analyst: [user:dave@example.com]}\n"
    files, warnings = generate(tmp_path, text, fmt="jobs-json")
    body = with_job_ids(json.loads(files["watched_monitor.prod.json"]))
    acl = body.pop("access_control_list")
    assert acl == json.loads(files["watched.prod.json"])["access_control_list"]
    assert JobSettings.from_dict(body).as_dict() == body
    assert body["tasks"][0]["python_wheel_task"]["parameters"][:2] == [
        "monitor", "/Workspace/Shared/dbspec/specs/spec.yaml"]


@pytest.mark.parametrize("old, new, warning", [
    ("/Volumes/main/ml_models/serving/inference", ".dbspec/inference_table",
     "a local path; point monitoring.table at the catalog table, or the Volume"),
    ("  lookback: 2h\n", "", "monitoring.lookback is unset: each scheduled pass"),
    ("window: 1h", "window: 2h", "monitoring.window 2h: a Databricks quality monitor "
                                 "aggregates by 5 minutes, 30 minutes, 1 hour, 1 day or 1 week; "
                                 "it uses 1 hour"),
])
def test_what_the_monitor_cannot_do_is_a_warning(tmp_path, old, new, warning):
    assert old in MONITORED
    _, warnings = generate(tmp_path, MONITORED.replace(old, new))
    assert any(warning in w for w in warnings), warnings


def test_a_catalog_table_is_no_local_path(tmp_path):
    """The endpoint's AI Gateway payload table named in the catalog: the monitor job reads it
    through the cluster's Spark session, so there is nothing to warn about."""
    text = MONITORED.replace("/Volumes/main/ml_models/serving/inference",
                             "main.ml_models.watched_payload")
    assert text != MONITORED
    _, warnings = generate(tmp_path, text)
    assert not any("a local path" in w for w in warnings), warnings


def test_without_monitoring_there_is_no_monitor_job(tmp_path):
    text = MONITORED.replace("monitoring:\n  window: 1h\n  lookback: 2h\n  on_alert: rollback\n",
                             "")
    files, _ = generate(tmp_path, text)
    assert set(resources(files, "prod")["jobs"]) == {"watched", "watched_deployment"}
    assert "quality_monitors" not in resources(files, "prod")
