"""AI Runtime as issue 32 asks: every generated ``ai_runtime_task`` passes databricks-air's own
run-config validation; 8 and 16 (two nodes) x ``GPU_8xH100`` validate and compile; two nodes'
command scripts, run on this machine with the variables AI Runtime sets, train one model on
torchrun ranks; the platform's MLflow run becomes dbspec's pipeline run.

databricks-air is installed for the test into a temporary folder without its dependencies
(it would downgrade ``rich`` in this environment) and imported in a subprocess only: it ships a
top-level package named ``cli``. No AI Runtime can run here: the "nodes" are processes on this
machine with the variables the platform sets (NUM_NODES, NODE_RANK, MASTER_ADDR, MASTER_PORT,
LOCAL_WORLD_SIZE), and the scripts' two pip installs are left out (they need the built wheel
and the index; the wheel's delivery is tests/jobs/test_delivery.py's).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import MINIMAL, ROOT, checkout_env
from tests.jobs.helpers import jobs_cli

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ai_runtime")]

AIR = ("databricks-air==1.2.1", "omegaconf==2.4.0")

SERVERLESS = MINIMAL + """\
registry: {name: main.ml.minimal}
tracking: {experiment: /Shared/minimal}
compute: {kind: serverless_gpu, accelerator: GPU_8xH100, count: %d}
"""

#: Map each task onto air's RunConfig and validate it; prints one verdict per task.
CHECK = """\
import json, sys
from cli.sdk import RunConfig, validate_run_config
for job, task, command in json.load(sys.stdin):
    art = task["ai_runtime_task"]
    (deployment,) = art["deployments"]
    env = {e["environment_key"]: e["spec"] for e in job["environments"]}[task["environment_key"]]
    version = env.get("environment_version") or env["base_environment"].rsplit("/", 1)[-1]
    config = {"experiment_name": art["experiment"], "command": command,
              "compute": {"num_accelerators": deployment["compute"]["accelerator_count"],
                          "accelerator_type": deployment["compute"]["accelerator_type"]},
              "environment": {"version": version, "dependencies": env.get("dependencies", [])}}
    if art.get("mlflow_experiment_directory"):
        config["mlflow_experiment_directory"] = art["mlflow_experiment_directory"]
    try:
        validate_run_config(RunConfig.model_validate(config))
        print("valid")
    except Exception as exc:
        print("invalid: " + " ".join(str(exc).split())[:300])
"""


@pytest.fixture(scope="module")
def air(tmp_path_factory) -> Path:
    target = tmp_path_factory.mktemp("air")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target",
                    str(target), *AIR], check=True, timeout=600)
    return target


def air_verdicts(air: Path, cases: list) -> list[str]:
    done = subprocess.run([sys.executable, "-c", CHECK], input=json.dumps(cases), text=True,
                          capture_output=True, env={**os.environ, "PYTHONPATH": str(air)},
                          timeout=120, cwd=air)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def ai_tasks(out: Path) -> list:
    """(job, task, command script text) of every ai_runtime_task in a generated bundle."""
    found = []
    for resource in sorted((out / "resources").glob("*.yml")):
        for target in yaml.safe_load(resource.read_text())["targets"].values():
            for job in target["resources"]["jobs"].values():
                for task in job["tasks"]:
                    if "ai_runtime_task" in task:
                        (deployment,) = task["ai_runtime_task"]["deployments"]
                        script = deployment["command_path"].split("}/", 1)[1]
                        found.append((job, task, (out / script).read_text()))
    return found


def test_every_ai_runtime_task_passes_databricks_air_s_validation(air, tmp_path, write_spec):
    cases = []
    for spec in [*sorted((ROOT / "specs").glob("*.yaml")),
                 *(write_spec(SERVERLESS % n, f"h100x{n}.yaml") for n in (8, 16))]:
        out = tmp_path / Path(spec).stem
        assert jobs_cli(str(spec), "-o", str(out)).returncode == 0
        cases += ai_tasks(out)
    assert len(cases) >= 4, cases  # the example's one- and two-node targets, 8 and 16 here
    assert air_verdicts(air, cases) == ["valid"] * len(cases)
    # the check can fail: 12 GPUs of a kind with 8 per node is one and a half nodes
    job, task, command = cases[-1]
    task["ai_runtime_task"]["deployments"][0]["compute"]["accelerator_count"] = 12
    (verdict,) = air_verdicts(air, [(job, task, command)])
    assert verdict.startswith("invalid") and "8" in verdict, verdict


@pytest.mark.parametrize("count, nodes", [(8, 1), (16, 2)])
def test_eight_and_sixteen_h100s_validate_and_compile(tmp_path, write_spec, count, nodes):
    from databricks.sdk.service.jobs import JobSettings

    out = tmp_path / "out"
    result = jobs_cli(write_spec(SERVERLESS % count), "-o", str(out))
    assert result.returncode == 0, result.stderr
    ((job, task, script),) = ai_tasks(out)
    compute = task["ai_runtime_task"]["deployments"][0]["compute"]
    assert compute == {"accelerator_type": "GPU_8xH100", "accelerator_count": count}
    assert JobSettings.from_dict(job).as_dict() == job
    # every node runs the script: node 0 the stages, the others the ranks node 0 launches
    assert ('if [ "${NODE_RANK:-0}" != "0" ]' in script) == (nodes > 1)
    assert 'key=(--run-key "$DBSPEC_PLATFORM_RUN")' in script and "unset MLFLOW_RUN_ID" in script


def test_twelve_h100s_are_a_located_error(write_spec):
    result = jobs_cli(write_spec(SERVERLESS % 12), "-o", "/nonexistent/never")
    assert result.returncode == 1
    assert "compute.count: GPU_8xH100 has 8 GPUs per node, so count must be a multiple of 8" \
        in result.stderr


def test_deepspeed_settings_without_the_deepspeed_strategy_are_refused(write_spec):
    text = (SERVERLESS % 8).replace("count: 8}", "count: 8, zero_stage: 3}")
    result = jobs_cli(write_spec(text), "-o", "/nonexistent/never")
    assert result.returncode == 1 and "compute.strategy: zero_stage, offload and config are " \
        "DeepSpeed's: set strategy: deepspeed" in result.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_ai_runtime_nodes_train_one_model_on_torchrun_ranks(tmp_path, write_spec):
    shared = tmp_path / "shared"
    spec = write_spec(MINIMAL.replace("name: minimal", "name: two-nodes") + f"""\
training: {{epochs: 2, batch_size: 64}}
tracking: {{tracking_uri: "sqlite:///{tmp_path}/mlflow.db", experiment: two-nodes}}
compute: {{kind: serverless_gpu, accelerator: GPU_1xH100, count: 2}}
jobs: {{shared_dir: {shared}}}
""")
    out = tmp_path / "bundle"
    assert jobs_cli(spec, "-o", str(out)).returncode == 0
    ((_, _, script),) = ai_tasks(out)
    runnable = out / "scripts" / "node.sh"  # the generated script, without its two pip installs
    runnable.write_text("\n".join(line for line in script.splitlines()
                                  if not line.startswith("python -m pip install")) + "\n")
    platform = {"NUM_NODES": "2", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(_free_port())}
    bin_dir = Path(sys.executable).parent
    nodes = [subprocess.Popen(["bash", str(runnable)], cwd=tmp_path, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              env=checkout_env({**platform, "NODE_RANK": str(rank),
                                                "PATH": f"{bin_dir}:{os.environ['PATH']}"}))
             for rank in (0, 1)]
    outputs = [node.communicate(timeout=600)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outputs
    assert (shared / "ai-runtime" / "manual" / "launch.sh").is_file()  # node 1 ran it
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    (experiment,) = [e for e in client.search_experiments() if e.name == "two-nodes"]
    world = {r.data.params.get("dbspec.world_size") for r in
             client.search_runs([experiment.experiment_id])}
    assert "2" in world, world  # one model, trained by a rank on each node


def test_the_platform_s_mlflow_run_becomes_the_pipeline_run(tmp_path, write_spec):
    import mlflow

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = mlflow.MlflowClient(uri)
    experiment = client.create_experiment("platform", artifact_location=str(tmp_path / "art"))
    platform_run = client.create_run(experiment).info.run_id  # what AI Runtime makes
    spec = write_spec(MINIMAL + f'tracking: {{tracking_uri: "{uri}", experiment: platform}}\n'
                      "training: {epochs: 2}\n")
    # the command script hands the platform's run over as DBSPEC_PLATFORM_RUN and unsets
    # MLFLOW_RUN_ID, which MLflow would otherwise resume (and end) as the training's run
    # --tracking-uri: an MLFLOW_TRACKING_URI another test left in this worker would win
    done = subprocess.run([sys.executable, "-m", "dbspec", "run", spec, "--run-key",
                           platform_run, "--state-dir", str(tmp_path / "state"),
                           "--tracking-uri", uri],
                          env=checkout_env({"DBSPEC_PLATFORM_RUN": platform_run}), cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    runs = client.search_runs([experiment], "tags.`dbspec.kind` = 'pipeline'")
    assert [r.info.run_id for r in runs] == [platform_run]  # adopted, no second pipeline run
    assert runs[0].data.tags["dbspec.run_key"] == platform_run
    trained = [r for r in client.search_runs([experiment]) if "train_loss" in r.data.metrics]
    assert trained and platform_run not in {r.info.run_id for r in trained}


def test_the_other_nodes_stop_when_node_0_fails_and_ignore_an_earlier_attempt(tmp_path,
                                                                              write_spec):
    shared = tmp_path / "shared"
    spec = write_spec(MINIMAL.replace("{kind: sklearn, name: diabetes}",
                                      "{kind: csv, path: /nonexistent/rows.csv}") + f"""\
compute: {{kind: serverless_gpu, accelerator: GPU_1xH100, count: 2}}
jobs: {{shared_dir: {shared}}}
""")
    out = tmp_path / "bundle"
    assert jobs_cli(spec, "-o", str(out)).returncode == 0
    ((_, _, script),) = ai_tasks(out)
    runnable = out / "scripts" / "node.sh"
    runnable.write_text("\n".join(line for line in script.splitlines()
                                  if not line.startswith("python -m pip install")) + "\n")
    meeting = shared / "ai-runtime" / "manual"
    meeting.mkdir(parents=True)
    (meeting / "launch.sh").write_text("exit 42\n")  # an earlier attempt's, never to be run
    old = 1_000_000_000
    os.utime(meeting / "launch.sh", (old, old))
    platform = {"NUM_NODES": "2", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(_free_port()),
                "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    other = subprocess.Popen(["bash", str(runnable)], cwd=tmp_path, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             env=checkout_env({**platform, "NODE_RANK": "1"}))
    first = subprocess.run(["bash", str(runnable)], cwd=tmp_path, text=True, capture_output=True,
                           env=checkout_env({**platform, "NODE_RANK": "0"}), timeout=300)
    assert first.returncode != 0  # the data is not there: node 0 fails before training
    # its exit, however it comes, tells the waiting node to stop (within one 5 s poll)
    assert other.wait(timeout=60) == 0, other.communicate()[0]
