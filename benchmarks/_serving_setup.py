"""Shared set-up of the serving benchmarks (``serve_vs_mlflow.py``, ``serve_soak.py``,
``serve_cold_start.py``).

Trains and registers a spec's model in a fresh working directory (its own SQLite MLflow store),
as a user would from a shell, and starts scoring servers as child processes: each in its own
process group (``mlflow models serve`` runs uvicorn as a child), its output in a log file, ready
once ``GET /ping`` answers 200. Not a benchmark itself: imported by the scripts, which run as
``python benchmarks/X.py`` and so find this module on ``sys.path``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import NamedTuple, Optional

ROOT = Path(__file__).resolve().parent.parent
DIABETES_SPEC = ROOT / "specs" / "diabetes.yaml"
TOKEN = "bench-token"


class Trained(NamedTuple):
    """A registered model version in a working directory's MLflow store."""

    workdir: Path
    name: str
    version: str
    tracking_uri: str

    @property
    def uri(self) -> str:
        return f"models:/{self.name}/{self.version}"


def base_env() -> dict[str, str]:
    """This process's environment without MLflow URIs that would point the runs elsewhere."""
    env = dict(os.environ)
    for key in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI"):
        env.pop(key, None)
    return env


def train(spec: Path, workdir: Path) -> Trained:
    """``dbspec run SPEC --quiet`` in ``workdir``; the version it registered."""
    from dbspec.spec.loader import load_spec

    loaded = load_spec(str(spec)).spec
    if loaded.registry is None:
        raise SystemExit(f"{spec} registers no model: nothing to serve")
    name = loaded.registry.name
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "dbspec", "run", str(spec), "--quiet"],
                            cwd=workdir, env=base_env(), capture_output=True, text=True,
                            check=False)
    if result.returncode != 0:
        raise SystemExit(f"dbspec run failed:\n{result.stdout}\n{result.stderr}")
    models = subprocess.run([sys.executable, "-m", "dbspec", "models", name, "--format", "json"],
                            cwd=workdir, env=base_env(), capture_output=True, text=True,
                            check=False)
    if models.returncode != 0:
        raise SystemExit(f"dbspec models {name} failed:\n{models.stdout}\n{models.stderr}")
    versions = [v["version"] for v in json.loads(models.stdout)["versions"]]
    if not versions:
        raise SystemExit(f"dbspec run registered no version of {name}:\n{result.stdout}")
    version = max(versions, key=int)
    print(f"trained and registered {name} v{version} in {time.perf_counter() - started:.1f} s "
          f"({workdir})", flush=True)
    return Trained(workdir, name, version,
                   f"sqlite:///{(workdir / '.dbspec' / 'mlflow.db').resolve()}")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """A scoring server child process on ``127.0.0.1:port``."""

    def __init__(self, label: str, command: list[str], port: int, *, cwd: Path,
                 env: dict[str, str], log: Path):
        self.label = label
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log = log
        self.stopped = ""  # how stop() ended it, for the report
        self._log_file = open(log, "wb")
        self.started = time.perf_counter()  # just before exec: cold starts count from here
        self.process = subprocess.Popen(command, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                        stdout=self._log_file, stderr=subprocess.STDOUT,
                                        start_new_session=True)

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def wait_ready(self, timeout: float = 180.0, poll_s: float = 0.25) -> float:
        """Until ``GET /ping`` answers 200; seconds since exec. A clear error if the process
        exits or time runs out. ``poll_s``: the pause between tries (the timing's resolution)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SystemExit(f"{self.label} exited with code {self.process.returncode} "
                                 f"before answering /ping; its log ({self.log}):\n"
                                 f"{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/ping", timeout=2) as response:
                    if response.status == 200:
                        return time.perf_counter() - self.started
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(poll_s)
        raise SystemExit(f"{self.label} did not answer {self.url}/ping within {timeout:.0f} s; "
                         f"its log ({self.log}):\n{self.log_tail()}")

    def rss_bytes(self) -> int:
        """Resident memory of the server's whole session (``mlflow models serve`` scores in a
        child process): the sum of ``VmRSS`` over every process in it."""
        total = 0
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                session = int(stat.rsplit(")", 1)[1].split()[3])  # field 6, after the name
                if session != self.process.pid:
                    continue
                for line in (entry / "status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
            except (OSError, ValueError, IndexError):
                continue  # a process that ended meanwhile
        return total

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the server's process group (the server and any children)."""
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signum)
            except ProcessLookupError:
                pass

    def wait(self, timeout: float) -> Optional[int]:
        """The exit code, or None if the process is still running after ``timeout`` s."""
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, timeout: float = 30.0) -> None:
        """Terminate, wait, kill: the whole process group, whatever state it is in."""
        started = time.monotonic()
        try:
            if self.process.poll() is None:
                self.signal(signal.SIGTERM)
                if self.wait(timeout) is None:
                    self.signal(signal.SIGKILL)
                    self.process.wait()
                    self.stopped = f"killed: no exit {timeout:g} s after SIGTERM"
                else:
                    self.stopped = (f"exit {self.process.returncode} "
                                    f"{time.monotonic() - started:.1f} s after SIGTERM")
            else:
                self.stopped = f"had exited with code {self.process.returncode}"
            try:  # children left behind by a parent that already exited
                os.killpg(self.process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        finally:
            self._log_file.close()


def start_dbspec(trained: Trained, port: int, log: Path, *extra: str,
                 token: Optional[str] = TOKEN) -> Server:
    """``dbspec serve models:/NAME/VERSION --port PORT [extra]``, token in ``DBSPEC_TOKEN``."""
    env = base_env()
    env["MLFLOW_TRACKING_URI"] = trained.tracking_uri
    if token is not None:
        env["DBSPEC_TOKEN"] = token
    command = [sys.executable, "-m", "dbspec", "serve", trained.uri, "--host", "127.0.0.1",
               "--port", str(port), *extra]
    return Server("dbspec serve", command, port, cwd=trained.workdir, env=env, log=log)


def start_mlflow(trained: Trained, port: int, log: Path) -> Server:
    """``mlflow models serve -m models:/NAME/VERSION --env-manager local`` (one uvicorn worker)."""
    env = base_env()
    env["MLFLOW_TRACKING_URI"] = trained.tracking_uri
    command = [sys.executable, "-m", "mlflow", "models", "serve", "-m", trained.uri,
               "--env-manager", "local", "-h", "127.0.0.1", "-p", str(port)]
    return Server("mlflow models serve", command, port, cwd=trained.workdir, env=env, log=log)


def diabetes_rows(count: int, start: int = 0) -> tuple[list[str], list[list[float]]]:
    """Feature names and ``count`` real diabetes rows (scaled as sklearn ships them), wrapping."""
    from sklearn.datasets import load_diabetes

    data = load_diabetes()
    n = len(data.data)
    rows = [data.data[(start + i) % n].tolist() for i in range(count)]
    return list(data.feature_names), rows
