"""Bundle resources beside the job (the registered model and the experiment, with the access the
spec's ``roles`` give) and the job task that owns the serving endpoint.

The endpoint is no bundle resource: a first deploy would create it on a version the model does
not have yet, and every redeploy would reset it to a fixed version, undoing the last promotion.
The job's ``update_endpoint`` task (``dbspec endpoint``) creates it on the alias holder, moves
it when the alias moves and sets the roles' permissions; its settings are computed here.

Roles (admin: read/write/deploy; data scientist: read/write; analyst: read only):

=========================  ======================  ==================  ==========
resource                   admin                   data_scientist      analyst
=========================  ======================  ==================  ==========
UC registered model        ALL_PRIVILEGES, MANAGE  EXECUTE, APPLY_TAG  EXECUTE
workspace registry model   CAN_MANAGE              CAN_EDIT            CAN_READ
job                        CAN_MANAGE              CAN_MANAGE_RUN      CAN_VIEW
experiment                 CAN_MANAGE              CAN_EDIT            CAN_READ
serving endpoint           CAN_MANAGE              CAN_QUERY           CAN_VIEW
=========================  ======================  ==================  ==========

In Unity Catalog ``EXECUTE`` reads a model, ``APPLY_TAG`` writes its tags, ``MANAGE`` its grants
(``ALL_PRIVILEGES`` excludes it). Creating versions and moving aliases stay with the owner (the
deployer, whom the job runs as). ``USE CATALOG``/``USE SCHEMA`` on the parents are not granted.
"""

from __future__ import annotations

from typing import Any, Optional

from dbspec.jobs.tasks import job_key
from dbspec.seams.compute import compute_kind

#: Unity Catalog privileges on the registered model, by role.
ROLE_GRANTS = {"admin": ("ALL_PRIVILEGES", "MANAGE"),
               "data_scientist": ("APPLY_TAG", "EXECUTE"),
               "analyst": ("EXECUTE",)}
#: Permission levels by resource, then role.
ROLE_LEVELS = {
    "job": {"admin": "CAN_MANAGE", "data_scientist": "CAN_MANAGE_RUN", "analyst": "CAN_VIEW"},
    "experiment": {"admin": "CAN_MANAGE", "data_scientist": "CAN_EDIT", "analyst": "CAN_READ"},
    "endpoint": {"admin": "CAN_MANAGE", "data_scientist": "CAN_QUERY", "analyst": "CAN_VIEW"},
    "model": {"admin": "CAN_MANAGE", "data_scientist": "CAN_EDIT", "analyst": "CAN_READ"},
}
UPDATE_ENDPOINT = "update_endpoint"
#: What ``dbspec endpoint`` imports beyond dbspec's core dependencies (databricks-sdk among them).
ENDPOINT_PACKAGES = ("mlflow",)
_PRINCIPAL_FIELD = {"user": "user_name", "group": "group_name",
                    "service_principal": "service_principal_name"}
_WORKSPACE_PATHS = ("/Users/", "/Shared/", "/Workspace/")


def endpoint_name(spec, target: str) -> str:
    """The serving endpoint's name: the spec's name and the target (``default`` without
    targets), 63 characters; what ``dbspec endpoint`` serves without ``--endpoint``."""
    endpoint = "".join(c if c.isalnum() or c in "-_" else "-" for c in spec.name)[:63]
    return f"{endpoint}-{target}"[:63]


def serves_realtime(spec) -> bool:
    """Whether the job keeps a serving endpoint (realtime serving of a registered model)."""
    from dbspec.seams.targets import job_tasks

    return spec.registry is not None and UPDATE_ENDPOINT in job_tasks(spec.serving.mode)


def trains_on_gpu(spec) -> bool:
    """Whether ``compute`` trains on GPUs, so that the endpoint serves on them too."""
    return compute_kind(spec).trains_on_gpu(spec.compute)


def served_entity_name(spec) -> str:
    """The served entity's name: the alias it follows, so the name outlives each version."""
    return spec.serving.model_alias or spec.registry.final_alias() or "latest-version"


def registry_resources(spec) -> dict[str, Any]:
    """The registered model and, with roles, the experiment, each with the roles' access."""
    out: dict[str, Any] = {}
    key = job_key(spec)
    experiment = experiment_resource(spec)
    if experiment:
        out["experiments"] = {key: experiment}
    if spec.registry is None:
        return out
    parts = spec.registry.name.split(".")
    if len(parts) == 3:
        model: dict[str, Any] = {"catalog_name": parts[0], "schema_name": parts[1],
                                 "name": parts[2],
                                 "comment": f"Trained by dbspec spec {spec.name}"}
        grants = role_grants(spec)
        if grants:
            model["grants"] = grants
        out["registered_models"] = {key: model}
    else:
        legacy: dict[str, Any] = {"name": spec.registry.name,
                                  "description": f"Trained by dbspec spec {spec.name}"}
        permissions = _bundle_permissions(spec, "model")
        if permissions:
            legacy["permissions"] = permissions
        out["models"] = {key: legacy}
    return out


def endpoint_config(spec, endpoint: str, version: str):
    """(``EndpointCoreConfigInput``, ``AiGatewayConfig`` or None) that ``dbspec endpoint``
    creates ``endpoint`` with: the model at ``version``, Small, GPU if trained on GPUs."""
    from databricks.sdk.service import serving as s

    entity = s.ServedEntityInput(
        name=served_entity_name(spec), entity_name=spec.registry.name, entity_version=version,
        workload_size="Small",
        workload_type=s.ServingModelWorkloadType.GPU_SMALL if trains_on_gpu(spec)
        else s.ServingModelWorkloadType.CPU,
        scale_to_zero_enabled=True)
    table = inference_table_config(spec, endpoint)
    return (s.EndpointCoreConfigInput(name=endpoint, served_entities=[entity]),
            s.AiGatewayConfig(inference_table_config=table) if table is not None else None)


def inference_table_config(spec, endpoint: str):
    """``serving.realtime.inference_table`` as the AI Gateway's table config of ``endpoint``, in
    the registered model's catalog and schema, prefixed with the endpoint's name; None when off
    or the registry is not in Unity Catalog."""
    from databricks.sdk.service.serving import AiGatewayInferenceTableConfig

    table = spec.serving.realtime.inference_table
    parts = spec.registry.name.split(".")
    if table is None or not table.enabled or len(parts) != 3:
        return None
    prefix = "".join(c if c.isalnum() else "_" for c in endpoint).lower()
    return AiGatewayInferenceTableConfig(catalog_name=parts[0], schema_name=parts[1],
                                         table_name_prefix=prefix, enabled=True)


def endpoint_permissions(spec) -> Optional[list]:
    """The roles' ``serving.ServingEndpointAccessControlRequest`` entries; None without a
    ``roles`` section (the spec then leaves the endpoint's access alone)."""
    from databricks.sdk.service import serving as s

    if spec.roles is None:
        return None
    return [s.ServingEndpointAccessControlRequest(
        **{_PRINCIPAL_FIELD[principal.kind]: principal.name},
        permission_level=s.ServingEndpointPermissionLevel(ROLE_LEVELS["endpoint"][role]))
        for role, principal in spec.roles.members()]


def registered_name(spec) -> str:
    """The registered model's name as the bundle resolves it: a reference to its resource,
    since development mode prefixes the name per user (``dev_<user>_model``)."""
    key, parts = job_key(spec), spec.registry.name.split(".")
    if len(parts) == 3:
        return f"{parts[0]}.{parts[1]}.${{resources.registered_models.{key}.name}}"
    return f"${{resources.models.{key}.name}}"


def name_assignments(spec) -> tuple[str, ...]:
    """``--set`` assignments pointing every task at the bundle's own model and experiment, so
    that a development deployment trains into its per-user copies."""
    out = []
    if spec.registry is not None:
        out.append(f"registry.name={registered_name(spec)}")
    if experiment_resource(spec) is not None:
        out.append(f"tracking.experiment=${{resources.experiments.{job_key(spec)}.name}}")
    return tuple(out)


def experiment_resource(spec) -> Optional[dict[str, Any]]:
    """The ``experiments`` entry carrying the roles' permissions: only with roles, and only
    for a workspace path (the name MLflow on Databricks needs)."""
    experiment = spec.tracking.experiment or ""
    permissions = _bundle_permissions(spec, "experiment")
    if not permissions or not experiment.startswith(_WORKSPACE_PATHS):
        return None
    return {"name": experiment, "permissions": permissions}


def role_grants(spec) -> list[dict[str, Any]]:
    """Unity Catalog grants (``catalog.PrivilegeAssignment`` as dicts) by role."""
    from databricks.sdk.service.catalog import Privilege, PrivilegeAssignment

    return [PrivilegeAssignment(principal=principal.name,
                                privileges=[Privilege(p) for p in ROLE_GRANTS[role]]).as_dict()
            for role, principal in _members(spec)]


def role_permissions(spec) -> list:
    """The job's ``jobs.JobAccessControlRequest`` entries from the roles; a principal that
    ``jobs.permissions`` names keeps the level given there."""
    from databricks.sdk.service import jobs as j

    given = {(p.user, p.group, p.service_principal) for p in spec.jobs.permissions}
    out = []
    for role, principal in _members(spec):
        named = tuple(principal.name if kind == principal.kind else None
                      for kind in _PRINCIPAL_FIELD)
        if named not in given:
            out.append(j.JobAccessControlRequest(
                **{_PRINCIPAL_FIELD[principal.kind]: principal.name},
                permission_level=j.JobPermissionLevel(ROLE_LEVELS["job"][role])))
    return out


def _members(spec) -> list:
    return spec.roles.members() if spec.roles is not None else []


def _bundle_permissions(spec, resource: str) -> list[dict[str, str]]:
    """The bundle's ``permissions`` entries (``level`` and one principal field) by role."""
    return [{"level": ROLE_LEVELS[resource][role],
             _PRINCIPAL_FIELD[principal.kind]: principal.name}
            for role, principal in _members(spec)]


def resource_warnings(spec) -> list[str]:
    """What the roles or the endpoint cannot carry although the spec is valid."""
    found = []
    experiment = spec.tracking.experiment or spec.name
    if _members(spec) and not experiment.startswith(_WORKSPACE_PATHS):
        found.append(f"roles: no experiment permissions, since tracking.experiment "
                     f"'{experiment}' is not a workspace path")
    table = spec.serving.realtime.inference_table
    if serves_realtime(spec) and table is not None and table.enabled and \
            spec.registry.name.count(".") != 2:
        found.append(f"serving.realtime.inference_table: the endpoint gets no inference table; "
                     f"AI Gateway inference tables live in Unity Catalog and registry.name "
                     f"'{spec.registry.name}' is not catalog.schema.model")
    return found


def jobs_json_warnings(spec) -> list[str]:
    """What the jobs-json format leaves out: it carries the job and its access list only
    (the endpoint's permissions come from the ``update_endpoint`` task in both formats)."""
    missing = [what for what, present in (
        ("registered model", spec.registry is not None),
        ("experiment", experiment_resource(spec) is not None)) if present]
    if not _members(spec) or not missing:
        return []
    return [f"roles: the jobs-json format sets access on the job only; {', '.join(missing)} "
            "access is not set (use --format bundle, or grant it by hand)"]


#: The name prefix a bundle's development mode gives serving endpoints (the Databricks CLI turns
#: ``[dev <short name>] `` into ``dev_<short name>_`` where names take no spaces).
DEV_ENDPOINT_PREFIX = "dev_${workspace.current_user.short_name}_"


def task_endpoint_name(spec, where) -> str:
    """:func:`endpoint_name` of the target, prefixed per user in a bundle's development target
    (as the bundle prefixes its resources) so that two users' jobs do not share an endpoint."""
    name = endpoint_name(spec, where.target or "default")
    if not where.spec_path.startswith("${workspace."):  # jobs-json: paths are literal
        return name
    target = spec.targets.get(where.target) if where.target else None
    mode = target.mode if target is not None else "development"  # as dbspec.jobs.generate
    return DEV_ENDPOINT_PREFIX + name if mode == "development" else name


def endpoint_task(spec, where):
    """The ``update_endpoint`` task (a ``jobs.Task``), or None without realtime serving: ``dbspec
    endpoint SPEC --endpoint NAME --wait`` after promote and serve, installing the wheel and
    MLflow only (what the command imports)."""
    from dbspec.jobs.tasks import (cluster, dbspec_arguments, dbspec_task, mlflow_env,
                                   task_libraries)
    from dbspec.spec.clusters import resolve_cluster, serverless

    if not serves_realtime(spec):
        return None
    parameters = dbspec_arguments("endpoint", where) + [
        "--endpoint", task_endpoint_name(spec, where), "--wait"]
    if serverless(spec):  # one AI Runtime task runs every stage; no job cluster to share
        compute: dict[str, Any] = {"new_cluster": cluster(
            resolve_cluster(spec, "main"), mlflow_env(spec), current_user=where.current_user)}
        upstream = ["pipeline"]
    else:
        compute = {"job_cluster_key": "main"}
        upstream = (["promote"] if spec.registry.promotion is not None else []) + ["serve"]
    return dbspec_task(
        spec, UPDATE_ENDPOINT, parameters, upstream=upstream,
        libraries=task_libraries(spec, (), where.wheel, packages=ENDPOINT_PACKAGES),
        description="Create the serving endpoint on the version the alias holds, or move it "
                    "there if the alias moved; set the roles' permissions on it", **compute)
