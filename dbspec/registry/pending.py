"""Pending versions whose gating process died, tagged ``abandoned``: after a kill no version
is left looking "being gated"."""

from __future__ import annotations

import socket
import time
from typing import Any, Optional

from dbspec.processes import process_alive
from dbspec.registry.errors import is_not_found
from dbspec.registry.history import now

DECISION_TAG = "dbspec.decision"
OWNER_TAG = "dbspec.pending_owner"  # host:pid of the process that is gating the version
ABANDONED_TAG = "dbspec.abandoned"  # when and why a version was tagged abandoned
PENDING, ABANDONED = "pending", "abandoned"
#: A pending version whose owner cannot be checked (another host) counts as dead after this.
PENDING_GRACE_S = 3600.0


def abandon_dead(client: Any, name: str, keep: Optional[str]) -> list[str]:
    """Tag ``abandoned`` every pending version (but ``keep``) whose process is gone; their
    numbers."""
    found = []
    for version in search_versions(client, name, DECISION_TAG, PENDING):
        if str(version.version) != keep and owner_is_dead(client, version):
            abandon(client, name, str(version.version), "its process died before gating it")
            found.append(str(version.version))
    return found


def owner_is_dead(client: Any, version: Any) -> bool:
    """Its run FAILED or KILLED, or its owner process is not running (an owner on another
    host counts as dead after :data:`PENDING_GRACE_S`)."""
    from mlflow.exceptions import MlflowException

    try:
        if version.run_id and client.get_run(version.run_id).info.status in (
                "FAILED", "KILLED"):
            return True
    except MlflowException as exc:
        # only a run that is gone is dead; raising made one unreadable run fail every later
        # registration of the model
        return is_not_found(exc)
    host, _, pid = (version.tags or {}).get(OWNER_TAG, "").rpartition(":")
    if host == socket.gethostname() and pid.isdigit():
        return not process_alive(int(pid))
    age = time.time() - (version.creation_timestamp or 0) / 1000
    return bool(host) and age > PENDING_GRACE_S


def abandon(client: Any, name: str, version: str, why: str) -> None:
    client.set_model_version_tag(name, version, DECISION_TAG, ABANDONED)
    client.set_model_version_tag(name, version, ABANDONED_TAG, f"{now()}: {why}")


def search_versions(client: Any, name: str, tag: str, value: str) -> list[Any]:
    """Versions of ``name`` whose ``tag`` is ``value``, newest first."""
    from mlflow.exceptions import MlflowException

    try:
        found = client.search_model_versions(f"name = '{name}' and tags.`{tag}` = '{value}'")
    except MlflowException:  # a store without tag filters (Unity Catalog): filter here
        found = [v for v in client.search_model_versions(f"name = '{name}'")
                 if (v.tags or {}).get(tag) == value]
    return sorted(found, key=lambda v: int(v.version), reverse=True)
