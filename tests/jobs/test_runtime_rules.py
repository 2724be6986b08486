"""Issue 32's runtime rules, both ways: a GPU node gets the GPU ML runtime, custom images run a
standard runtime, clusters without training ranks autoscale, the cluster's Spark reads Unity
Catalog data and runs parallel trials, and a job never points at this machine's files. Their
located validate errors are in tests/assets/invalid/jobs_docker_image.yaml and
jobs_autoscale.yaml.

No Databricks workspace can run here: the clusters are checked as the bundle writes them and
round-tripped through databricks-sdk's ``ClusterSpec``."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from tests.conftest import MINIMAL
from tests.jobs.helpers import jobs_cli


def _job(out) -> dict:
    (path,) = (out / "resources").glob("*.yml")
    (target,) = yaml.safe_load(path.read_text())["targets"].values()
    (job,) = target["resources"]["jobs"].values()
    return job


def _generated(write_spec, tmp_path, text: str) -> dict:
    result = jobs_cli(write_spec(text), "-o", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    return _job(tmp_path / "out")


def _cluster(job, key="main") -> dict:
    from databricks.sdk.service.compute import ClusterSpec

    (found,) = [c["new_cluster"] for c in job["job_clusters"] if c["job_cluster_key"] == key]
    assert ClusterSpec.from_dict(found).as_dict() == found  # nothing the SDK would drop
    return found


def _parameters(job, key) -> list[str]:
    (task,) = [t for t in job["tasks"] if t["task_key"] == key]
    return task["python_wheel_task"]["parameters"]


@pytest.mark.parametrize("node, runtime", [("g5.xlarge", "17.3.x-gpu-ml-scala2.13"),
                                           ("i3.xlarge", "17.3.x-cpu-ml-scala2.13")])
def test_the_worker_type_chooses_the_gpu_or_cpu_ml_runtime(tmp_path, write_spec, node, runtime):
    job = _generated(write_spec, tmp_path, MINIMAL + f"jobs: {{cluster: {{node_type_id: {node}}}}}\n")
    assert _cluster(job)["spark_version"] == runtime


def test_a_custom_image_runs_on_the_standard_runtime_with_its_secret(tmp_path, write_spec):
    job = _generated(write_spec, tmp_path, MINIMAL + """\
jobs:
  cluster:
    docker_image: {url: registry.example.com/ml/dbspec:1, username: bot, password_secret: ci/registry}
""")
    cluster = _cluster(job)
    assert cluster["spark_version"] == "17.3.x-scala2.13"
    assert cluster["docker_image"] == {"url": "registry.example.com/ml/dbspec:1", "basic_auth": {
        "username": "bot", "password": "{{secrets/ci/registry}}"}}


def test_a_standard_runtime_without_an_image_is_refused_for_every_task(write_spec):
    result = jobs_cli(write_spec(MINIMAL + "jobs: {cluster: {spark_version: 17.3.x-scala2.13}}\n"),
                      "-o", "/nonexistent/never-written")
    assert result.returncode == 1
    assert "jobs.cluster.spark_version: '17.3.x-scala2.13' is not an ML runtime" in result.stderr


def test_spark_work_autoscales_and_reads_through_the_cluster_s_spark(tmp_path, write_spec):
    job = _generated(write_spec, tmp_path, MINIMAL.replace(
        "{kind: sklearn, name: diabetes}", "{kind: spark_table, table: main.ml.diabetes}")
        + "search: {n_trials: 8, parallelism: 4, space: {training.optimizer.lr: {float: [0.0001, 0.1], log: true}}}\n")
    main = _cluster(job)
    assert main["autoscale"] == {"min_workers": 1, "max_workers": 4}
    assert "num_workers" not in main and "spark.master" not in main.get("spark_conf", {})
    (tune_task,) = [t for t in job["tasks"] if t["task_key"] == "tune"]
    assert _cluster(job, tune_task["job_cluster_key"])["autoscale"]["max_workers"] == 4
    data, tune, train = (_parameters(job, k) for k in ("data", "tune", "train"))
    assert data[-3:-1] == ["--executor", "spark"] or "--executor" in data
    assert data[data.index("--executor") + 1] == "spark"
    assert tune[tune.index("--executor") + 1] == "spark"
    assert "--executor" not in train  # training itself runs in the task's own process


def test_local_data_and_training_ranks_keep_fixed_clusters(tmp_path, write_spec):
    job = _generated(write_spec, tmp_path, MINIMAL + "compute: {kind: torch_distributor, "
                     "num_processes: 2, local_mode: false, use_gpu: true}\n")
    assert _cluster(job)["num_workers"] == 0 and "autoscale" not in _cluster(job)
    training = _cluster(job, "training")
    assert training["num_workers"] == 2 and "autoscale" not in training
    assert "--executor" not in _parameters(job, "data")


@pytest.mark.parametrize("source, where", [
    ("{kind: csv, path: data/train.csv}", "data.source.path"),
    ("{kind: delta, path: tables/rows}", "data.source.path"),
])
def test_a_relative_path_in_a_job_is_a_located_error(tmp_path, write_spec, source, where):
    spec = write_spec(MINIMAL.replace("{kind: sklearn, name: diabetes}", source))
    result = jobs_cli(spec, "-o", str(tmp_path / "out"))
    assert result.returncode == 1, result.stdout
    assert f"{spec}:2:" in result.stderr and f"{where}: '" in result.stderr
    assert "upload it to a Unity Catalog Volume" in result.stderr
    assert not (tmp_path / "out").exists()  # nothing half-written


def test_a_batch_input_path_must_be_one_the_cluster_reaches(tmp_path, write_spec):
    base = MINIMAL + "registry: {name: m}\nserving:\n  mode: batch\n  batch: {input: %s, output: /Volumes/c/s/v/out}\n"
    assert jobs_cli(write_spec(base % "scoring/rows.parquet"), "-o", str(tmp_path / "a")) \
        .returncode == 1
    for fine in ("main.ml.scoring", "/Volumes/main/ml/in/rows.parquet", "s3://bucket/rows"):
        result = jobs_cli(write_spec(base % fine), "-o", str(tmp_path / fine.replace("/", "_")))
        assert result.returncode == 0, (fine, result.stderr)


@pytest.mark.slow
def test_every_example_s_jobs_load_into_databricks_bundles(tmp_path):
    """Issue 32's "done when": every job generated from specs/ loads into databricks-bundles'
    ``Job`` unchanged (and into databricks-sdk's ``JobSettings``)."""
    from databricks.sdk.service.jobs import JobSettings

    from tests.conftest import ROOT
    from tests.jobs.helpers import bundles_round_trip

    jobs = []
    for spec in sorted((ROOT / "specs").glob("*.yaml")):
        out = tmp_path / spec.stem
        result = jobs_cli(str(spec), "-o", str(out))
        assert result.returncode == 0, (spec.name, result.stderr)
        for resource in sorted((out / "resources").glob("*.yml")):
            for target in yaml.safe_load(resource.read_text())["targets"].values():
                jobs += target["resources"]["jobs"].values()
    for job in jobs:
        settings = {k: v for k, v in job.items() if k != "permissions"}
        # a bundle's reference to another job's id is resolved at deploy; the SDK wants a number
        text = re.sub(r'"\$\{resources\.jobs\.\w+\.id\}"', "1", json.dumps(settings))
        settings = json.loads(text)
        assert JobSettings.from_dict(settings).as_dict() == settings
    assert len(jobs) >= 15, len(jobs)  # 18 today: main, monitor and deployment jobs
    bundles_round_trip(tmp_path / "bundles", jobs)
