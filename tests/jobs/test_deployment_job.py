"""The MLflow 3 deployment job of a Unity Catalog model with an approval stage, and the approval
tag its approval task reads (``dbspec approval``) and ``dbspec approve`` sets."""

from __future__ import annotations

import json

import pytest
import yaml
from jsonschema.exceptions import best_match

from tests.conftest import ROOT, run_cli
from tests.jobs.helpers import bundles_round_trip
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
    assert [p["name"] for p in job["parameters"]] == ["model_name", "model_version"]
    assert job["max_concurrent_runs"] == 1 and job["queue"] == {"enabled": True}
    order = {t["task_key"]: [d["task_key"] for d in t.get("depends_on", [])]
             for t in job["tasks"]}
    assert order == {"promote_staging": [], "approval_production": ["promote_staging"],
                     "promote_production": ["approval_production"],
                     "update_endpoint": ["promote_production"]}
    commands = {t["task_key"]: t["python_wheel_task"]["parameters"] for t in job["tasks"]}
    version = "{{job.parameters.model_version}}"
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


def test_the_jobs_output_says_how_to_link_the_deployment_job(tmp_path):
    from tests.jobs.helpers import jobs_cli

    result = jobs_cli(str(DIABETES), "-o", str(tmp_path), "--target", "prod")
    assert result.returncode == 0, result.stderr
    assert "update_registered_model('main.ml_models.diabetes_predictor', " \
           "deployment_job_id='JOB_ID')" in result.stderr


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


def test_an_alert_of_the_monitor_job_starts_the_training_job(tmp_path, bundle_validator,
                                                               bundles):
    generate(DIABETES, tmp_path, "--target", "prod")  # monitoring.retrain: true
    resources = yaml.safe_load((tmp_path / "resources" / "diabetes_regressor.prod.yml")
                               .read_text())
    assert best_match(bundle_validator.iter_errors(resources)) is None
    (target,) = resources["targets"].values()
    job = target["resources"]["jobs"]["diabetes_regressor_monitor"]
    tasks = {t["task_key"]: t for t in job["tasks"]}
    assert list(tasks) == ["monitor", "alerted", "retrain"]
    assert tasks["alerted"]["condition_task"] == {
        "left": "{{tasks.monitor.result_state}}", "op": "EQUAL_TO", "right": "failed"}
    assert tasks["alerted"]["run_if"] == "ALL_DONE"
    assert tasks["retrain"]["depends_on"] == [{"outcome": "true", "task_key": "alerted"}]
    assert tasks["retrain"]["run_job_task"] == {"job_id": "${resources.jobs.diabetes_regressor.id}"}
    bundles_round_trip(bundles, [job])
