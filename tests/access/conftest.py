"""A real ``mlflow server --app-name basic-auth`` for the roles tests, and its users.

One server per session, on 127.0.0.1, with its own tracking and auth databases in a temporary
directory. ``default_permission`` is NO_PERMISSIONS, as docs/howto/roles.md recommends: a user sees only
what a role (or having created it) gives.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

from tests.servers import MlflowServer, free_port, stop_mlflow_server, wait_for_mlflow_server

ADMIN = ("admin", "admin-password-1")
#: Users the server knows: spec roles name the first three; dave holds no role.
USERS = {"carol@example.com": "carol-password-1", "bob@example.com": "bob-password-1",
         "alice@example.com": "alice-password-1", "dave@example.com": "dave-password-1"}
MODEL = "roles_regressor"
EXPERIMENT = "roles-test"
SPEC = f"""\
name: roles-regressor
data:
  source: {{kind: sklearn, name: diabetes}}
  task: regression
  preprocessing: [{{standard_scale: all}}]
model:
  layers: [{{linear: {{out: 8}}}}, relu, {{linear: {{out: 1}}}}]
training: {{optimizer: {{name: adam, lr: 0.01}}, epochs: 2}}
tracking: {{experiment: {EXPERIMENT}, system_metrics: false, monitor: false}}
registry:
  name: {MODEL}
  promotion:
    - {{alias: staging, gates: [{{metric: test_rmse, max: 100000}}]}}
    - {{alias: production, gates: [{{metric: test_rmse, max: 100000}}], approval: required}}
roles:
  admin: [user:carol@example.com]
  data_scientist: [user:bob@example.com]
  analyst: [user:alice@example.com, group:analysts]
"""


class AuthServer(NamedTuple):
    """The running server: its URL and directories."""

    uri: str
    root: Path

    def env(self, user: str, password: str = "") -> dict[str, str]:
        """The environment of a dbspec command run as ``user``."""
        password = password or (ADMIN[1] if user == ADMIN[0] else USERS[user])
        return {"MLFLOW_TRACKING_URI": self.uri, "MLFLOW_TRACKING_USERNAME": user,
                "MLFLOW_TRACKING_PASSWORD": password,
                # a refusal is final; MLflow's default retries only make tests slow
                "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"}


def launch_auth_server(root: Path) -> tuple[subprocess.Popen, MlflowServer]:
    """``mlflow server --app-name basic-auth`` with its stores under ``root``; no waiting."""
    (root / "artifacts").mkdir(parents=True, exist_ok=True)
    config = root / "basic_auth.ini"
    config.write_text(
        "[mlflow]\n"
        "default_permission = NO_PERMISSIONS\n"
        f"database_uri = sqlite:///{root / 'auth.db'}\n"
        f"admin_username = {ADMIN[0]}\n"
        f"admin_password = {ADMIN[1]}\n"
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n")
    port = free_port()
    log = root / "server.log"
    env = {**os.environ, "MLFLOW_TRACKING_URI": "", "MLFLOW_AUTH_CONFIG_PATH": str(config),
           "MLFLOW_FLASK_SERVER_SECRET_KEY": "dbspec-roles-tests",
           "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}  # see tests/servers.py
    for name in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        env.pop(name, None)
    process = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--app-name", "basic-auth",
         "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
         "--artifacts-destination", str(root / "artifacts"), "--serve-artifacts",
         "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        cwd=root, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
        start_new_session=True)
    return process, MlflowServer(f"http://127.0.0.1:{port}", root / "artifacts", log)


@pytest.fixture(scope="session")
def auth_server(tmp_path_factory) -> AuthServer:
    """The session's basic-auth server, with :data:`USERS` created by the admin."""
    pytest.importorskip("flask_wtf", reason="MLflow's basic-auth app needs Flask-WTF")
    root = tmp_path_factory.mktemp("auth-server")
    process, server = wait_for_mlflow_server(*launch_auth_server(root))
    try:
        running = AuthServer(server.uri, root)
        with as_user(running, *ADMIN):
            from mlflow.server.auth.client import AuthServiceClient

            client = AuthServiceClient(server.uri)
            for user, password in USERS.items():
                client.create_user(user, password)
        yield running
    finally:
        stop_mlflow_server(process)


class as_user:
    """Within: this process talks to ``server`` as ``user`` (MLflow reads the login from the
    environment on every request)."""

    def __init__(self, server: AuthServer, user: str, password: str = ""):
        self.env = server.env(user, password)

    def __enter__(self):
        self.saved = {name: os.environ.get(name) for name in self.env}
        os.environ.update(self.env)
        return self

    def __exit__(self, *exc):
        for name, value in self.saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def admin_permission(server: AuthServer, user: str, kind: str, resource: str) -> str:
    """``user``'s permission on a resource, as the MLflow admin reads it back."""
    from mlflow.server.auth.client import AuthServiceClient

    with as_user(server, *ADMIN):
        return AuthServiceClient(server.uri).get_user_permission(user, kind, resource).permission
