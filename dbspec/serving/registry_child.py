"""``python -m dbspec.serving.registry_child REQUEST``: the child process of
:func:`~dbspec.serving.registry_reader.ask_child` (a module of its own: it imports
``registry_reader`` and ``source``, which import each other's names one way only). It prints
``{"version", "location"}``, or ``{"error": {"classes", "message"}}`` for a dbspec error.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from dbspec.errors import DbspecError
from dbspec.serving.registry_reader import open_mlflow_client, store_uri
from dbspec.serving.source import ModelTarget, resolve_version, version_artifacts


def _answer(request: dict) -> dict:
    """Resolve with ``MlflowClient``, and bring the version's files onto this disk."""
    from dbspec.tracking.stores import check_tracking_server

    target = ModelTarget(*request["target"])
    uri = store_uri(request["tracking_uri"], Path(request["state_dir"]))
    try:
        try:
            client = open_mlflow_client(uri)
            version = resolve_version(client, target)
            location = version_artifacts(client, target, version)
        except Exception:  # a store MLflow cannot use: say so in one line, else a bug
            check_tracking_server(uri, must_exist=True)
            raise
    except DbspecError as exc:
        classes = [cls.__name__ for cls in type(exc).__mro__]
        return {"error": {"classes": classes, "message": str(exc)}}
    return {"version": version, "location": str(location)}


if __name__ == "__main__":
    print(json.dumps(_answer(json.loads(sys.argv[1]))), flush=True)
