"""Where each piece of a run lives when Spark executors do part of the work.

On a cluster an executor sees only the data source, the tracking server and a directory every
node mounts (the *shared dir*), not the driver's disk. These rules refuse, before any work, a
run that cannot work where it is sent, naming the field to set. Pure: no Spark, MLflow or I/O.
"""

from __future__ import annotations

import os
from typing import Optional

from dbspec.errors import DbspecError
from dbspec.seams.compute import compute_kind
from dbspec.spec.locations import is_local_master, is_local_store  # part of this module's API

SHARED_DIR_ENV = "DBSPEC_SHARED_DIR"


class PlacementError(DbspecError):
    """A run asks executors to reach something only the driver has."""


def normalise_shared_dir(value: str) -> str:
    """The shared dir as a path this process opens (``dbfs:/x`` is the ``/dbfs/x`` FUSE mount
    every Databricks node has); a :class:`PlacementError` for what
    :func:`dbspec.spec.sections.jobs.check_shared_dir` refuses."""
    from dbspec.spec.sections.jobs import check_shared_dir

    try:
        check_shared_dir(value)
    except ValueError as exc:
        raise PlacementError(f"shared dir: {exc}") from None
    if value.startswith("dbfs:/"):
        return "/dbfs/" + value[len("dbfs:/"):].lstrip("/")
    return value


def resolve_shared_dir(spec, override: Optional[str] = None) -> Optional[str]:
    """``--shared-dir`` > ``DBSPEC_SHARED_DIR`` > ``spark.shared_dir``; absolute, or None."""
    value = override or os.environ.get(SHARED_DIR_ENV) or spec.spark.shared_dir
    return normalise_shared_dir(value) if value else None


def ranks_on_executors(spec) -> bool:
    """Distributed training whose ranks run as Spark tasks (the compute kind says:
    ``local_mode: false``, or always where the launcher's workers are Spark tasks)."""
    return compute_kind(spec).remote_ranks(spec.compute) is not None


def trials_on_executors(spec, executor: str) -> bool:
    """Search trials run as Spark tasks under the spark executor."""
    return spec.search is not None and executor == "spark"


def check_placement(spec, *, master: str, executor: str, shared_dir: Optional[str],
                    tracking_uri: str, study_storage: Optional[str]) -> list[str]:
    """Refuse a run whose executors would need the driver's disk; returns notes to show.

    ``executor`` is ``local`` or ``spark``, ``shared_dir`` resolved (or None),
    ``study_storage`` the ``search.storage`` as given (None: dbspec's default).

    Raises:
        PlacementError: naming the field or variable to set.
    """
    if is_local_master(master):
        return []
    trials = "search trials (Spark tasks)" if trials_on_executors(spec, executor) else None
    remote = [what for what in (compute_kind(spec).remote_ranks(spec.compute), trials) if what]
    if not remote:
        return []
    who = " and ".join(remote)
    if shared_dir is None:
        raise PlacementError(
            f"spark.shared_dir: the {who} run on the executors of {master}, which cannot read "
            f"this machine's disk; set spark.shared_dir in the spec, {SHARED_DIR_ENV} or "
            "--shared-dir to a directory every node mounts (a UC Volume such as "
            "/Volumes/main/ml/dbspec, dbfs:/..., NFS)")
    if is_local_store(tracking_uri):
        raise PlacementError(
            f"tracking.tracking_uri: the {who} on {master} log to MLflow, but {tracking_uri} "
            "is a file on this machine; point MLFLOW_TRACKING_URI (or tracking.tracking_uri) at "
            "a tracking server every node reaches (mlflow server --serve-artifacts, or "
            "databricks)")
    if trials_on_executors(spec, executor) and study_storage and is_local_store(study_storage):
        raise PlacementError(
            f"search.storage: {study_storage} is a SQLite file on this machine; trials on the "
            f"executors of {master} cannot open it. Use a database URL every node reaches "
            "(postgresql://..., mysql://...), or leave search.storage unset to keep the study "
            "in a journal file in the shared dir")
    return [f"{who} on {master}: shared dir {shared_dir}"]
