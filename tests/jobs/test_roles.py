"""``roles`` on Databricks: Unity Catalog grants on the registered model and permission levels on
the job, the experiment and the serving endpoint; the ``update_endpoint`` task, which owns the
endpoint (no bundle resource: ``dbspec endpoint`` creates it with the GPU workload, the AI Gateway
inference table and the roles' permissions computed here, see tests/serving/
test_databricks_endpoint.py). Bundles are checked against the official bundle schema and
round-tripped through databricks-sdk's classes."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.conftest import MINIMAL, run_main
from tests.jobs.test_jobs import bundle_validator  # noqa: F401  (a fixture)

SP = "6f1c3c1e-2b0d-4f55-9a7e-0c1d2e3f4a5b"
ROLES = f"""\
name: rbac
data: {{source: {{kind: sklearn, name: diabetes}}, task: regression}}
model: {{layers: [{{linear: {{out: 1}}}}]}}
compute: {{kind: single_gpu}}
tracking: {{experiment: /Shared/rbac}}
registry:
  name: main.ml_models.rbac
  promotion: {{alias: champion}}
serving:
  mode: realtime
  realtime: {{inference_table: {{}}}}
roles:
  admin: [ml-admins]
  data_scientist: [group:data-scientists, carol@example.com]
  analyst: [user:dave@example.com, service_principal:{SP}]
targets:
  dev:
    default: true
    registry: {{name: rbac_model}}
    compute: {{kind: local}}
  prod:
    mode: production
"""
#: What each role gets, by resource (the table in dbspec/jobs/resources.py).
EXPECTED = {
    "admin": {"job": "CAN_MANAGE", "experiment": "CAN_MANAGE", "endpoint": "CAN_MANAGE",
              "model": "CAN_MANAGE", "grants": ["ALL_PRIVILEGES", "MANAGE"]},
    "data_scientist": {"job": "CAN_MANAGE_RUN", "experiment": "CAN_EDIT",
                       "endpoint": "CAN_QUERY", "model": "CAN_EDIT",
                       "grants": ["APPLY_TAG", "EXECUTE"]},
    "analyst": {"job": "CAN_VIEW", "experiment": "CAN_READ", "endpoint": "CAN_VIEW",
                "model": "CAN_READ", "grants": ["EXECUTE"]},
}
MEMBERS = [("admin", "group_name", "ml-admins"),
           ("data_scientist", "group_name", "data-scientists"),
           ("data_scientist", "user_name", "carol@example.com"),
           ("analyst", "user_name", "dave@example.com"),
           ("analyst", "service_principal_name", SP)]


def generate(tmp_path, text: str, fmt: str = "bundle", name: str = "spec.yaml"):
    """(relative path -> content, warnings) of ``dbspec jobs`` for the spec ``text``."""
    from dbspec.jobs import generate as generate_files

    path = tmp_path / name
    path.write_text(text)
    return generate_files(str(path), fmt=fmt)


def resources(files, target: str) -> dict:
    (name,) = [p for p in files if p.startswith("resources/") and p.endswith(f".{target}.yml")]
    return yaml.safe_load(files[name])["targets"][target]["resources"]


def endpoint_task(files, target: str) -> dict:
    """The ``update_endpoint`` task of ``target``: in the deployment job where a Unity Catalog
    model has one (prod; the main job's promote stage leaves new versions to it), else in the
    main job (dev registers a workspace model)."""
    jobs = resources(files, target)["jobs"]
    (found,) = [t for key in ("rbac_deployment", "rbac") if key in jobs
                for t in jobs[key]["tasks"] if t["task_key"] == "update_endpoint"]
    return found


def principal(entry: dict) -> tuple[str, str]:
    (field,) = [k for k in entry if k in ("user_name", "group_name", "service_principal_name")]
    return field, entry[field]


def spec_of(tmp_path, text: str, target=None, name: str = "loaded.yaml"):
    from dbspec.spec.loader import load_spec

    path = tmp_path / name
    path.write_text(text)
    return load_spec(str(path), target=target).spec


def endpoint_levels(spec) -> list[dict]:
    """The endpoint's permissions ``dbspec endpoint`` sets, as bundle-style entries."""
    from dbspec.jobs.resources import endpoint_permissions

    out = []
    for entry in endpoint_permissions(spec):
        row = entry.as_dict()
        out.append({"level": row.pop("permission_level"), **row})
    return out


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    files, warnings = generate(tmp_path_factory.mktemp("roles"), ROLES)
    return files, warnings


def test_a_bundle_with_roles_validates_and_round_trips_through_the_sdk(bundle, tmp_path,
                                                                       bundle_validator):
    from databricks.sdk.service.catalog import PrivilegeAssignment
    from databricks.sdk.service.jobs import JobAccessControlRequest, JobSettings
    from databricks.sdk.service.ml import (
        ExperimentAccessControlRequest,
        RegisteredModelAccessControlRequest,
    )
    from databricks.sdk.service.serving import (
        AiGatewayConfig,
        EndpointCoreConfigInput,
        ServingEndpointAccessControlRequest,
    )
    from jsonschema.exceptions import best_match

    from dbspec.jobs.resources import endpoint_config

    files, _ = bundle
    for path, text in files.items():
        if path.endswith(".yml"):
            error = best_match(bundle_validator.iter_errors(yaml.safe_load(text)))
            assert error is None, f"{path}: {list(error.absolute_path)}: {error.message[:300]}"

    def round_trip(cls, permissions):
        rows = [{"permission_level": p["level"], **{k: v for k, v in p.items() if k != "level"}}
                for p in permissions]
        assert [cls.from_dict(r).as_dict() for r in rows] == rows

    prod = resources(files, "prod")
    job = dict(prod["jobs"]["rbac"])
    round_trip(JobAccessControlRequest, job.pop("permissions"))
    assert JobSettings.from_dict(job).as_dict() == job
    round_trip(ExperimentAccessControlRequest, prod["experiments"]["rbac"]["permissions"])
    assert "model_serving_endpoints" not in prod  # the job's update_endpoint task owns it
    spec = spec_of(tmp_path, ROLES, "prod")
    round_trip(ServingEndpointAccessControlRequest, endpoint_levels(spec))
    core, gateway = endpoint_config(spec, "rbac-prod", "3")
    assert EndpointCoreConfigInput.from_dict(core.as_dict()).as_dict() == core.as_dict()
    assert AiGatewayConfig.from_dict(gateway.as_dict()).as_dict() == gateway.as_dict()
    grants = prod["registered_models"]["rbac"]["grants"]
    assert [PrivilegeAssignment.from_dict(g).as_dict() for g in grants] == grants
    legacy = resources(files, "dev")["models"]["rbac"]  # the dev target's workspace registry
    round_trip(RegisteredModelAccessControlRequest, legacy["permissions"])


@pytest.mark.parametrize("role, field, name", MEMBERS, ids=[f"{r}-{n}" for r, _, n in MEMBERS])
def test_each_role_gets_its_access_on_every_resource(bundle, tmp_path, role, field, name):
    files, _ = bundle
    prod, dev = resources(files, "prod"), resources(files, "dev")

    def level(entries):
        (found,) = [e["level"] for e in entries if principal(e) == (field, name)]
        return found

    expected = EXPECTED[role]
    assert level(prod["jobs"]["rbac"]["permissions"]) == expected["job"]
    assert level(prod["experiments"]["rbac"]["permissions"]) == expected["experiment"]
    assert level(endpoint_levels(spec_of(tmp_path, ROLES, "prod"))) == expected["endpoint"]
    assert level(dev["models"]["rbac"]["permissions"]) == expected["model"]
    (grant,) = [g for g in prod["registered_models"]["rbac"]["grants"] if g["principal"] == name]
    assert grant["privileges"] == expected["grants"]
    assert "grants" not in dev["models"]["rbac"] and "permissions" not in \
        prod["registered_models"]["rbac"]  # UC takes grants, the workspace registry levels


def test_jobs_permissions_keep_their_level_and_come_first(tmp_path):
    section = "jobs: {permissions: [{level: CAN_VIEW, group: ml-admins}]}\n"
    files, _ = generate(tmp_path, ROLES.replace("targets:", section + "targets:"))
    permissions = resources(files, "prod")["jobs"]["rbac"]["permissions"]
    assert permissions[0] == {"level": "CAN_VIEW", "group_name": "ml-admins"}
    assert [principal(p) for p in permissions].count(("group_name", "ml-admins")) == 1
    assert len(permissions) == len(MEMBERS)


def test_without_roles_nothing_gains_permissions(tmp_path):
    text = ROLES.split("roles:")[0] + "targets:" + ROLES.split("targets:")[1]
    files, _ = generate(tmp_path, text)
    prod = resources(files, "prod")
    assert "experiments" not in prod and "permissions" not in prod["jobs"]["rbac"]
    assert "grants" not in prod["registered_models"]["rbac"]
    from dbspec.jobs.resources import endpoint_permissions

    # no roles: dbspec endpoint leaves the endpoint's permissions as they are
    assert endpoint_permissions(spec_of(tmp_path, text, "prod")) is None


def test_the_jobs_json_format_carries_the_job_acl_and_says_what_it_leaves_out(tmp_path):
    from databricks.sdk.service.jobs import JobAccessControlRequest, JobSettings

    from dbspec.jobs.resources import jobs_json_warnings
    from dbspec.spec.loader import load_spec

    files, _ = generate(tmp_path, ROLES, fmt="jobs-json")
    body = json.loads(files["rbac.prod.json"])
    acl = body.pop("access_control_list")
    assert JobSettings.from_dict(body).as_dict() == body
    assert [JobAccessControlRequest.from_dict(a).as_dict() for a in acl] == acl
    assert [(a["permission_level"], principal(a)) for a in acl] == \
        [(EXPECTED[role]["job"], (field, name)) for role, field, name in MEMBERS]
    spec = load_spec(str(tmp_path / "spec.yaml"), target="prod").spec
    assert jobs_json_warnings(spec) == [
        "roles: the jobs-json format sets access on the job only; registered model, experiment "
        "access is not set (use --format bundle, or grant it by hand)"]  # the endpoint task
    # sets the endpoint's in both formats
    no_roles = load_spec(str(tmp_path / "spec.yaml"), target="prod",
                         assignments=["roles=null"]).spec
    assert jobs_json_warnings(no_roles) == []


def test_the_endpoint_task_names_the_endpoint_and_the_bundle_declares_none(bundle, tmp_path):
    files, _ = bundle
    main = [t["task_key"] for t in resources(files, "prod")["jobs"]["rbac"]["tasks"]]
    assert "update_endpoint" not in main and "link_deployment_job" in main
    update = endpoint_task(files, "prod")
    assert [d["task_key"] for d in update["depends_on"]] == ["promote_champion"]
    assert update["job_cluster_key"] == "main"
    assert update["python_wheel_task"]["parameters"] == [
        "endpoint", "${workspace.file_path}/specs/spec.yaml", "--target", "prod",
        "--set=registry.name=main.ml_models.${resources.registered_models.rbac.name}",
        "--set=tracking.experiment=${resources.experiments.rbac.name}", "--endpoint",
        "rbac-prod", "--wait"]
    # development mode names the endpoint per user, as the bundle names its own resources
    dev = endpoint_task(files, "dev")
    assert [d["task_key"] for d in dev["depends_on"]] == ["promote", "serve"]  # the main job's
    assert dev["python_wheel_task"]["parameters"][-3:] == [
        "--endpoint", "dev_${workspace.current_user.short_name}_rbac-dev", "--wait"]
    for target in ("prod", "dev"):
        assert "model_serving_endpoints" not in resources(files, target)
    assert "served_model_version" not in files["databricks.yml"]
    assert list(yaml.safe_load(files["databricks.yml"])["variables"]) == ["shared_dir"]
    payload, _ = generate(tmp_path, ROLES, fmt="jobs-json")
    for job in ("rbac_deployment.prod", "rbac.dev"):  # Jobs API bodies: literal names
        target = job.rsplit(".", 1)[1]
        (literal,) = [t for t in json.loads(payload[f"{job}.json"])["tasks"]
                      if t["task_key"] == "update_endpoint"]
        assert literal["python_wheel_task"]["parameters"][-3:] == [
            "--endpoint", f"rbac-{target}", "--wait"]


def test_the_endpoint_task_installs_the_wheel_and_mlflow_only(bundle):
    from dbspec.jobs.tasks import extra_requirements

    files, _ = bundle
    tasks = {t["task_key"]: t for t in resources(files, "prod")["jobs"]["rbac"]["tasks"]}
    (mlflow,) = [pin for pin in extra_requirements("train") if pin.startswith("mlflow")]
    for target in ("prod", "dev"):
        assert [lib.get("whl", "").rsplit("/", 1)[0] or lib["pypi"]["package"]
                for lib in endpoint_task(files, target)["libraries"]] == ["../dist", mlflow]
    assert len(tasks["promote"]["libraries"]) > 2  # the stage tasks get their extras


def test_jobs_tasks_set_the_endpoint_task_s_timeout_and_retries(tmp_path, bundle_validator):
    section = ("jobs: {tasks: {update_endpoint: {timeout_seconds: 3600, max_retries: 2, "
               "min_retry_interval_ms: 60000}}}\n")
    files, _ = generate(tmp_path, ROLES.replace("targets:", section + "targets:"))
    tasks = {t["task_key"]: t for t in resources(files, "prod")["jobs"]["rbac"]["tasks"]}
    for target in ("prod", "dev"):  # in the deployment job, and in dev's main job
        update = endpoint_task(files, target)
        assert (update["timeout_seconds"], update["max_retries"],
                update["min_retry_interval_millis"]) == (3600, 2, 60000)
    assert "timeout_seconds" not in tasks["train"]
    for path, content in files.items():
        if path.endswith(".yml"):
            assert list(bundle_validator.iter_errors(yaml.safe_load(content))) == [], path


def test_an_unknown_task_in_jobs_tasks_is_a_located_error(write_spec):
    code, out, _ = run_main("validate", write_spec(
        MINIMAL + "jobs: {tasks: {update_endpoints: {max_retries: 1}}}\n"))
    assert code == 1 and "jobs.tasks" in out and "update_endpoint" in out, out


@pytest.mark.parametrize("serving, tasks", [
    ("serving: {mode: realtime}\nregistry: {name: main.ml.m}\n", ["serve"]),
    ("serving: {mode: batch, batch: {input: main.ml.x, output: main.ml.y}}\n"
     "registry: {name: main.ml.m}\n", None),
    ("registry: {name: main.ml.m}\n", None),
])
def test_only_a_served_registered_model_gets_the_task(tmp_path, serving, tasks):
    files, _ = generate(tmp_path, MINIMAL + serving)
    job = resources(files, "default")["jobs"]["minimal"]
    found = [t for t in job["tasks"] if t["task_key"] == "update_endpoint"]
    assert [[d["task_key"] for d in t["depends_on"]] for t in found] == \
        ([tasks] if tasks else [])


@pytest.mark.parametrize("compute, workload", [
    ("{kind: local}", "CPU"),
    ("{kind: single_gpu}", "GPU_SMALL"),
    ("{kind: serverless_gpu, accelerator: GPU_1xA10}", "GPU_SMALL"),
    ("{kind: torch_distributor, num_processes: 2, use_gpu: true}", "GPU_SMALL"),
    ("{kind: torch_distributor, num_processes: 2, use_gpu: false}", "CPU"),
    ("{kind: deepspeed, num_gpus: 2}", "GPU_SMALL"),
])
def test_the_endpoint_serves_on_gpus_when_training_does(tmp_path, compute, workload,
                                                        bundle_validator):
    from dbspec.jobs.resources import endpoint_config

    text = MINIMAL + f"compute: {compute}\nregistry: {{name: main.ml.m}}\n" \
        "serving: {mode: realtime}\n"
    files, _ = generate(tmp_path, text)
    core, _ = endpoint_config(spec_of(tmp_path, text), "minimal-default", "1")
    (entity,) = core.as_dict()["served_entities"]
    assert entity["workload_type"] == workload and entity["workload_size"] == "Small"
    assert entity["scale_to_zero_enabled"] is True and entity["entity_name"] == "main.ml.m"
    for path, content in files.items():
        if path.endswith(".yml"):
            assert list(bundle_validator.iter_errors(yaml.safe_load(content))) == [], path


def test_an_ai_runtime_job_updates_the_endpoint_on_a_cluster_of_its_own(tmp_path,
                                                                       bundle_validator):
    text = ROLES.replace("compute: {kind: single_gpu}", "compute: {kind: serverless_gpu}")
    files, _ = generate(tmp_path, text)
    tasks = {t["task_key"]: t for t in resources(files, "prod")["jobs"]["rbac"]["tasks"]}
    update = tasks["update_endpoint"]
    assert [d["task_key"] for d in update["depends_on"]] == ["pipeline"]
    assert "job_cluster_key" not in update and update["new_cluster"]["num_workers"] == 0
    for path, content in files.items():
        if path.endswith(".yml"):
            assert list(bundle_validator.iter_errors(yaml.safe_load(content))) == [], path


def test_the_inference_table_lives_beside_a_unity_catalog_model(tmp_path):
    from dbspec.jobs.resources import resource_warnings
    from dbspec.spec.loader import load_spec

    from dbspec.jobs.resources import endpoint_config

    path = tmp_path / "spec.yaml"
    path.write_text(ROLES)
    prod = load_spec(str(path), target="prod").spec
    _, gateway = endpoint_config(prod, "rbac-prod", "1")
    assert gateway.as_dict() == {"inference_table_config": {
        "catalog_name": "main", "schema_name": "ml_models", "table_name_prefix": "rbac_prod",
        "enabled": True}}
    # a development endpoint, named per user, logs to tables of its own
    _, gateway = endpoint_config(prod, "dev_jane_doe_rbac-dev", "1")
    assert gateway.inference_table_config.table_name_prefix == "dev_jane_doe_rbac_dev"
    dev = load_spec(str(path), target="dev").spec
    assert endpoint_config(dev, "rbac-dev", "1")[1] is None
    assert resource_warnings(dev) == [
        "serving.realtime.inference_table: the endpoint gets no inference table; AI Gateway "
        "inference tables live in Unity Catalog and registry.name 'rbac_model' is not "
        "catalog.schema.model"]
    assert resource_warnings(load_spec(str(path), target="prod").spec) == []


def test_roles_without_a_workspace_experiment_say_so(tmp_path):
    from dbspec.jobs.resources import resource_warnings
    from dbspec.spec.loader import load_spec

    path = tmp_path / "spec.yaml"
    path.write_text(ROLES.replace("tracking: {experiment: /Shared/rbac}\n", ""))
    spec = load_spec(str(path), target="prod").spec
    assert resource_warnings(spec) == ["roles: no experiment permissions, since "
                                       "tracking.experiment 'rbac' is not a workspace path"]
    files, _ = generate(tmp_path, path.read_text())
    assert "experiments" not in resources(files, "prod")


@pytest.mark.parametrize("roles, message", [
    ("{admin: [usr:a@example.com]}",
     ":8:17: roles.admin.0: unknown principal kind 'usr' in 'usr:a@example.com' (did you mean "
     "'user'?)"),
    ("{analyst: ['user:someone']}",
     ":8:19: roles.analyst.0: 'user:someone': a user is named by its e-mail address"),
    (f"{{analyst: [{SP}]}}",
     f":8:19: roles.analyst.0: '{SP}' looks like a service principal's application id; write "
     f"service_principal:{SP}"),
    ("{admin: [a@example.com], analyst: [user:a@example.com]}",
     ":8:42: roles.analyst: 'user:a@example.com' is already admin"),
    ("{data_scientists: [g]}",
     ":8:9: roles.data_scientists: unknown key 'data_scientists' (did you mean "
     "'data_scientist'?)"),
])
def test_bad_principals_are_located_errors(write_spec, roles, message):
    code, out, _ = run_main("validate", write_spec(MINIMAL + f"roles: {roles}\n"))
    assert code == 1
    assert message in out, out
    assert "Traceback" not in out


def test_principals_are_normalised_once(tmp_path):
    from dbspec.spec.sections.roles import Principal, RolesSpec

    roles = RolesSpec(admin=[" alice@example.com"], data_scientist=["ml team"],
                      analyst=[f"service_principal:{SP}", "group:x@y.z"])
    assert roles.admin == ["user:alice@example.com"]
    assert roles.members() == [("admin", Principal("user", "alice@example.com")),
                               ("data_scientist", Principal("group", "ml team")),
                               ("analyst", Principal("service_principal", SP)),
                               ("analyst", Principal("group", "x@y.z"))]
    assert RolesSpec.model_validate(roles.model_dump()) == roles
