"""The ``databricks_endpoint`` serving target (``dbspec endpoint``, the job's ``update_endpoint``
task): see :mod:`dbspec.serving.databricks_endpoint`."""

from __future__ import annotations

from typing import Any

from dbspec.seams.targets import EndpointRequest
from dbspec.targets.common import Target


class DatabricksEndpointTarget(Target):
    """Create the endpoint on the alias holder, or move its served version there."""

    name = "databricks_endpoint"
    mode = "realtime"
    engine = "databricks"
    summary = "on Databricks Model Serving"
    job_task = "update_endpoint"  # the generated job keeps the endpoint on the alias

    def run(self, request: EndpointRequest) -> Any:
        """Follow the alias with the workspace's credentials.

        Raises:
            DbspecError: no Databricks credentials, or the workspace refused a call.
        """
        from dbspec.serving.databricks_endpoint import follow_alias, workspace_client

        return follow_alias(workspace_client(), request.client, request.model,
                            request.endpoint, config=request.config,
                            permissions=request.permissions, dry_run=request.dry_run,
                            wait=request.wait)


TARGET = DatabricksEndpointTarget()
