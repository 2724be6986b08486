"""The job of ``compute.kind: serverless_gpu``: one AI Runtime task running every stage through
a command script. As databricks-air 1.2.1 and the Jobs API have it, the task needs a job
``environments`` entry, and the platform sets no MLflow URIs: the script exports them.
"""

from __future__ import annotations

import shlex
from typing import Optional

from dbspec.spec.databricks import RENDEZVOUS, experiment_location
from dbspec.jobs.tasks import extra_requirements, mlflow_env, task_extras, task_settings

#: The job environment the AI Runtime task runs in.
ENVIRONMENT_KEY = "default"


def ai_runtime_task(spec, script: str, stages: list[str]):
    """The job's one task: every stage in one AI Runtime workload (a command script takes no job
    parameters, so the stages cannot hand over through a run key between tasks)."""
    from databricks.sdk.service import jobs as j

    compute = spec.compute
    name, folder = experiment_location(spec.tracking.experiment or spec.name)
    return j.Task(
        task_key="pipeline", environment_key=ENVIRONMENT_KEY,
        description=f"dbspec stages on AI Runtime ({compute.accelerator} x{compute.count}): "
                    + ", ".join(stages),
        ai_runtime_task=j.AiRuntimeTask(
            experiment=name, mlflow_experiment_directory=folder,
            deployments=[j.DeploymentSpec(
                name="train", command_path=script,
                compute=j.ComputeSpec(
                    accelerator_type=j.ComputeSpecAcceleratorType(compute.accelerator),
                    accelerator_count=compute.count,
                    provisioned_capacity_id=compute.provisioned_capacity_id))]),
        **task_settings(spec.jobs, "train"))


def ai_runtime_environments(spec) -> list:
    """The job's ``environments``: the one its AI Runtime task names, from
    ``compute.environment`` (a version number, or the Databricks AI base environment)."""
    from databricks.sdk.service.compute import Environment
    from databricks.sdk.service.jobs import JobEnvironment

    version = spec.compute.environment
    environment = Environment(base_environment=f"workspace-base-environments/{version}") \
        if version.startswith("databricks_ai_v") else Environment(environment_version=version)
    return [JobEnvironment(environment_key=ENVIRONMENT_KEY, spec=environment)]


def ai_runtime_script(spec, target: Optional[str], *, install: str, spec_name: str,
                      shared: str, header: str) -> str:
    """The command script of :func:`ai_runtime_task`, run on every node: export the MLflow
    URIs, install dbspec (``install``: the wheel beside the script, ``../dist``, or a pinned
    requirement) without its dependencies, then what the stages need but the environment
    lacks. Node 0 runs every stage in the platform's MLflow run; the others run the training
    ranks node 0 launches (:mod:`dbspec.training.torchrun`)."""
    run = ["dbspec", "run", '"$here/../specs/"' + shlex.quote(spec_name)]
    if target:
        run += ["--target", shlex.quote(target)]
    run += ["--shared-dir", shlex.quote(shared), '${key[@]+"${key[@]}"}', "--quiet"]
    exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in mlflow_env(spec).items())
    wheel = f'{install}"' if install.startswith('"') else shlex.quote(install)
    needs = [pin for extra in (None, *task_extras(spec, ("train", "serve")))
             for pin in extra_requirements(extra, keep=_environment_lacks(spec))]
    meeting = shlex.quote(f"{shared.rstrip('/')}/ai-runtime/") + '"${DBSPEC_PLATFORM_RUN:-manual}"'
    return (f"#!/usr/bin/env bash\n{header}"
            "# The AI Runtime (serverless GPU) command of this job, run on every node.\n"
            f"set -euo pipefail\n{exports}"
            'here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"\n'
            "# the platform's MLflow run becomes dbspec's pipeline run; left set, MLflow would\n"
            "# resume it as the first run dbspec starts (the training's) and end it there\n"
            'export DBSPEC_PLATFORM_RUN="${MLFLOW_RUN_ID:-}"\nunset MLFLOW_RUN_ID\n'
            f"export {RENDEZVOUS}={meeting}\n"
            'started="$(mktemp)"  # files of an earlier attempt are older than this one\n'
            'if [ "${NODE_RANK:-0}" = "0" ]; then\n'
            f'  trap \'mkdir -p "${RENDEZVOUS}" && touch "${RENDEZVOUS}/done"\' EXIT'
            "  # whatever ends node 0,\n"
            f'  rm -f "${RENDEZVOUS}/launch.sh"  # the other nodes stop waiting\nfi\n'
            f"python -m pip install --quiet --no-deps {wheel}\n"
            f"python -m pip install --quiet "
            f"{' '.join(shlex.quote(p) for p in dict.fromkeys(needs))}\n"
            + _other_nodes(spec) +
            'key=()\nif [ -n "$DBSPEC_PLATFORM_RUN" ]; then key=(--run-key "$DBSPEC_PLATFORM_RUN"); fi\n'
            f"{' '.join(run)}\n")


def _other_nodes(spec) -> str:
    """Nodes 1..N-1 wait for node 0's torchrun command and run their ranks (several nodes);
    files older than this attempt are an earlier attempt's."""
    compute = spec.compute
    if compute.count <= compute.gpus_per_node:
        return ""
    wait = spec.jobs.timeout_seconds or 86_400
    fresh = '[ "$' + RENDEZVOUS + '/{}" -nt "$started" ]'
    return ('if [ "${NODE_RANK:-0}" != "0" ]; then  # node 0 runs the stages, then launches\n'
            f'  for _ in $(seq 1 {wait // 5}); do\n'
            f'    if {fresh.format("launch.sh")}; then exec bash "${RENDEZVOUS}/launch.sh"; fi\n'
            f'    if {fresh.format("done")}; then exit 0; fi\n'
            "    sleep 5\n  done\n"
            f'  echo "node $NODE_RANK: node 0 launched no training in {wait} s" >&2; exit 1\n'
            "fi\n")


def _environment_lacks(spec) -> tuple[str, ...]:
    """What the AI Runtime environment does not ship of what dbspec leaves to runtimes: the
    Databricks AI environment and GPU environment 4 carry PyTorch, the later base ones not."""
    version = spec.compute.environment
    return () if version.startswith("databricks_ai_v") or int(version) <= 4 else ("torch",)
