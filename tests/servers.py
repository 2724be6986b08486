"""Real servers for tests that need more than an in-process store.

``mlflow_server`` is one ``mlflow server`` process per test session: a SQLite backend and
artifacts proxied through the server (``--serve-artifacts``) into its own directory, so a
client needs nothing but the URL, as with a team server or Databricks.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import NamedTuple

import pytest

_START_SECONDS = 120  # a cold start on a loaded 2-core machine takes ~10-30 s


class MlflowServer(NamedTuple):
    """A running tracking server: its URL and the directory its artifacts land in."""

    uri: str
    artifacts: Path
    log: Path


def free_port() -> int:
    """A TCP port nothing listens on right now (the server binds it a moment later)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _healthy(uri: str) -> bool:
    try:
        with urllib.request.urlopen(f"{uri}/health", timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def start_mlflow_server(root: Path) -> tuple[subprocess.Popen, MlflowServer]:
    """Start ``mlflow server`` with its store and artifacts under ``root``; wait for /health.

    Raises:
        RuntimeError: the server exited or did not answer in time (with its output).
    """
    return wait_for_mlflow_server(*launch_mlflow_server(root))


def launch_mlflow_server(root: Path) -> tuple[subprocess.Popen, MlflowServer]:
    """Start ``mlflow server`` with its store and artifacts under ``root``; no waiting."""
    artifacts = root / "artifacts"
    artifacts.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = root / "server.log"
    handle = log.open("w")
    env = {**os.environ, "MLFLOW_TRACKING_URI": "",
           # MLflow's job execution (GenAI judges, trace rollups), which dbspec never uses: on
           # by default, it starts a huey runner and its workers beside the server, measured 8
           # more processes that double the start (15-25 s -> 40 s on 2 loaded cores) and
           # compete with the tests for the CPU all session
           "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    # a session of its own, so the uvicorn workers it spawns are stopped with it
    process = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server",
         "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
         "--artifacts-destination", str(artifacts), "--serve-artifacts",
         "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        cwd=root, env=env, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True)
    return process, MlflowServer(f"http://127.0.0.1:{port}", artifacts, log)


def wait_for_mlflow_server(process: subprocess.Popen,
                           server: MlflowServer) -> tuple[subprocess.Popen, MlflowServer]:
    """Until a launched server answers /health; stopped and raised about if it does not."""
    deadline = time.monotonic() + _START_SECONDS
    while time.monotonic() < deadline:
        if _healthy(server.uri):
            return process, server
        if process.poll() is not None:
            break
        time.sleep(0.25)
    stop_mlflow_server(process)
    state = f"exited with {process.returncode}" if process.returncode is not None else \
        f"did not answer {server.uri}/health within {_START_SECONDS} s"
    raise RuntimeError(f"mlflow server {state}; its output:\n{server.log.read_text()[-4000:]}")


def stop_mlflow_server(process: subprocess.Popen) -> None:
    """SIGTERM the server's process group (it and its workers); SIGKILL what is left."""
    _signal_group(process, signal.SIGTERM)
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        pass
    _signal_group(process, signal.SIGKILL)  # a worker that outlived its parent
    process.wait(timeout=20)


def _signal_group(process: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(process.pid, sig)
    except ProcessLookupError:
        pass  # the whole group is gone already


_prestarted: list[tuple[subprocess.Popen, MlflowServer]] = []


def prestart_mlflow_server(tmp_path_factory) -> None:
    """Launch the session's server now, when collection shows a test will need it: it starts
    (10-40 s) beside the tests that run first, and ``mlflow_server`` waits for it."""
    _prestarted.append(launch_mlflow_server(tmp_path_factory.mktemp("mlflow-server")))


def stop_prestarted_mlflow_server() -> None:
    """At the session's end: stop a launched server no test claimed (say, after ``-x``)."""
    while _prestarted:
        stop_mlflow_server(_prestarted.pop()[0])


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory) -> MlflowServer:
    """A real ``mlflow server`` on 127.0.0.1 for the whole session (launched once the collected
    tests show one needs it, else on first use).

    ``.uri`` is its ``http://127.0.0.1:PORT``; ``.artifacts`` its ``--artifacts-destination``,
    where everything clients log must end up (they never write there themselves).
    """
    if _prestarted:
        process, server = wait_for_mlflow_server(*_prestarted.pop())
    else:
        process, server = start_mlflow_server(tmp_path_factory.mktemp("mlflow-server"))
    try:
        yield server
    finally:
        stop_mlflow_server(process)


@contextlib.contextmanager
def mlflow_models_serve(uri: str, root: Path, env: dict):
    """``mlflow models serve -m URI`` on a free 127.0.0.1 port (this Python, one worker, its
    log in ``root``), waited for until ``/ping`` answers; yields the ``/invocations`` URL and
    stops the server (its own session: the uvicorn worker MLflow starts stops with it)."""
    import httpx

    from tests.conftest import checkout_env

    port, log = free_port(), root / "serve.log"
    with log.open("w") as handle:
        process = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "models", "serve", "-m", uri, "--env-manager",
             "local", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
            env=checkout_env(env), cwd=root, stdout=handle, stderr=subprocess.STDOUT,
            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                httpx.get(url + "/ping", timeout=2).raise_for_status()
                break
            except httpx.HTTPError:
                assert process.poll() is None, log.read_text()
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.5)
        yield url + "/invocations"
    finally:
        stop_mlflow_server(process)
