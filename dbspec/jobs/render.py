"""Generated files: a Databricks Asset Bundle or Jobs API 2.2 ``jobs/create`` bodies, deterministic
(fixed key order, no timestamps) so that a pull request shows a readable diff and ``--check``
can tell when they are out of date.

Bundle (``-o DIR``): ``databricks.yml`` (bundle, targets and their mode, the shared-directory
variable); ``resources/<job>.<target>.yml`` per target (the job, the registered model, with roles
the experiment; with monitoring the monitor job and, in production targets, the quality
monitor); ``specs/<spec file>``, the spec the tasks run. Jobs JSON: ``<job>.<target>.json`` per
target, with its access control list and a ``shared_dir`` job parameter.
"""

from __future__ import annotations

import json
from pathlib import PurePosixPath
from typing import Any, Mapping, Optional

import yaml

from dbspec import __version__
from dbspec.jobs.build import (
    SHARED_DIR,
    JobTarget,
    access_control,
    build_job,
    shared_dir,
    warnings_for,
)
from dbspec.jobs.ai_runtime import ai_runtime_script
from dbspec.jobs.deployment import build_deployment_job, deployment_job_key, has_deployment_job
from dbspec.jobs.delivery import Delivery, bundle_artifacts, deploy_script
from dbspec.jobs.files import GENERATED_MARK
from dbspec.jobs.monitor import build_monitor_job, monitor_job_key, quality_monitor
from dbspec.jobs.resources import name_assignments, registry_resources
from dbspec.jobs.tasks import job_key
from dbspec.spec.clusters import CURRENT_USER, serverless

SHARED_DIR_HELP = (
    "Directory every node reaches, passed to each task as --shared-dir (training ranks, Spark "
    "trials, checkpoints). Default: jobs.shared_dir, else a shared spark.shared_dir, else "
    "/Volumes/<catalog>/<schema>/dbspec from a catalog.schema.model registry.name, else "
    "/Volumes/main/default/dbspec; the volume must exist. Targets and --var override it.")


class _Dumper(yaml.SafeDumper):
    """Block style, insertion order, no aliases."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def dump_yaml(data: Any) -> str:
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=100,
                     allow_unicode=True)


def _header(spec_file: str, command: str) -> str:
    return (f"{GENERATED_MARK}{__version__} from {spec_file}; do not edit.\n"
            f"# Regenerate with: {command}\n")


def script_name(spec, target: Optional[str]) -> str:
    """Relative path of the AI Runtime command script of one target's job."""
    return f"scripts/{job_key(spec)}.{target or 'default'}.sh"


def bundle_where(spec, spec_file: str, target: Optional[str], how: Delivery) -> JobTarget:
    """Where a bundle's tasks find the spec, the wheel and the shared directory."""
    return JobTarget(spec_path=f"${{workspace.file_path}}/specs/{PurePosixPath(spec_file).name}",
                     wheel=how.library("../dist"), target=target,
                     shared_dir=f"${{var.{SHARED_DIR}}}", current_user=CURRENT_USER,
                     assignments=name_assignments(spec),
                     script=f"${{workspace.file_path}}/{script_name(spec, target)}")


def bundle_job(spec, spec_file: str, target: Optional[str], how: Delivery, *,
               build=build_job) -> dict[str, Any]:
    """The job resource of one target (``build``: the main job, or the monitor job):
    JobSettings as the bundle writes it, plus permissions."""
    job = build(spec, bundle_where(spec, spec_file, target, how)).as_dict()
    rows = [entry.as_dict() for entry in access_control(spec)]
    permissions = [{"level": row.pop("permission_level"), **row} for row in rows]
    if permissions:
        job["permissions"] = permissions
    return job


def bundle_target(spec, mode: str, is_default: bool, base_dir: str) -> dict[str, Any]:
    """One entry of ``targets`` in ``databricks.yml``; the shared directory only where the
    target's spec moves it away from the variable's default."""
    entry: dict[str, Any] = {"mode": mode, **({"default": True} if is_default else {})}
    if shared_dir(spec) != base_dir:
        entry["variables"] = {SHARED_DIR: shared_dir(spec)}
    return entry


def bundle_files(specs: dict[str, Any], modes: Mapping[str, str], default: Optional[str], *,
                 spec_file: str, spec_text: str, command: str,
                 spec_targets: dict[str, Optional[str]], base: Any,
                 how: Delivery) -> dict[str, str]:
    """Relative path -> content of the bundle for the resolved spec of each bundle target
    (``spec_targets`` maps it to the spec's target, None for a spec without targets); ``base``
    is the spec without a target, which gives the variables their defaults; ``how`` the wheel
    is built (an ``artifacts`` entry) or pinned."""
    first = next(iter(specs.values()))
    key = job_key(first)
    header = _header(spec_file, command)
    # no served model version: the update_endpoint task owns the endpoint, so a deploy
    # neither needs a version nor resets the one the alias holds
    variables = {SHARED_DIR: {"description": SHARED_DIR_HELP, "default": shared_dir(base)}}
    root: dict[str, Any] = {"bundle": {"name": key}, **bundle_artifacts(how),
                            "include": ["resources/*.yml"], "variables": variables}
    root["targets"] = {name: bundle_target(spec, modes[name], name == default,
                                           variables[SHARED_DIR]["default"])
                       for name, spec in specs.items()}
    files = {"databricks.yml": header + dump_yaml(root)}
    for target, spec in specs.items():
        jobs = {key: bundle_job(spec, spec_file, spec_targets[target], how)}
        if spec.monitoring is not None:
            jobs[monitor_job_key(spec)] = bundle_job(spec, spec_file, spec_targets[target], how,
                                                     build=build_monitor_job)
        if has_deployment_job(spec):
            jobs[deployment_job_key(spec)] = bundle_job(spec, spec_file, spec_targets[target],
                                                        how, build=build_deployment_job)
        resources = {"jobs": jobs, **registry_resources(spec)}
        monitor = quality_monitor(spec, spec_targets[target], modes[target])
        if monitor is not None:
            resources["quality_monitors"] = {f"{key}_inference": monitor}
        files[f"resources/{key}.{target}.yml"] = header + dump_yaml(
            {"targets": {target: {"resources": resources}}})
        if serverless(spec):
            files[script_name(spec, spec_targets[target])] = ai_runtime_script(
                spec, spec_targets[target], install=how.library('"$here/../dist'),
                spec_name=PurePosixPath(spec_file).name, shared=shared_dir(spec), header=header)
    # the spec copy carries the header too: -o only ever rewrites or removes files with it
    files[f"specs/{PurePosixPath(spec_file).name}"] = header + spec_text
    return files


def jobs_json_files(specs: dict[str, Any], *, spec_file: str, spec_text: str,
                    spec_targets: dict[str, Optional[str]], command: str,
                    how: Delivery) -> dict[str, str]:
    """Relative path -> ``jobs/create`` body (with ``access_control_list``) per target, the
    spec, the AI Runtime scripts, and ``deploy.sh``, which uploads them and the wheel."""
    files: dict[str, str] = {}
    header = _header(spec_file, command)
    spec_name = PurePosixPath(spec_file).name
    roots: dict[str, list[tuple[str, str, str]]] = {}
    for target, spec in specs.items():
        root = spec.jobs.workspace_root.rstrip("/")
        # a job parameter, not a fixed value, so that run now can point a run elsewhere
        name = f"{job_key(spec)}.{target}"
        where = JobTarget(spec_path=f"{root}/specs/{spec_name}",
                          wheel=how.library(f"{root}/dist"), target=spec_targets[target],
                          shared_dir=f"{{{{job.parameters.{SHARED_DIR}}}}}",
                          parameters=((SHARED_DIR, shared_dir(spec)),),
                          script=f"{root}/scripts/{name}.sh")
        acl = [entry.as_dict() for entry in access_control(spec)]
        jobs = []  # in the order deploy.sh needs: a job before those that name its id
        for job, key in ((build_deployment_job(spec, where), deployment_job_key(spec)),
                         (build_job(spec, where), job_key(spec)),
                         (build_monitor_job(spec, where), monitor_job_key(spec))):
            if job is not None:  # the same access list: who sees the job sees the others
                jobs.append((f"{key}.{target}.json", job))
        for path, job in jobs:
            files[path] = _json_body(job, acl)
            roots.setdefault(root, []).append((path, str(job.name),
                                               spec_targets[target] or "default"))
        if serverless(spec):
            files[f"scripts/{name}.sh"] = ai_runtime_script(
                spec, spec_targets[target], install=how.library('"$here/../dist'),
                spec_name=spec_name, shared=shared_dir(spec), header=header)
    files[f"specs/{spec_name}"] = header + spec_text
    for root, bodies in roots.items():
        uploads = [f"specs/{spec_name}"] + sorted(
            f for f in files if f.startswith("scripts/") and any(
                f == f"scripts/{path.removesuffix('.json')}.sh" for path, _, _ in bodies))
        own = "".join(c if c.isalnum() else "_" for c in root.strip("/"))
        files["deploy.sh" if len(roots) == 1 else f"deploy.{own}.sh"] = \
            deploy_script(how, root=root, uploads=uploads, jobs=bodies, header=header)
    return files


def _json_body(job, acl: list[dict[str, Any]]) -> str:
    """A ``jobs/create`` body: the job's settings and, when there is one, its access list."""
    body = job.as_dict()
    if acl:
        body["access_control_list"] = acl
    return json.dumps(body, indent=2, sort_keys=True) + "\n"


__all__ = ["bundle_files", "jobs_json_files", "warnings_for"]
