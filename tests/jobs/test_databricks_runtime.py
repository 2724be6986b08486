"""Generated jobs follow Databricks' runtime facts: the runtime table against pyproject.toml,
task libraries, access modes, clouds, Ray and AI Runtime (serverless GPU) compute, and the
``-o`` directory's foreign files. The rules' located errors are in tests/assets/invalid/jobs_*.

No Databricks workspace can run here: the output is checked against the official bundle schema
and databricks-sdk's classes, as in test_jobs.py."""

from __future__ import annotations

import json
import re
import tomllib

import pytest
import yaml

from tests.conftest import MINIMAL, ROOT, SPECS
from tests.jobs.helpers import jobs_cli
from tests.jobs.test_jobs import bundle_validator, generate  # noqa: F401 (a fixture)

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _lower_bound(requirement: str) -> tuple[int, ...]:
    found = re.search(r">=\s*([\d.]+)", requirement)
    assert found, requirement
    return tuple(int(p) for p in found.group(1).split("."))


def _requirement(name: str) -> str:
    for extra in PYPROJECT["project"]["optional-dependencies"].values():
        for requirement in extra:
            if re.match(rf"{name}\b", requirement):
                return requirement
    raise AssertionError(f"no {name} requirement in pyproject.toml")


def test_the_default_runtime_meets_the_package_s_own_requirements():
    from dbspec.spec.databricks import DEFAULT_RUNTIME, MLFLOW_REQUIRED, PYTHON_REQUIRED, RUNTIMES

    mlflow_floor = _lower_bound(_requirement("mlflow"))
    python_floor = _lower_bound(PYPROJECT["project"]["requires-python"])
    assert MLFLOW_REQUIRED == mlflow_floor[:2] and PYTHON_REQUIRED == python_floor[:2]
    shipped = tuple(int(p) for p in DEFAULT_RUNTIME.mlflow.split("."))
    assert shipped[:len(mlflow_floor)] >= mlflow_floor, DEFAULT_RUNTIME
    assert tuple(int(p) for p in DEFAULT_RUNTIME.python.split(".")) >= python_floor
    # the default is the newest LTS line whose MLflow is new enough
    fit = [r for r in RUNTIMES if "LTS" in r.label
           and tuple(int(p) for p in r.mlflow.split("."))[:2] >= mlflow_floor[:2]]
    assert fit[0] == DEFAULT_RUNTIME


def _job(out, target="prod", key=None):
    path = next((out / "resources").glob(f"*.{target}.yml"))
    (resources,) = yaml.safe_load(path.read_text())["targets"].values()
    jobs = resources["resources"]["jobs"]
    return jobs[key] if key else next(iter(jobs.values())), resources["resources"]


def _clusters(job) -> dict:
    return {c["job_cluster_key"]: c["new_cluster"] for c in job.get("job_clusters", [])}


def test_clusters_get_the_default_ml_runtime_and_dedicated_access_for_unity_catalog(tmp_path):
    from dbspec.spec.databricks import default_spark_version

    generate(ROOT / "specs" / "diabetes.yaml", tmp_path)
    prod, _ = _job(tmp_path, "prod")  # registry main.ml_models.diabetes_predictor
    for cluster in _clusters(prod).values():
        assert cluster["spark_version"] == default_spark_version(False)
        assert cluster["data_security_mode"] == "DATA_SECURITY_MODE_DEDICATED"
        assert cluster["single_user_name"] == "${workspace.current_user.userName}"
    dev, _ = _job(tmp_path, "dev")  # a workspace registry name: explicit, Databricks' choice
    for cluster in _clusters(dev).values():
        assert cluster["data_security_mode"] == "DATA_SECURITY_MODE_AUTO"
        assert "single_user_name" not in cluster


def _normal(requirement: str) -> tuple[str, frozenset[str]]:
    """(name, specifiers) of a requirement, whatever order the specifiers come in."""
    text = re.sub(r"\s|#.*", "", requirement)
    name = re.split(r"[<>=!~]", text, maxsplit=1)[0]
    return name.lower(), frozenset(text[len(name):].split(","))


def test_every_task_installs_what_its_stages_import(tmp_path):
    from dbspec.jobs.tasks import extra_requirements

    train = [r for r in PYPROJECT["project"]["optional-dependencies"]["train"]
             if not r.startswith("torch")]
    assert {_normal(r) for r in extra_requirements("train")} == {_normal(r) for r in train}
    for spec in SPECS:
        out = tmp_path / spec.stem
        generate(spec, out)
        for path in sorted((out / "resources").glob("*.yml")):
            (resources,) = yaml.safe_load(path.read_text())["targets"].values()
            for job in resources["resources"]["jobs"].values():
                for task in job["tasks"]:
                    if "python_wheel_task" not in task:
                        continue
                    pins = [lib["pypi"]["package"] for lib in task["libraries"] if "pypi" in lib]
                    names = {re.split(r"[<>=!~]", p)[0] for p in pins}
                    assert task["libraries"][0]["whl"].endswith(".whl")
                    assert "mlflow" in names, (spec.name, task["task_key"])
                    assert not names & {"torch", "pyspark"}, "the ML runtime ships these"
                    stages = task["python_wheel_task"]["parameters"]
                    if task["task_key"] == "serve":
                        assert "uvicorn" in names
                    if task["task_key"] == "train" and "deepspeed" in spec.name:
                        assert "deepspeed" in names, stages


def test_cluster_fields_and_clouds_reach_the_bundle(tmp_path, write_spec, bundle_validator):
    from jsonschema.exceptions import best_match

    spec = write_spec(MINIMAL + """
registry: {name: main.ml.minimal}
jobs:
  cluster: {runtime_engine: PHOTON, single_user_name: ml-engineers,
            data_security_mode: DATA_SECURITY_MODE_DEDICATED, graviton: true}
  training_cluster: {use_ml_runtime: true, kind: CLASSIC_PREVIEW}
targets:
  prod: {}
""")
    generate(spec, tmp_path)
    for path in sorted((tmp_path / "resources").glob("*.yml")):
        error = best_match(bundle_validator.iter_errors(yaml.safe_load(path.read_text())))
        assert error is None, f"{path.name}: {list(error.absolute_path)}: {error.message[:300]}"
    main = _clusters(_job(tmp_path, "prod")[0])["main"]
    assert (main["runtime_engine"], main["single_user_name"], main["node_type_id"]) == \
        ("PHOTON", "ml-engineers", "m7gd.xlarge")
    training = _clusters(_job(tmp_path, "prod")[0])["training"]
    assert training["use_ml_runtime"] is True and training["kind"] == "CLASSIC_PREVIEW"
    assert training["spark_version"] == "17.3.x-scala2.13"
    nodes = {}
    for cloud in ("azure", "gcp"):
        plain = tmp_path / cloud
        spec2 = write_spec(MINIMAL + f"jobs: {{cloud: {cloud}}}\ncompute: {{kind: single_gpu}}\n",
                           name=f"{cloud}.yaml")
        generate(spec2, plain)
        clusters = _clusters(_job(plain, "default")[0])
        nodes[cloud] = (clusters["main"]["node_type_id"], clusters["training"]["node_type_id"])
    assert nodes == {"azure": ("Standard_DS3_v2", "Standard_NC4as_T4_v3"),
                     "gcp": ("n2-standard-4", "g2-standard-4")}


def test_graviton_on_another_cloud_is_refused(write_spec):
    result = jobs_cli(write_spec(MINIMAL + "jobs: {cloud: gcp, cluster: {graviton: true}}\n"),
                      "-o", "unused")
    assert result.returncode == 1
    assert "jobs.cluster.graviton: Graviton is an AWS instance family; jobs.cloud is gcp" \
        in result.stderr


def test_a_ray_training_cluster_gets_one_spark_worker_per_ray_worker(tmp_path, write_spec):
    spec = write_spec(MINIMAL + "compute: {kind: ray, num_workers: 3, use_gpu: true}\n")
    generate(spec, tmp_path)
    job, _ = _job(tmp_path, "default")
    training = _clusters(job)["training"]
    assert training["num_workers"] == 3
    assert training["spark_version"].startswith("17.3.x-gpu-ml")
    assert training["node_type_id"] == "g5.xlarge"
    train = next(t for t in job["tasks"] if t["task_key"] == "train")
    names = {_normal(lib["pypi"]["package"])[0].split("[")[0]
             for lib in train["libraries"] if "pypi" in lib}
    assert "ray" in names


SERVERLESS = MINIMAL + """
tracking: {experiment: /Shared/minimal}
compute: {kind: serverless_gpu, accelerator: GPU_1xH100}
jobs: {shared_dir: /Volumes/main/ml/dbspec}
targets:
  prod: {mode: production}
"""


def test_serverless_gpu_becomes_one_ai_runtime_task(tmp_path, write_spec, bundle_validator):
    from databricks.sdk.service.jobs import JobSettings
    from jsonschema.exceptions import best_match

    spec = write_spec(SERVERLESS)
    generate(spec, tmp_path)
    path = next((tmp_path / "resources").glob("*.prod.yml"))
    data = yaml.safe_load(path.read_text())
    error = best_match(bundle_validator.iter_errors(data))
    assert error is None, f"{list(error.absolute_path)}: {error.message[:300]}"
    job, _ = _job(tmp_path, "prod")
    assert "job_clusters" not in job
    (task,) = [t for t in job["tasks"] if t["task_key"] == "pipeline"]
    ai = task["ai_runtime_task"]
    # AI Runtime takes an experiment name (databricks-air: [A-Za-z0-9_-]) and its folder apart
    assert (ai["experiment"], ai["mlflow_experiment_directory"]) == ("minimal", "/Workspace/Shared")
    assert task["environment_key"] == "default"
    assert job["environments"] == [{"environment_key": "default",
                                    "spec": {"environment_version": "4"}}]
    (deployment,) = ai["deployments"]
    assert deployment["compute"] == {"accelerator_type": "GPU_1xH100", "accelerator_count": 1}
    assert deployment["command_path"] == "${workspace.file_path}/scripts/minimal.prod.sh"
    settings = JobSettings.from_dict(job)
    assert settings.tasks[0].ai_runtime_task.deployments[0].compute.accelerator_count == 1
    script = (tmp_path / "scripts" / "minimal.prod.sh").read_text()
    assert script.startswith("#!/usr/bin/env bash\n# Generated by dbspec ")
    # dbspec itself without its dependencies, then what the stages need; the environment's
    # own PyTorch (GPU environment 4) is never replaced by a PyPI build
    assert 'pip install --quiet --no-deps "$here/../dist/dbspec-' in script
    assert "'mlflow<4,>=3.0'" in script and "torch" not in script
    # the platform sets no MLflow URIs: the run would track to a file on the node
    assert "export MLFLOW_TRACKING_URI=databricks\nexport MLFLOW_REGISTRY_URI=databricks\n" \
        in script
    assert 'dbspec run "$here/../specs/"spec.yaml --target prod --shared-dir ' \
        '/Volumes/main/ml/dbspec ${key[@]+"${key[@]}"} --quiet' in script
    assert (tmp_path / "scripts" / "minimal.prod.sh").stat().st_mode & 0o111


@pytest.mark.parametrize("environment, spec", [
    ("5", {"environment_version": "5"}),
    ("databricks_ai_v5", {"base_environment": "workspace-base-environments/databricks_ai_v5"}),
])
def test_the_ai_runtime_environment_is_the_spec_s(tmp_path, write_spec, environment, spec):
    from databricks.sdk.service.jobs import JobSettings

    text = SERVERLESS.replace("accelerator: GPU_1xH100}",
                              f"accelerator: GPU_1xH100, environment: '{environment}'}}")
    generate(write_spec(text), tmp_path)
    job, _ = _job(tmp_path, "prod")
    assert job["environments"] == [{"environment_key": "default", "spec": spec}]
    assert JobSettings.from_dict(job).environments[0].spec.as_dict() == spec
    script = (tmp_path / "scripts" / "minimal.prod.sh").read_text()
    # environment 5's base lacks PyTorch; the Databricks AI environment ships it
    assert ("'torch<2.15,>=2.4'" in script) == (environment == "5"), script


@pytest.mark.parametrize("environment", ["databricks_ai_v4", "gpu", "5.1"])
def test_an_unknown_ai_runtime_environment_is_a_located_error(write_spec, environment):
    from dbspec.spec.loader import validate_file

    text = SERVERLESS.replace("accelerator: GPU_1xH100}",
                              f"accelerator: GPU_1xH100, environment: '{environment}'}}")
    (error,) = [d for d in validate_file(str(write_spec(text))) if d.severity == "error"]
    line = next(n for n, row in enumerate(text.splitlines(), 1) if row.startswith("compute:"))
    assert (error.path, error.line) == ("compute.environment", line), error
    assert f"'{environment}' is no AI Runtime environment: a version number such as" \
        in error.message


@pytest.mark.parametrize("experiment, warned", [
    ("/Shared/minimal", False), ("/Workspace/Users/a@b.c/run_1-x", False),
    ("/Shared/my.experiment", True), ("/Shared/has space", True),
])
def test_an_experiment_name_ai_runtime_refuses_is_a_located_warning(write_spec, experiment,
                                                                     warned):
    from dbspec.spec.loader import validate_file

    text = SERVERLESS.replace("experiment: /Shared/minimal", f"experiment: '{experiment}'")
    found = [d for d in validate_file(str(write_spec(text)))
             if d.path == "tracking.experiment" and "AI Runtime" in d.message]
    assert [d.severity for d in found] == (["warning"] if warned else [])


def test_the_experiment_location_splits_name_and_workspace_folder():
    from dbspec.spec.databricks import experiment_location

    assert experiment_location("/Shared/a/b") == ("b", "/Workspace/Shared/a")
    assert experiment_location("/Workspace/Users/u/x") == ("x", "/Workspace/Users/u")
    assert experiment_location("bare") == ("bare", None)


def test_serverless_gpu_in_jobs_json_writes_its_script_too(tmp_path, write_spec):
    spec = write_spec(SERVERLESS)
    generate(spec, tmp_path, "--format", "jobs-json")
    body = json.loads((tmp_path / "minimal.prod.json").read_text())
    (task,) = body["tasks"]
    assert task["ai_runtime_task"]["deployments"][0]["command_path"] == \
        "/Workspace/Shared/dbspec/scripts/minimal.prod.sh"
    assert (tmp_path / "scripts" / "minimal.prod.sh").exists()


def test_serverless_gpu_trains_here_as_local_compute():
    from dbspec.spec.loader import load_spec
    from dbspec.training.fit import select_device

    import torch

    spec = load_spec(str(SPECS[0]), assignments=["compute.kind=serverless_gpu"]).spec
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert select_device(spec.compute).type == expected


def test_the_ai_runtime_accelerators_are_the_sdk_s():
    from databricks.sdk.service.jobs import ComputeSpecAcceleratorType

    from dbspec.compute.serverless_gpu import AI_RUNTIME_ACCELERATORS, ServerlessGpuCompute

    assert set(AI_RUNTIME_ACCELERATORS) == {e.value for e in ComputeSpecAcceleratorType}
    field = ServerlessGpuCompute.model_fields["accelerator"].annotation
    assert set(field.__args__) == set(AI_RUNTIME_ACCELERATORS)


def test_jobs_json_asks_for_the_dedicated_principal(tmp_path):
    result = jobs_cli(str(ROOT / "specs" / "diabetes.yaml"), "-o", str(tmp_path),
                      "--format", "jobs-json")
    assert result.returncode == 0, result.stderr
    assert "prod: jobs.cluster.single_user_name is unset" in result.stderr
    body = json.loads((tmp_path / "diabetes_regressor.prod.json").read_text())
    cluster = body["job_clusters"][0]["new_cluster"]
    assert cluster["data_security_mode"] == "DATA_SECURITY_MODE_DEDICATED"
    assert "single_user_name" not in cluster


def test_jobs_o_never_overwrites_a_file_it_did_not_write(tmp_path):
    spec = str(ROOT / "specs" / "diabetes.yaml")
    (tmp_path / "databricks.yml").write_text("bundle: {name: mine}\n")
    result = jobs_cli(spec, "-o", str(tmp_path))
    assert result.returncode == 2
    assert "databricks.yml would be overwritten but was not written by dbspec" in result.stderr
    assert (tmp_path / "databricks.yml").read_text() == "bundle: {name: mine}\n"
    assert not (tmp_path / "resources").exists()  # nothing written at all
    check = jobs_cli(spec, "-o", str(tmp_path), "--check")
    assert check.returncode == 1
    assert f"{tmp_path / 'databricks.yml'}: not written by dbspec" in check.stdout


@pytest.mark.parametrize("alias", ["latest", "LATEST", "v3"])
def test_promote_refuses_a_reserved_alias(alias, tmp_path):
    from dbspec.cli import main

    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(["promote", "some_model", "1", "--alias", alias,
                     "--state-dir", str(tmp_path)])
    assert code != 0
    assert f"'{alias}' is reserved by the MLflow registry" in err.getvalue()


def test_bundle_tasks_use_the_bundle_s_own_model_name(tmp_path):
    """Development mode prefixes resource names per user; every task (the endpoint task too)
    names the resource, so a dev deployment trains and serves its own copy. After the bundle substitutes
    the reference, the assignment is a valid spec value."""
    from dbspec.spec.loader import load_spec

    generate(ROOT / "specs" / "diabetes.yaml", tmp_path)
    job, resources = _job(tmp_path, "prod")
    reference = "main.ml_models.${resources.registered_models.diabetes_regressor.name}"
    for task in job["tasks"]:
        parameters = task["python_wheel_task"]["parameters"]
        if parameters[0] == "link-job":  # a registry command: the model is its NAME
            assert parameters[1] == reference
            continue
        assert f"--set=registry.name={reference}" in parameters
    assert "model_serving_endpoints" not in resources  # the job creates and moves it
    assert resources["registered_models"]["diabetes_regressor"]["name"] == "diabetes_predictor"
    substituted = reference.replace("${resources.registered_models.diabetes_regressor.name}",
                                    "dev_jdoe_diabetes_predictor")
    spec = load_spec(str(ROOT / "specs" / "diabetes.yaml"), target="prod",
                     assignments=[f"registry.name={substituted}"]).spec
    assert spec.registry.name == "main.ml_models.dev_jdoe_diabetes_predictor"
