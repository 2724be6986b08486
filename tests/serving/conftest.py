"""A registered model to serve (two versions of the diabetes smoke model) and a real server.

The servers are real ``dbspec serve`` processes on 127.0.0.1, driven over HTTP with httpx.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple, Optional

import httpx
import pytest

from tests.conftest import ROOT, checkout_env, run_in_process

NAME = "diabetes_predictor_smoke"
FEATURES = ["age", "sex", "bmi", "bp", "s1", "s2", "s3", "s4", "s5", "s6"]
TOKEN = "test-token-7f3a"


class Registered(NamedTuple):
    workdir: Path
    tracking_uri: str
    name: str


@pytest.fixture(scope="session")
def registered(tmp_path_factory) -> Registered:
    """Two versions of the diabetes smoke model in a fresh SQLite store (v2 trained with a
    different learning rate, so the two predict differently)."""
    workdir = tmp_path_factory.mktemp("serving")
    env = {"MLFLOW_TRACKING_URI": ""}
    for extra in ([], ["--set", "training.optimizer.lr=0.03"]):
        result = run_in_process("run", str(ROOT / "specs" / "diabetes.yaml"), "--smoke",
                                "--quiet", *extra, cwd=workdir, env=env, timeout=600)
        assert result.returncode == 0, result.stderr
    return Registered(workdir, f"sqlite:///{workdir / '.dbspec' / 'mlflow.db'}", NAME)


class Server(NamedTuple):
    process: subprocess.Popen
    url: str
    log: Path

    def stop(self, sig=signal.SIGINT, timeout: float = 60) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        return self.process.wait(timeout=timeout)

    def output(self) -> str:
        return self.log.read_text()


def start_server(registered: Registered, *args: str, token: Optional[str] = TOKEN,
                 log: Path, env: Optional[dict] = None) -> Server:
    """``dbspec serve ARGS --port 0`` (``env``: more environment); waits for its 'serving ...
    on URL' line."""
    env = checkout_env({"MLFLOW_TRACKING_URI": registered.tracking_uri, **(env or {})})
    env.pop("DBSPEC_TOKEN", None)
    if token is not None:
        env["DBSPEC_TOKEN"] = token
    handle = log.open("w")
    process = subprocess.Popen([sys.executable, "-m", "dbspec", "serve", *args, "--port", "0"],
                               cwd=registered.workdir, env=env, stdout=handle,
                               stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        found = re.search(r"on (http://\S+)", log.read_text())
        if found:
            url = found.group(1)
            for _ in range(100):
                try:
                    httpx.get(url + "/ping", timeout=5)
                    return Server(process, url, log)
                except httpx.TransportError:
                    time.sleep(0.1)
        if process.poll() is not None:
            break
        time.sleep(0.1)
    process.kill()
    raise AssertionError(f"dbspec serve did not start:\n{log.read_text()}")


@pytest.fixture
def serve(registered, tmp_path):
    """Start servers for a test; each is stopped (and must exit cleanly) at the end."""
    started: list[Server] = []

    def start(*args: str, token: Optional[str] = TOKEN, env: Optional[dict] = None) -> Server:
        server = start_server(registered, *args, token=token,
                              log=tmp_path / f"serve{len(started)}.log", env=env)
        started.append(server)
        return server

    yield start
    for server in started:
        if server.process.poll() is None:
            server.stop()


AUTH = {"Authorization": f"Bearer {TOKEN}"}
