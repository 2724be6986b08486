"""Bundle resources beside the job: the registered model and its serving endpoint."""

from __future__ import annotations

from typing import Any

from dbspec.jobs.build import job_key


def registry_resources(spec, target: str) -> dict[str, Any]:
    """The registered model and, for realtime serving, its serving endpoint."""
    if spec.registry is None:
        return {}
    key = job_key(spec)
    parts = spec.registry.name.split(".")
    out: dict[str, Any] = {}
    if len(parts) == 3:
        out["registered_models"] = {key: {"catalog_name": parts[0], "schema_name": parts[1],
                                          "name": parts[2],
                                          "comment": f"Trained by dbspec spec {spec.name}"}}
    else:
        out["models"] = {key: {"name": spec.registry.name,
                               "description": f"Trained by dbspec spec {spec.name}"}}
    if spec.serving.mode == "realtime":
        endpoint = "".join(c if c.isalnum() or c in "-_" else "-" for c in spec.name)[:63]
        out["model_serving_endpoints"] = {key: {
            "name": f"{endpoint}-{target}"[:63],
            "config": {"served_entities": [{
                "entity_name": spec.registry.name,
                "entity_version": "${var.served_model_version}",
                "workload_size": "Small",
                "scale_to_zero_enabled": True}]}}}
    return out
