"""Task values: how a ``dbspec`` task of a Databricks job reports an outcome that the job's
condition tasks read (``{{tasks.<key>.values.<name>}}``).

They are set through databricks-sdk's runtime ``dbutils`` (``databricks.sdk.runtime``), which on
a Databricks cluster is the runtime's own. Databricks documents ``dbutils.jobs.taskValues`` for
Python notebooks; where the runtime does not give a wheel task its ``dbutils``, setting them fails
and so does the task (a failure never passes for an outcome). Off Databricks (no
``DATABRICKS_RUNTIME_VERSION``) there is no job run to set them on: they are only printed.
"""

from __future__ import annotations

import os

from dbspec.errors import DbspecError


def set_task_values(values: dict[str, str]) -> bool:
    """Set ``values`` on the running Databricks job task; False off Databricks.

    Raises:
        DbspecError: on Databricks, but the runtime's ``dbutils`` is not there or refused them.
    """
    if not os.environ.get("DATABRICKS_RUNTIME_VERSION"):
        return False
    try:
        from databricks.sdk import runtime

        if runtime.is_local_implementation:  # the remote stand-in sets nothing
            raise RuntimeError("databricks-sdk found no Databricks runtime dbutils here")
        for key, value in values.items():
            runtime.dbutils.jobs.taskValues.set(key=key, value=value)
    except Exception as exc:  # whatever the runtime raises, the task must fail
        raise DbspecError(f"cannot set the task values {', '.join(values)} for the job's "
                          f"condition tasks: {str(exc).splitlines()[0] if str(exc) else exc!r}"
                          ) from None
    return True
