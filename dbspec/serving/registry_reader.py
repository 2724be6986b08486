"""Registry reads for serving, through MLflow's public client, with MLflow kept out of the server.

Importing MLflow costs about 2 s and 150 MB, which a long-lived server would hold for nothing.
:class:`ServingRegistry` asks its first question (which version the target names, and where its
files are) of an ``mlflow.MlflowClient`` in a short-lived child process
(:mod:`dbspec.serving.registry_child`), which prints one JSON answer and exits; a dbspec error there comes back as the
same error. Later reads (``--watch-alias``) go through a client opened here on first use, off
the request path.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Optional
from urllib.parse import unquote, urlparse

from dbspec.errors import DbspecError, UsageError
from dbspec.registry.errors import RegistryError, RegistryUnavailable
from dbspec.tracking.stores import TrackingError

#: The errors the child hands back by name; any other dbspec error comes back as the nearest
#: of these among its bases (a permission refusal stays a RegistryUnavailable).
_ERRORS = {cls.__name__: cls for cls in (DbspecError, UsageError, RegistryError,
                                         RegistryUnavailable, TrackingError)}
_CHILD_TIMEOUT_S = 600  # a remote store's download can take minutes; a hang must still end


class ServingRegistry:
    """The registry as serving reads it (see the module docstring); any other attribute of
    ``MlflowClient`` is the client's, opened on first use, so code that takes a client takes this.
    """

    def __init__(self, tracking_uri: Optional[str], state_dir: Path,
                 resolve_here: Callable[[Any, Any], str]):
        self._tracking_uri, self._state_dir = tracking_uri, state_dir
        self._resolve_here = resolve_here  # with a client here (source's; it imports this)
        self._client: Any = None
        self._asked_child = False
        self._locations: dict[tuple[str, str], str] = {}  # (name, version): files, from the child
        self._opening = threading.Lock()

    @property
    def client(self) -> Any:
        """The ``mlflow.MlflowClient`` (imports MLflow on first use)."""
        with self._opening:
            if self._client is None:
                self._client = open_mlflow_client(store_uri(self._tracking_uri,
                                                            self._state_dir))
            return self._client

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # never open MLflow for a lookup of this object's internals
            raise AttributeError(name)
        return getattr(self.client, name)

    def resolve(self, target: Any) -> str:
        """The version ``target`` names now: the first time in a child process (which also
        brings its files onto this disk), then with the client here.

        Raises:
            RegistryError: no such model, version or alias; the registry did not answer.
            DbspecError: the store cannot be used.
        """
        if self._asked_child:
            return self._resolve_here(self.client, target)
        self._asked_child = True
        answer = ask_child(self._tracking_uri, self._state_dir, target)
        self._locations[(target.name, answer["version"])] = answer["location"]
        return answer["version"]

    def get_model_version_download_uri(self, name: str, version: Any) -> str:
        """Where the version's files are: the child's answer for the version it resolved."""
        found = self._locations.get((name, str(version)))
        if found is not None:
            return found
        return self.client.get_model_version_download_uri(name, version)


def ask_child(tracking_uri: Optional[str], state_dir: Path, target: Any) -> dict[str, str]:
    """``{"version": ..., "location": ...}`` of ``target``, from a child process with MLflow.

    Raises:
        DbspecError: the child's error, as the same class (or its nearest base here).
    """
    request = {"tracking_uri": tracking_uri, "state_dir": str(state_dir),
               "target": list(target)}
    try:
        done = subprocess.run([sys.executable, "-m", "dbspec.serving.registry_child",
                               json.dumps(request)], capture_output=True, text=True,
                              timeout=_CHILD_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise RegistryUnavailable(f"the registry did not answer: resolving {target.uri} took "
                                  f"over {_CHILD_TIMEOUT_S} s") from None
    lines = done.stdout.strip().splitlines()
    try:
        answer = json.loads(lines[-1]) if lines else None
    except ValueError:
        answer = None
    if done.returncode != 0 or not isinstance(answer, dict):
        tail = done.stderr.strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
        raise DbspecError(f"reading {target.uri} from the registry failed: {tail[0]}")
    if "error" in answer:
        found = next((_ERRORS[name] for name in answer["error"]["classes"] if name in _ERRORS),
                     DbspecError)
        raise found(answer["error"]["message"])
    return answer


def local_artifacts(uri: str) -> Optional[Path]:
    """The directory of a ``file:`` URI or a plain path; None for any remote location."""
    parsed = urlparse(uri)
    if parsed.scheme == "file" and parsed.netloc in ("", "localhost"):
        return Path(unquote(parsed.path))
    if parsed.scheme == "" and uri.startswith("/"):
        return Path(uri)
    return None


def store_uri(tracking_uri: Optional[str], state_dir: Path) -> str:
    """``tracking_uri``, else ``MLFLOW_TRACKING_URI``, else the state directory's SQLite store."""
    return tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or \
        f"sqlite:///{(state_dir / 'mlflow.db').resolve()}"


def open_mlflow_client(uri: str) -> Any:
    """``mlflow.MlflowClient`` on ``uri``; any store but an existing SQLite file is probed first
    (the probe costs about 2 s; a bad SQLite file fails at the first read, and the caller asks
    :func:`~dbspec.tracking.stores.check_tracking_server` why then).

    Raises:
        TrackingError: the store cannot be used.
    """
    import mlflow

    from dbspec.tracking.mlflow_tracking import quiet_mlflow
    from dbspec.tracking.stores import check_tracking_server, sqlite_path

    quiet_mlflow()
    database = sqlite_path(uri)
    if database is None or not database.is_file():
        check_tracking_server(uri, must_exist=True)
    return mlflow.MlflowClient(tracking_uri=uri)

