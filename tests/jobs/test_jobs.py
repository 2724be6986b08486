"""``dbspec jobs``: bundles checked against the official bundle schema, Jobs API payloads
checked against databricks-sdk's classes, and the ``--check`` workflow."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, SPECS, run_cli

SCHEMA = Path(__import__("os").environ.get(
    "DBSPEC_BUNDLE_SCHEMA", ROOT.parent / "shared" / "reference" / "databricks-bundle.schema.json"))


@pytest.fixture(scope="module")
def bundle_validator():
    """The bundle schema, with its \\p{L} patterns run by the ``regex`` package."""
    if not SCHEMA.exists():
        pytest.skip(f"no bundle schema at {SCHEMA} (set DBSPEC_BUNDLE_SCHEMA)")
    import regex
    from jsonschema import Draft202012Validator, validators
    from jsonschema.exceptions import ValidationError

    def pattern(validator, expected, instance, schema):
        if validator.is_type(instance, "string") and not regex.search(expected, instance):
            yield ValidationError(f"{instance!r} does not match {expected!r}")

    checked = validators.extend(Draft202012Validator, {"pattern": pattern})
    return checked(json.loads(SCHEMA.read_text()))


def generate(spec, out, *args) -> None:
    result = run_cli("jobs", str(spec), "-o", str(out), *args)
    assert result.returncode == 0, result.stderr


def assert_shared_dir_handover(job: dict, reference: str) -> None:
    """Every task gets ``--shared-dir reference`` and nothing points at a node's own disk."""
    for task in job["tasks"]:
        parameters = task["python_wheel_task"]["parameters"]
        assert not [p for p in parameters if "local_disk0" in p], (task["task_key"], parameters)
        assert "--state-dir" not in parameters, task["task_key"]  # node-local scratch
        at = parameters.index("--shared-dir")
        assert parameters[at + 1] == reference, (task["task_key"], parameters)
    assert "local_disk0" not in json.dumps(job)


@pytest.mark.parametrize("spec", SPECS, ids=lambda p: p.name)
def test_every_bundle_file_validates_against_the_bundle_schema(spec, tmp_path, bundle_validator):
    from jsonschema.exceptions import best_match

    generate(spec, tmp_path)
    files = [tmp_path / "databricks.yml", *sorted((tmp_path / "resources").glob("*.yml"))]
    assert len(files) >= 2
    for path in files:
        data = yaml.safe_load(path.read_text())
        error = best_match(bundle_validator.iter_errors(data))
        assert error is None, f"{path.name}: {list(error.absolute_path)}: {error.message[:300]}"
    for path in files[1:]:
        (target,) = yaml.safe_load(path.read_text())["targets"].values()
        for job in target["resources"]["jobs"].values():
            assert_shared_dir_handover(job, "${var.shared_dir}")
    root = yaml.safe_load((tmp_path / "databricks.yml").read_text())
    variable = root["variables"]["shared_dir"]
    assert variable["description"] and variable["default"]
    assert "local_disk0" not in variable["default"]
    document = yaml.safe_load(spec.read_text())
    expected = {name: t.get("mode", "development")
                for name, t in (document.get("targets") or {}).items()} or \
        {"default": "development"}
    assert {n: t["mode"] for n, t in root["targets"].items()} == expected
    assert (tmp_path / "specs" / spec.name).read_text() == spec.read_text()


def test_the_schema_check_can_fail(tmp_path, bundle_validator):
    generate(SPECS[0], tmp_path)
    path = next((tmp_path / "resources").glob("*.yml"))
    data = yaml.safe_load(path.read_text())
    (target,) = data["targets"].values()
    job = next(iter(target["resources"]["jobs"].values()))
    job["tasks"][0]["not_a_task_field"] = 1
    assert list(bundle_validator.iter_errors(data))


@pytest.mark.parametrize("spec", SPECS, ids=lambda p: p.name)
def test_every_payload_round_trips_through_the_sdk_classes(spec, tmp_path):
    from databricks.sdk.service.jobs import JobAccessControlRequest, JobSettings

    generate(spec, tmp_path, "--format", "jobs-json")
    payloads = sorted(tmp_path.glob("*.json"))
    assert payloads
    for path in payloads:
        body = json.loads(path.read_text())
        acl = body.pop("access_control_list", [])
        assert JobSettings.from_dict(body).as_dict() == body
        assert [JobAccessControlRequest.from_dict(a).as_dict() for a in acl] == acl
        # Jobs API bodies have no bundle variables: a job parameter carries the directory
        (parameter,) = body["parameters"]
        assert parameter["name"] == "shared_dir" and parameter["default"]
        assert_shared_dir_handover(body, "{{job.parameters.shared_dir}}")


def payload(tmp_path, spec=SPECS[0], *args, name=None) -> dict:
    generate(spec, tmp_path, "--format", "jobs-json", *args)
    files = sorted(tmp_path.glob("*.json"))
    chosen = next(p for p in files if name is None or p.name == name)
    return json.loads(chosen.read_text())


def tasks_of(body: dict) -> dict[str, list[str]]:
    return {t["task_key"]: [d["task_key"] for d in t.get("depends_on", [])]
            for t in body["tasks"]}


def test_tasks_mirror_the_plan_and_run_their_stages_with_a_shared_run_key(tmp_path):
    body = payload(tmp_path, ROOT / "specs" / "diabetes.yaml", "--target", "prod")
    assert tasks_of(body) == {"data": [], "train": ["data"], "evaluate": ["data", "train"],
                              "promote": ["evaluate"], "serve": ["promote"]}
    params = {t["task_key"]: t["python_wheel_task"]["parameters"] for t in body["tasks"]}
    assert params["evaluate"][:4] == ["run", "/Workspace/Shared/dbspec/specs/diabetes.yaml",
                                      "--target", "prod"]
    assert params["evaluate"][4:8] == ["--only", "evaluate,register", "--run-key",
                                       "{{job.run_id}}"]
    wheel = body["tasks"][0]["python_wheel_task"]
    assert (wheel["package_name"], wheel["entry_point"]) == ("dbspec", "dbspec")
    assert body["tasks"][0]["libraries"][0]["whl"].endswith("-py3-none-any.whl")
    env = body["job_clusters"][0]["new_cluster"]["spark_env_vars"]
    assert env == {"MLFLOW_TRACKING_URI": "databricks", "MLFLOW_REGISTRY_URI": "databricks-uc"}


def test_the_shared_dir_defaults_to_a_volume_beside_the_registered_model(tmp_path):
    # diabetes registers to main.ml_models.diabetes_predictor in prod only
    prod = payload(tmp_path / "a", ROOT / "specs" / "diabetes.yaml", "--target", "prod")
    assert prod["parameters"] == [{"name": "shared_dir",
                                   "default": "/Volumes/main/ml_models/dbspec"}]
    dev = payload(tmp_path / "b", ROOT / "specs" / "diabetes.yaml", "--target", "dev")
    assert dev["parameters"] == [{"name": "shared_dir", "default": "/Volumes/main/default/dbspec"}]
    generate(ROOT / "specs" / "diabetes.yaml", tmp_path / "c")
    root = yaml.safe_load((tmp_path / "c" / "databricks.yml").read_text())
    assert root["variables"]["shared_dir"]["default"] == "/Volumes/main/default/dbspec"
    assert root["targets"]["prod"]["variables"] == {"shared_dir": "/Volumes/main/ml_models/dbspec"}
    assert "variables" not in root["targets"]["dev"]  # the default already fits


SHARED_SECTION = """\
jobs: {shared_dir: /Volumes/main/ml/dbspec}
targets:
  dev: {default: true}
  prod:
    mode: production
    jobs: {shared_dir: "/mnt/ml-bucket/dbspec", state_dir: /Volumes/main/ml/state}
"""


def test_jobs_shared_dir_and_its_target_override_reach_the_output(tmp_path, write_spec,
                                                                  bundle_validator):
    from tests.conftest import MINIMAL

    spec = write_spec(MINIMAL + SHARED_SECTION)
    generate(spec, tmp_path / "bundle")
    root = yaml.safe_load((tmp_path / "bundle" / "databricks.yml").read_text())
    assert list(bundle_validator.iter_errors(root)) == []
    assert root["variables"]["shared_dir"]["default"] == "/Volumes/main/ml/dbspec"
    assert root["targets"]["prod"]["variables"] == {"shared_dir": "/mnt/ml-bucket/dbspec"}
    assert "variables" not in root["targets"]["dev"]
    prod = payload(tmp_path / "json", spec, name="minimal.prod.json")
    assert prod["parameters"] == [{"name": "shared_dir", "default": "/mnt/ml-bucket/dbspec"}]
    for task in prod["tasks"]:  # an explicit state dir is the user's choice, passed on
        parameters = task["python_wheel_task"]["parameters"]
        assert parameters[parameters.index("--state-dir") + 1] == "/Volumes/main/ml/state"
    dev = payload(tmp_path / "json", spec, name="minimal.dev.json")
    assert dev["parameters"] == [{"name": "shared_dir", "default": "/Volumes/main/ml/dbspec"}]
    assert_shared_dir_handover(dev, "{{job.parameters.shared_dir}}")


def test_a_shared_spark_dir_is_the_jobs_default_and_a_local_one_is_not():
    from types import SimpleNamespace as NS

    from dbspec.jobs.build import DEFAULT_SHARED_DIR, shared_dir

    def spec(jobs_dir=None, spark_dir=None, registry=None):
        return NS(jobs=NS(shared_dir=jobs_dir), spark=NS(shared_dir=spark_dir),
                  registry=registry and NS(name=registry))

    assert shared_dir(spec(spark_dir="/Volumes/c/s/v")) == "/Volumes/c/s/v"
    assert shared_dir(spec("dbfs:/dbspec", "/Volumes/c/s/v")) == "dbfs:/dbspec"
    assert shared_dir(spec(spark_dir=".dbspec/shared")) == DEFAULT_SHARED_DIR  # a local run's
    assert shared_dir(spec(spark_dir="/local_disk0/x", registry="c.s.m")) == "/Volumes/c/s/dbspec"
    assert shared_dir(spec(registry="workspace_model")) == DEFAULT_SHARED_DIR
    assert shared_dir(NS(jobs=NS(shared_dir=None), spark=NS(), registry=None)) == \
        DEFAULT_SHARED_DIR  # a spark section without the field


def test_a_node_local_shared_dir_is_a_warning(tmp_path, write_spec):
    from tests.conftest import MINIMAL

    result = run_cli("jobs", write_spec(MINIMAL + "jobs: {shared_dir: /tmp/dbspec}\n"),
                     "-o", str(tmp_path))
    assert result.returncode == 0
    assert "warning: default: jobs.shared_dir '/tmp/dbspec' is on each node's own disk" \
        in result.stderr


def test_search_and_batch_specs_get_their_tasks(tmp_path):
    search = payload(tmp_path / "a", ROOT / "specs" / "breast_cancer_search.yaml")
    assert tasks_of(search)["train"] == ["data", "tune"]
    batch = payload(tmp_path / "b", ROOT / "specs" / "diabetes_batch.yaml")
    assert tasks_of(batch)["batch_predict"] == ["promote"]


def test_compute_decides_the_training_cluster(tmp_path):
    local = payload(tmp_path / "a", ROOT / "specs" / "diabetes.yaml", "--target", "prod")
    (main,) = local["job_clusters"]  # CPU training shares the single-node CPU cluster
    assert main["new_cluster"]["num_workers"] == 0
    assert main["new_cluster"]["spark_conf"]["spark.databricks.cluster.profile"] == "singleNode"
    assert main["new_cluster"]["custom_tags"] == {"ResourceClass": "SingleNode"}
    assert main["new_cluster"]["spark_version"] == "15.4.x-cpu-ml-scala2.12"
    ddp = payload(tmp_path / "b", ROOT / "specs" / "diabetes_distributed.yaml", "--target", "prod")
    training = next(c["new_cluster"] for c in ddp["job_clusters"]
                    if c["job_cluster_key"] == "training")
    assert training["spark_version"] == "15.4.x-gpu-ml-scala2.12"
    assert training["num_workers"] == 8
    assert training["spark_conf"]["spark.task.resource.gpu.amount"] == "1"
    train_task = next(t for t in ddp["tasks"] if t["task_key"] == "train")
    assert train_task["job_cluster_key"] == "training"


JOBS_SECTION = """\
jobs:
  schedule: {quartz_cron: "0 0 3 * * ?", timezone: Europe/Paris, paused: true}
  notifications: {on_failure: [ml-oncall@example.com], no_alert_for_skipped_runs: true}
  tags: {team: ml}
  permissions:
    - {level: CAN_MANAGE_RUN, group: data-scientists}
    - {level: CAN_VIEW, user: someone@example.com}
  timeout_seconds: 7200
  task_defaults: {max_retries: 1, min_retry_interval_ms: 60000}
  tasks:
    train: {timeout_seconds: 3600, max_retries: 0, retry_on_timeout: false}
  training_cluster: {node_type_id: g5.2xlarge, spark_conf: {spark.sql.shuffle.partitions: "8"}}
targets:
  prod:
    mode: production
    jobs: {training_cluster: {node_type_id: p3.2xlarge}}
"""


def test_scheduler_settings_reach_the_payload(tmp_path, write_spec):
    spec = write_spec((ROOT / "specs" / "diabetes_distributed.yaml").read_text()
                      .split("\ntargets:")[0] + "\n" + JOBS_SECTION)
    body = payload(tmp_path, spec, "--target", "prod")
    assert body["schedule"] == {"quartz_cron_expression": "0 0 3 * * ?",
                                "timezone_id": "Europe/Paris", "pause_status": "PAUSED"}
    assert body["email_notifications"] == {"on_failure": ["ml-oncall@example.com"],
                                           "no_alert_for_skipped_runs": True}
    assert body["tags"]["team"] == "ml" and body["timeout_seconds"] == 7200
    assert body["access_control_list"] == [
        {"group_name": "data-scientists", "permission_level": "CAN_MANAGE_RUN"},
        {"user_name": "someone@example.com", "permission_level": "CAN_VIEW"}]
    tasks = {t["task_key"]: t for t in body["tasks"]}
    assert (tasks["data"]["max_retries"], tasks["data"]["min_retry_interval_millis"]) == (1, 60000)
    assert (tasks["train"]["timeout_seconds"], tasks["train"]["max_retries"],
            tasks["train"]["retry_on_timeout"]) == (3600, 0, False)
    training = next(c["new_cluster"] for c in body["job_clusters"]
                    if c["job_cluster_key"] == "training")
    assert training["node_type_id"] == "p3.2xlarge"  # the target's override
    assert training["spark_conf"]["spark.sql.shuffle.partitions"] == "8"


def test_bundle_permissions_use_the_bundle_shape(tmp_path, write_spec, bundle_validator):
    from tests.conftest import MINIMAL

    spec = write_spec(MINIMAL + "registry: {name: minimal_model}\n" + JOBS_SECTION)
    generate(spec, tmp_path, "--target", "prod")
    data = yaml.safe_load((tmp_path / "resources" / "minimal.prod.yml").read_text())
    assert list(bundle_validator.iter_errors(data)) == []
    assert data["targets"]["prod"]["resources"]["models"] == {
        "minimal": {"name": "minimal_model", "description": "Trained by dbspec spec minimal"}}
    job = data["targets"]["prod"]["resources"]["jobs"]["minimal"]
    assert job["permissions"][0] == {"level": "CAN_MANAGE_RUN", "group_name": "data-scientists"}


def test_output_is_deterministic_and_check_finds_stale_files(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text((ROOT / "specs" / "diabetes.yaml").read_text())
    out = tmp_path / "jobs"
    generate(spec, out)
    first = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    again = run_cli("jobs", str(spec), "-o", str(out))
    assert "already up to date" in again.stdout
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == first
    assert run_cli("jobs", str(spec), "-o", str(out), "--check").returncode == 0
    spec.write_text(spec.read_text().replace("epochs: 300", "epochs: 200"))
    stale = run_cli("jobs", str(spec), "-o", str(out), "--check")
    assert stale.returncode == 1
    assert "specs/s.yaml: out of date" in stale.stdout  # the bundled copy of the spec
    (out / "resources" / "old_job.dev.yml").write_text("targets: {}\n")
    leftover = run_cli("jobs", str(spec), "-o", str(out), "--check")
    assert "resources/old_job.dev.yml: no longer generated" in leftover.stdout
    generate(spec, out)
    assert not (out / "resources" / "old_job.dev.yml").exists()
    assert run_cli("jobs", str(spec), "-o", str(out), "--check").returncode == 0


def test_check_finds_a_moved_shared_dir(tmp_path):
    spec = ROOT / "specs" / "diabetes.yaml"
    generate(spec, tmp_path / "bundle")
    generate(spec, tmp_path / "json", "--format", "jobs-json")
    moved = ["--set", "jobs.shared_dir=/Volumes/main/ml/elsewhere"]
    stale = run_cli("jobs", str(spec), "-o", str(tmp_path / "bundle"), *moved, "--check")
    assert stale.returncode == 1
    assert f"{tmp_path / 'bundle' / 'databricks.yml'}: out of date" in stale.stdout.splitlines()
    stale = run_cli("jobs", str(spec), "-o", str(tmp_path / "json"), "--format", "jobs-json",
                    *moved, "--check")
    assert stale.returncode == 1
    assert "diabetes_regressor.prod.json: out of date" in stale.stdout


def test_a_spec_without_targets_gets_a_default_target(tmp_path):
    generate(ROOT / "specs" / "digits_cnn.yaml", tmp_path)
    root = yaml.safe_load((tmp_path / "databricks.yml").read_text())
    assert root["targets"] == {"default": {"mode": "development", "default": True}}
    params = yaml.safe_load((tmp_path / "resources" / "digits_cnn.default.yml").read_text())
    job = params["targets"]["default"]["resources"]["jobs"]["digits_cnn"]
    assert "--target" not in job["tasks"][0]["python_wheel_task"]["parameters"]


def test_a_workspace_experiment_path_is_asked_for(tmp_path):
    result = run_cli("jobs", "specs/diabetes.yaml", "-o", str(tmp_path))
    assert "warning: dev: tracking.experiment is 'diabetes-dev'" in result.stderr


@pytest.mark.parametrize("args, code, message", [
    (["specs/diabetes.yaml", "--target", "staging"], 2, "no target 'staging' (targets: dev, prod)"),
    (["specs/diabetes.yaml", "-o", "README.md"], 2, "exists and is not a directory"),
    (["specs/missing.yaml"], 2, "missing.yaml"),
    (["tests/assets/invalid/unknown_keys.yaml"], 1, "unknown_keys.yaml:"),
])
def test_jobs_errors_are_clear(args, code, message, tmp_path):
    if "-o" not in args:
        args = [*args, "-o", str(tmp_path)]
    result = run_cli("jobs", *args)
    assert result.returncode == code, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("section, message", [
    ("jobs: {permissions: [{level: CAN_VIEW, user: a@b.c, group: g}]}",
     "jobs.permissions.0: give exactly one of user, group, service_principal (got user, group)"),
    ("jobs: {notifications: {on_failure: [not-an-address]}}",
     "on_failure: 'not-an-address' is not an e-mail address"),
    ("jobs: {schedule: {quartz_cron: daily}}", "jobs.schedule.quartz_cron"),
    ("jobs: {tasks: {trian: {max_retries: 1}}}", "jobs.tasks"),
    ("jobs: {shared_dir: build/shared}",
     ":8:20: jobs.shared_dir: 'build/shared' is relative, so each task would resolve it"),
    ("jobs: {shared_dir: /local_disk0/dbspec}",
     ":8:20: jobs.shared_dir: '/local_disk0/dbspec' is on a node's local disk (/local_disk0)"),
    ("jobs: {shared_dir: /local_disk0}", ":8:20: jobs.shared_dir: '/local_disk0' is on a node's"),
    ("jobs: {shared_dir: 'file:/local_disk0/x'}", "jobs.shared_dir: 'file:/local_disk0/x' is on"),
    ("jobs: {shared_dir: /tmp/../local_disk0/x}", "jobs.shared_dir: '/tmp/../local_disk0/x' is on"),
    ("jobs: {shared_dir: 'ftp://host/dir'}", "jobs.shared_dir: 'ftp://host/dir': unknown storage"),
    ("jobs: {shared_dir: /Volumes/main/default}",
     "jobs.shared_dir: '/Volumes/main/default' stops before the volume"),
    ("jobs: {state_dir: /local_disk0/dbspec}",
     ":8:19: jobs.state_dir: '/local_disk0/dbspec' is on a node's local disk (/local_disk0); a "
     "later task"),
    ("jobs: {state_dir: 'dbfs:/dbspec'}",
     "jobs.state_dir: 'dbfs:/dbspec': the state dir is opened as a local directory"),
    ("jobs: {state_dir: .dbspec}", "jobs.state_dir: '.dbspec' is relative"),
    ("targets: {prod: {jobs: {shared_dir: /local_disk0/x}}}",
     ":8:37: jobs.shared_dir: '/local_disk0/x' is on a node's local disk (/local_disk0); training "
     "ranks and tasks on other nodes cannot read it: give a directory every node reaches, such as "
     "a Unity Catalog Volume (/Volumes/<catalog>/<schema>/<volume>) [target prod]"),
])
def test_bad_jobs_sections_are_located_errors(write_spec, section, message):
    from tests.conftest import MINIMAL

    result = run_cli("validate", write_spec(MINIMAL + section + "\n"))
    assert result.returncode == 1
    assert message in result.stdout


@pytest.mark.parametrize("value", ["/Volumes/main/ml/dbspec", "/Volumes/main/ml/dbspec/runs",
                                   "dbfs:/dbspec", "/dbfs/dbspec",
                                   "/mnt/shared/dbspec", "/local_disk0_other"])
def test_shared_storage_is_accepted(value):
    from dbspec.spec.models.jobs import JobsSpec

    assert JobsSpec(shared_dir=value).shared_dir == value


def test_a_jobs_command_refuses_a_node_local_shared_dir(tmp_path):
    result = run_cli("jobs", "specs/diabetes.yaml", "-o", str(tmp_path),
                     "--set", "jobs.shared_dir=/local_disk0/dbspec")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "jobs.shared_dir: '/local_disk0/dbspec' is on a node's local disk" in result.stderr
    assert not (tmp_path / "databricks.yml").exists()
