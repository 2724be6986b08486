"""The MLflow 3 deployment job of a Unity Catalog model with an approval stage, and the approval
tag its approval task reads (``dbspec approval``) and ``dbspec approve`` sets."""

from __future__ import annotations

import json

import pytest
import yaml
from jsonschema.exceptions import best_match

from tests.conftest import ROOT, run_cli
from tests.jobs.helpers import bundles_round_trip, with_job_ids
from tests.jobs.test_jobs import bundle_validator, generate  # noqa: F401 (fixture)

DIABETES = ROOT / "specs" / "diabetes.yaml"  # prod: main.ml_models.diabetes_predictor



@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    """A folder for databricks-bundles (see tests.jobs.helpers.bundles_round_trip)."""
    return tmp_path_factory.mktemp("bundles")

def deployment_of(out) -> dict:
    generate(DIABETES, out, "--target", "prod")
    (target,) = yaml.safe_load((out / "resources" / "diabetes_regressor.prod.yml")
                               .read_text())["targets"].values()
    return target["resources"]["jobs"]["diabetes_regressor_deployment"]


def test_a_uc_model_with_an_approval_stage_gets_the_deployment_job(tmp_path, bundle_validator):
    job = deployment_of(tmp_path)
    assert [p["name"] for p in job["parameters"]] == ["model_name", "model_version",
                                                      "rollback_from"]
    assert job["max_concurrent_runs"] == 1 and job["queue"] == {"enabled": True}
    order = {t["task_key"]: [(d["task_key"], d.get("outcome")) for d in t.get("depends_on", [])]
             for t in job["tasks"]}
    # MLflow's runs (rollback_from: none) take the gates; the monitor job's take the rollback
    assert order == {"rollback_requested": [], "rollback": [("rollback_requested", "true")],
                     "promote_staging": [("rollback_requested", "false")],
                     "approval_production": [("promote_staging", None)],
                     "promote_production": [("approval_production", None)],
                     "update_endpoint": [("promote_production", None), ("rollback", None)]}
    tasks = {t["task_key"]: t for t in job["tasks"]}
    assert tasks["rollback_requested"]["condition_task"] == {
        "left": "{{job.parameters.rollback_from}}", "op": "NOT_EQUAL", "right": "none"}
    assert tasks["update_endpoint"]["run_if"] == "AT_LEAST_ONE_SUCCESS"  # after either branch
    commands = {t["task_key"]: t["python_wheel_task"]["parameters"] for t in job["tasks"]
                if "python_wheel_task" in t}
    version = "{{job.parameters.model_version}}"
    assert commands["rollback"] == ["rollback", "{{job.parameters.model_name}}", "--alias",
                                    "production", "--to", version, "--expected",
                                    "{{job.parameters.rollback_from}}"]
    assert commands["promote_staging"][:2] == ["promote", "{{job.parameters.model_name}}"]
    assert commands["approval_production"] == [
        "approval", "{{job.parameters.model_name}}", version, "--alias", "production",
        "--tag", "approval_production"]
    assert commands["promote_production"][0] == "approve"
    assert commands["update_endpoint"][0] == "endpoint"
    resources = yaml.safe_load((tmp_path / "resources" / "diabetes_regressor.prod.yml")
                               .read_text())
    error = best_match(bundle_validator.iter_errors(resources))
    assert error is None, error.message[:300]
    # the dev target's registry is no Unity Catalog model: no deployment job there
    generate(DIABETES, tmp_path / "dev", "--target", "dev")
    (dev,) = yaml.safe_load((tmp_path / "dev" / "resources" / "diabetes_regressor.dev.yml")
                            .read_text())["targets"].values()
    assert "diabetes_regressor_deployment" not in dev["resources"]["jobs"]


def test_the_deployment_job_loads_into_the_sdk_and_databricks_bundles(tmp_path, bundles):
    from databricks.sdk.service.jobs import JobSettings

    job = deployment_of(tmp_path)
    settings = {k: v for k, v in job.items() if k != "permissions"}
    assert JobSettings.from_dict(settings).as_dict() == settings
    bundles_round_trip(bundles, [job])


def test_the_main_job_links_the_deployment_job_before_registering(tmp_path):
    generate(DIABETES, tmp_path, "--target", "prod")
    (target,) = yaml.safe_load((tmp_path / "resources" / "diabetes_regressor.prod.yml")
                               .read_text())["targets"].values()
    tasks = {t["task_key"]: t for t in target["resources"]["jobs"]["diabetes_regressor"]["tasks"]}
    assert tasks["link_deployment_job"]["python_wheel_task"]["parameters"][:3] == [
        "link-job", "main.ml_models.${resources.registered_models.diabetes_regressor.name}",
        "${resources.jobs.diabetes_regressor_deployment.id}"]
    assert {"task_key": "link_deployment_job"} in tasks["evaluate"]["depends_on"]  # registers


def test_approval_passes_on_the_approved_tag_only(tmp_path):
    import mlflow

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)
    client.create_registered_model("main.ml.model")
    client.create_model_version("main.ml.model", source=str(tmp_path))
    args = ["approval", "main.ml.model", "1", "--alias", "production",
            "--tag", "approval_production", "--tracking-uri", uri,
            "--state-dir", str(tmp_path)]
    refused = run_cli(*args)
    assert refused.returncode == 1
    assert "main.ml.model v1 is not approved for @production: its tag approval_production " \
           "is None" in refused.stderr and "Traceback" not in refused.stderr
    client.set_model_version_tag("main.ml.model", "1", "approval_production", "approved")
    passed = run_cli(*args)
    assert passed.returncode == 0, passed.stderr
    assert json.dumps("approval_production=approved")[1:-1] in passed.stdout


def test_an_alert_of_the_monitor_job_retrains_and_rolls_back_a_crash_does_neither(
        tmp_path, bundle_validator, bundles):
    from databricks.sdk.service.jobs import JobSettings

    generate(DIABETES, tmp_path, "--target", "prod")  # retrain: true, on_alert: rollback
    resources = yaml.safe_load((tmp_path / "resources" / "diabetes_regressor.prod.yml")
                               .read_text())
    assert best_match(bundle_validator.iter_errors(resources)) is None
    (target,) = resources["targets"].values()
    job = target["resources"]["jobs"]["diabetes_regressor_monitor"]
    tasks = {t["task_key"]: t for t in job["tasks"]}
    assert list(tasks) == ["monitor", "alerted", "retrain", "rollback_due", "rollback"]
    # the task reports its outcome and leaves the rollback to the deployment job
    assert tasks["monitor"]["python_wheel_task"]["parameters"][-2:] == ["--task-values",
                                                                        "--defer-rollback"]
    assert tasks["alerted"]["condition_task"] == {
        "left": "{{tasks.monitor.values.alert}}", "op": "EQUAL_TO", "right": "true"}
    assert tasks["rollback_due"]["condition_task"] == {
        "left": "{{tasks.monitor.values.rollback_to}}", "op": "NOT_EQUAL", "right": "none"}
    for check in ("alerted", "rollback_due"):  # all succeeded (the default): a crash skips it
        assert tasks[check]["depends_on"] == [{"task_key": "monitor"}]
        assert "run_if" not in tasks[check]
    assert tasks["retrain"]["depends_on"] == [{"outcome": "true", "task_key": "alerted"}]
    assert tasks["retrain"]["run_job_task"] == {"job_id": "${resources.jobs.diabetes_regressor.id}"}
    assert tasks["rollback"]["depends_on"] == [{"outcome": "true", "task_key": "rollback_due"}]
    assert tasks["rollback"]["run_job_task"] == {
        "job_id": "${resources.jobs.diabetes_regressor_deployment.id}",
        "job_parameters": {
            "model_name": "main.ml_models.${resources.registered_models.diabetes_regressor.name}",
            "model_version": "{{tasks.monitor.values.rollback_to}}",
            "rollback_from": "{{tasks.monitor.values.rollback_from}}"}}
    bundles_round_trip(bundles, [job, target["resources"]["jobs"]["diabetes_regressor"]])
    settings = with_job_ids({k: v for k, v in job.items() if k != "permissions"})
    assert JobSettings.from_dict(settings).as_dict() == settings  # once the ids are in


def test_without_an_action_on_alert_the_monitor_task_fails_on_it(tmp_path):
    """on_alert: tag and no retrain: nothing reads task values, so an alert fails the run (and
    the job's failure notifications fire) as dbspec monitor's exit 3 does."""
    spec = tmp_path / "diabetes.yaml"
    spec.write_text(DIABETES.read_text().replace("on_alert: rollback", "on_alert: tag")
                    .replace("retrain: true", "retrain: false"))
    generate(spec, tmp_path / "out", "--target", "prod")
    (target,) = yaml.safe_load((tmp_path / "out" / "resources" / "diabetes_regressor.prod.yml")
                               .read_text())["targets"].values()
    (task,) = target["resources"]["jobs"]["diabetes_regressor_monitor"]["tasks"]
    assert "--task-values" not in task["python_wheel_task"]["parameters"]
    deployment = target["resources"]["jobs"]["diabetes_regressor_deployment"]
    assert "rollback" not in {t["task_key"] for t in deployment["tasks"]}
