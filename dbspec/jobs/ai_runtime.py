"""The job of ``compute.kind: serverless_gpu``: one AI Runtime task running every stage through
a command script. As databricks-air 1.2.1 and the Jobs API have it, the task needs a job
``environments`` entry, and the platform sets no MLflow URIs: the script exports them.
"""

from __future__ import annotations

import shlex
from typing import Optional

from dbspec.spec.databricks import experiment_location
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
    """The command script of :func:`ai_runtime_task`: export the MLflow URIs, install dbspec
    (``install``: the wheel beside the script, ``../dist``, or a pinned requirement) without
    its dependencies, then what the stages need but the environment lacks, run every stage."""
    run = ["dbspec", "run", f'"$here/../specs/{spec_name}"']
    if target:
        run += ["--target", shlex.quote(target)]
    run += ["--shared-dir", shlex.quote(shared), "--quiet"]
    exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in mlflow_env(spec).items())
    wheel = f'{install}"' if install.startswith('"') else shlex.quote(install)
    needs = [pin for extra in (None, *task_extras(spec, ("train", "serve")))
             for pin in extra_requirements(extra, keep=_environment_lacks(spec))]
    return (f"#!/usr/bin/env bash\n{header}"
            "# The AI Runtime (serverless GPU) command of this job: every stage of the spec.\n"
            f"set -euo pipefail\n{exports}"
            'here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"\n'
            f"python -m pip install --quiet --no-deps {wheel}\n"
            f"python -m pip install --quiet "
            f"{' '.join(shlex.quote(p) for p in dict.fromkeys(needs))}\n"
            f"exec {' '.join(run)}\n")


def _environment_lacks(spec) -> tuple[str, ...]:
    """What the AI Runtime environment does not ship of what dbspec leaves to runtimes: the
    Databricks AI environment and GPU environment 4 carry PyTorch, the later base ones not."""
    version = spec.compute.environment
    return () if version.startswith("databricks_ai_v") or int(version) <= 4 else ("torch",)
