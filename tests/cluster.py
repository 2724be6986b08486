"""A real Spark standalone cluster on 127.0.0.1 for the tests: one master, two 1-core workers.

pip's pyspark has ``bin/spark-class`` but no ``sbin/start-*.sh``, so the master and the workers
are started as ``spark-class org.apache.spark.deploy.{master.Master,worker.Worker}``. Each
worker runs in its own mount namespace (``unshare -m``) with an empty tmpfs mounted over the
directories of the driver side — pytest's temporary root, where every test's project, state
dir and the MLflow server's store live — so a worker sees only what a second machine would:
the installed software (Python, pyspark, dbspec), the shared directory, and the network.
That needs root (CI runs as root); where the mount is refused the tests skip with the reason.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.servers import free_port


def spark_home() -> str:
    import pyspark

    return os.path.dirname(pyspark.__file__)


@dataclass
class SparkCluster:
    """A running standalone cluster: its master URL, the worker processes and their dirs."""

    master: str
    master_ui: int
    shared_dir: Path
    hidden: list[str]
    root: Path
    env: dict
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)

    def worker_pids(self) -> list[int]:
        return [p.pid for name, p in self.processes.items() if name.startswith("worker")]

    def alive_workers(self) -> int:
        import json

        with urllib.request.urlopen(f"http://127.0.0.1:{self.master_ui}/json/", timeout=5) as r:
            try:
                state = json.load(r)
            except ValueError:  # the UI answers its HTML page until it is fully up
                return 0
        return sum(1 for w in state.get("workers", []) if w.get("state") == "ALIVE")

    def kill_worker(self, name: str) -> None:
        """``kill -9`` a worker and every process it started (its executor, Python workers,
        torchrun ranks), as when a node disappears."""
        process = self.processes[name]
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait(timeout=10)

    def worker_running(self, pid: int) -> str:
        """The name of the worker that started process ``pid`` (a rank, an executor...).

        Found through the parent chain: torchrun starts its ranks in sessions of their own, so
        a rank's process group is not its worker's."""
        workers = {p.pid: name for name, p in self.processes.items() if name.startswith("worker")}
        while pid > 1:
            if pid in workers:
                return workers[pid]
            with open(f"/proc/{pid}/stat", encoding="utf-8") as stat:
                pid = int(stat.read().rsplit(")", 1)[1].split()[1])  # the parent's PID
        raise LookupError("no worker of this cluster started that process")

    def start_worker(self, name: str) -> None:
        work = self.root / name
        work.mkdir(exist_ok=True)
        java = [os.path.join(spark_home(), "bin", "spark-class"),
                "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--cores", "1",
                "--memory", "3g", "--work-dir", str(work), "--webui-port", str(free_port()),
                self.master]
        mounts = " && ".join(f"mount -t tmpfs -o size=1m tmpfs {_quote(d)}" for d in self.hidden)
        command = f"{mounts} && exec {' '.join(_quote(a) for a in java)}"
        log = open(self.root / f"{name}.log", "ab")
        self.processes[name] = subprocess.Popen(
            ["unshare", "-m", "--propagation", "private", "bash", "-c", command],
            env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_for_workers(self, count: int, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if self.alive_workers() >= count:
                    return
            except OSError:
                pass
            for name, process in self.processes.items():
                if process.poll() is not None:
                    raise RuntimeError(f"{name} exited ({process.returncode}):\n"
                                       + self.log_tail(name))
            time.sleep(0.5)
        raise RuntimeError(f"{count} workers did not register in {timeout:.0f}s:\n"
                           + "\n".join(self.log_tail(n) for n in self.processes))

    def wait_until_idle(self, timeout: float = 180) -> None:
        """Until no application runs and every worker's cores are free again (a stopped
        application's executors take a moment to exit), so the next one gets both workers.

        The bound is generous, a wait, not a timing assertion. (The 60 s that once ran out in a
        full run was not a slow exit: the worker the DDP test kills stays listed, DEAD, with the
        core it had in use; only ALIVE workers count now.)"""
        import json

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.master_ui}/json/",
                                            timeout=5) as r:
                    state = json.load(r)
                # a killed worker stays listed, DEAD, with the cores it had in use
                if not state.get("activeapps") and all(
                        w.get("coresused", 0) == 0 for w in state.get("workers", [])
                        if w.get("state") == "ALIVE"):
                    return
            except (OSError, ValueError):
                pass
            time.sleep(0.25)
        raise RuntimeError(f"the cluster was still busy {timeout:.0f}s after its application "
                           "stopped")

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = self.root / f"{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) \
            if path.exists() else ""

    def stop(self) -> None:
        for process in self.processes.values():
            try:
                os.killpg(process.pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
        for process in self.processes.values():
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)


def _quote(text: str) -> str:
    import shlex

    return shlex.quote(str(text))


def mount_namespaces_work(hidden: str) -> str:
    """An empty string when a tmpfs can be mounted over ``hidden`` in a new mount namespace,
    else the reason it cannot."""
    if shutil.which("unshare") is None:
        return "unshare(1) is not installed"
    probe = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "bash", "-c",
         f"mount -t tmpfs tmpfs {_quote(hidden)} && test -z \"$(ls -A {_quote(hidden)})\""],
        capture_output=True, text=True)
    return "" if probe.returncode == 0 else \
        f"cannot hide the driver's directories from workers: {probe.stderr.strip() or 'refused'}"


def _tools_first(root: Path) -> str:
    """A PATH entry (with its ':') holding only the ``ninja`` this process would run, or ''.

    DeepSpeed JIT-builds its CPU communication op with whatever ``ninja`` the PATH finds, into
    one per-machine cache (~/.cache/torch_extensions). Two ninja versions (pip's 1.13, a
    system's 1.11) record their build commands differently, so a cache built by one is rebuilt
    whole by the other (a minute or more on 2 cores, measured): ranks on the workers use the
    same ninja as ranks started from this process, or each DeepSpeed test rebuilds the op.
    """
    ninja = shutil.which("ninja")
    if ninja is not None and f"{os.sep}shims{os.sep}" in ninja:  # pyenv: runs the env's own
        ninja = shutil.which("ninja", path=os.path.dirname(sys.executable)) or ninja
    if ninja is None:
        return ""
    tools = root / "tools"
    tools.mkdir(exist_ok=True)
    (tools / "ninja").symlink_to(os.path.realpath(ninja))
    return f"{tools}:"


def launch_cluster(root: Path, hidden: list[str], workers: int = 2) -> SparkCluster:
    """Start a master and ``workers`` 1-core workers that cannot see ``hidden``; no waiting."""
    port, ui = free_port(), free_port()
    shared = Path(tempfile.mkdtemp(prefix="dbspec-shared-", dir=root))
    env = {**os.environ, "SPARK_HOME": spark_home(), "SPARK_LOCAL_IP": "127.0.0.1",
           "SPARK_NO_DAEMONIZE": "1",
           # as on a fresh node, `python3` on the PATH is the system's, which has no dbspec;
           # the environment's own tools come after it
           "PATH": _tools_first(root) + "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin:"
                   + os.path.dirname(sys.executable),
           # the driver's interpreter is installed on every node (same path), but nothing
           # tells the executors to use it: dbspec chooses it, so PYSPARK_PYTHON is unset
           "SPARK_WORKER_OPTS": "-Dspark.worker.cleanup.enabled=false"}
    env.pop("PYSPARK_PYTHON", None)
    cluster = SparkCluster(f"spark://127.0.0.1:{port}", ui, shared, hidden, root, env)
    master = [os.path.join(spark_home(), "bin", "spark-class"),
              "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
              "--webui-port", str(ui)]
    log = open(root / "master.log", "ab")
    cluster.processes["master"] = subprocess.Popen(master, env=env, stdout=log,
                                                   stderr=subprocess.STDOUT,
                                                   start_new_session=True)
    for index in range(workers):
        cluster.start_worker(f"worker-{index}")
    return cluster


def start_cluster(root: Path, hidden: list[str], workers: int = 2) -> SparkCluster:
    """Start a master and ``workers`` 1-core workers that cannot see ``hidden``; wait for them."""
    return _registered(launch_cluster(root, hidden, workers), workers)


def _registered(cluster: SparkCluster, workers: int = 2) -> SparkCluster:
    try:
        cluster.wait_for_workers(workers)
    except Exception:
        cluster.stop()
        raise
    return cluster


_prestarted: list[SparkCluster] = []


def prestart_cluster(tmp_path_factory) -> None:
    """Launch the session's cluster now, when collection shows a test will need it: its JVMs
    start (20-40 s) beside the tests that run first, and ``spark_cluster`` waits for them.
    Where workers cannot be hidden nothing is launched (``spark_cluster`` skips)."""
    hidden = str(tmp_path_factory.getbasetemp())
    if not mount_namespaces_work(hidden):
        _prestarted.append(launch_cluster(Path(tempfile.mkdtemp(prefix="dbspec-cluster-")),
                                          [hidden]))


def stop_prestarted_cluster() -> None:
    """At the session's end: stop a launched cluster no test claimed (say, after ``-x``)."""
    while _prestarted:
        cluster = _prestarted.pop()
        cluster.stop()
        shutil.rmtree(cluster.root, ignore_errors=True)


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory):
    """A Spark standalone cluster whose workers cannot see pytest's temporary root (launched
    once the collected tests show one needs it, else on first use)."""
    hidden = str(tmp_path_factory.getbasetemp())
    reason = mount_namespaces_work(hidden)
    if reason:
        pytest.skip(reason)
    if _prestarted:
        cluster = _registered(_prestarted.pop())
        root = cluster.root
    else:
        root = Path(tempfile.mkdtemp(prefix="dbspec-cluster-"))  # outside the hidden root
        cluster = start_cluster(root, [hidden])
    yield cluster
    cluster.stop()
    shutil.rmtree(root, ignore_errors=True)


def worker_sees(cluster: SparkCluster, path: Path) -> bool:
    """Whether a process in a worker's mount namespace sees ``path`` (a check on the check)."""
    pid = cluster.processes["worker-0"].pid
    probe = subprocess.run(["nsenter", "-t", str(pid), "-m", "test", "-e", str(path)])
    return probe.returncode == 0


if __name__ == "__main__":  # a manual check: python -m tests.cluster
    base = Path(tempfile.mkdtemp(prefix="dbspec-hidden-"))
    print(mount_namespaces_work(str(base)) or "mount namespaces work")
    started = start_cluster(Path(tempfile.mkdtemp(prefix="dbspec-cluster-")), [str(base)])
    print(started.master, started.alive_workers(), "workers; shared", started.shared_dir)
    (base / "x").write_text("x")
    print("worker sees hidden file:", worker_sees(started, base / "x"))
    started.stop()
    sys.exit(0)
