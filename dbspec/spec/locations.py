"""Where a Spark master runs its tasks and where a store keeps its data: rules on strings.

They belong to the spec language because validation needs them (a spec that sends search
trials to a cluster with a study in a file on the driver is invalid) and ``validate`` imports
nothing outside ``dbspec.spec``; :mod:`dbspec.spark.placement` applies them to a run.
"""

from __future__ import annotations

_LOCAL_STORES = ("sqlite:", "file:")


def is_local_master(url: str) -> bool:
    """``local`` and ``local[N]`` run every task in the driver's process, on its disk."""
    return url == "local" or url.startswith("local[")


def is_local_store(uri: str) -> bool:
    """A tracking or study store that lives in a file on the driver's disk."""
    if uri.startswith(_LOCAL_STORES):
        return True
    return not uri.startswith("databricks") and "://" not in uri  # a plain path
