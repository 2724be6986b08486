"""Shared test helpers."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ASSETS = Path(__file__).resolve().parent / "assets"
SPECS = sorted((ROOT / "specs").glob("*.yaml"))


def checkout_env(env: dict | None = None) -> dict:
    """The environment for a ``python -m dbspec`` subprocess that must run this checkout."""
    full = {**os.environ, **(env or {})}
    full["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), full.get("PYTHONPATH")]))
    return full


def run_cli(*args: str, cwd: Path = ROOT, env: dict | None = None,
            timeout: int = 120) -> subprocess.CompletedProcess:
    """Run ``python -m dbspec ARGS`` in a fresh process, as a user would."""
    full_env = checkout_env(env)  # this checkout's dbspec, whatever is installed
    return subprocess.run([sys.executable, "-m", "dbspec", *args], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def write_spec(tmp_path):
    """Write YAML text to a spec file in a temp dir and return its path."""

    def write(text: str, name: str = "spec.yaml") -> str:
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        return str(path)

    return write


MINIMAL = """\
name: minimal
data: {source: {kind: sklearn, name: diabetes}, task: regression}
model:
  layers:
    - linear: {out: 8}
    - relu
    - linear: {out: 1}
"""


def run_main(*args: str) -> tuple[int, str, str]:
    """Run the CLI in this process; returns (exit code, stdout, stderr)."""
    import contextlib
    import io

    from dbspec.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


class _StillRunning(BaseException):
    """Raised into a command run by :func:`run_in_process` that outlives its timeout (a
    BaseException, so the command's own ``except Exception`` does not swallow it)."""


def run_in_process(*args: str, cwd: Path = ROOT, env: dict | None = None,
                   timeout: int = 120) -> subprocess.CompletedProcess:
    """What :func:`run_cli` returns, from the CLI's ``main`` in this process.

    For tests of what a command says and returns, where the process itself is not what is
    tested: no interpreter start and no second import of torch and MLflow (seconds a command).
    As for :func:`run_cli`, ``env`` is laid over this process's environment and ``cwd`` is the
    working directory; both are put back afterwards, with MLflow's process-wide tracking URI
    (which ``mlflow.set_tracking_uri`` also writes into the environment). A usage error
    (argparse's ``SystemExit``) is its exit code; a command still running after ``timeout``
    seconds (a refusal that no longer refuses and serves instead) fails the test, as
    run_cli's timeout would.
    """
    import contextlib
    import io
    import signal

    from dbspec.cli import main

    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    out, err = io.StringIO(), io.StringIO()

    def still_running(signum, frame):
        raise _StillRunning()

    with mlflow_uris_kept(cleared=True):  # a fresh process has none set
        previous_handler = signal.signal(signal.SIGALRM, still_running)
        try:
            os.environ.update(env or {})
            os.chdir(cwd)
            signal.alarm(timeout)
            try:
                with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                    try:
                        code = main(list(args))
                    except SystemExit as exc:  # argparse: 2 for a usage error, 0 for --help
                        code = 0 if exc.code is None else exc.code if isinstance(exc.code, int) \
                            else 1
            except _StillRunning:
                raise AssertionError(f"dbspec {' '.join(args)} still ran after {timeout} s:\n"
                                     f"{err.getvalue()[-3000:]}") from None
            finally:
                signal.alarm(0)
        finally:
            signal.signal(signal.SIGALRM, previous_handler)
            os.chdir(saved_cwd)
            for name in set(os.environ) - set(saved_env):
                del os.environ[name]
            os.environ.update(saved_env)
    return subprocess.CompletedProcess(["dbspec", *args], code, out.getvalue(), err.getvalue())


_MLFLOW_ENV = ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")
# where MLflow keeps the URIs that ``set_tracking_uri`` / ``set_registry_uri`` set; they win
# over the environment
_MLFLOW_GLOBALS = {"mlflow.tracking._tracking_service.utils": "_tracking_uri",
                   "mlflow.tracking._model_registry.utils": "_registry_uri"}


@contextlib.contextmanager
def mlflow_uris_kept(*, cleared: bool = False):
    """MLflow's tracking and registry URIs, in the environment and in MLflow's process-wide
    globals, as they were on entering once the block ends; ``cleared``: the globals unset
    meanwhile, as a fresh process has them."""
    env = {name: os.environ.get(name) for name in _MLFLOW_ENV}
    uris = {module: getattr(sys.modules.get(module), name, None)
            for module, name in _MLFLOW_GLOBALS.items()}
    if cleared:
        _set_mlflow_globals(dict.fromkeys(uris))
    try:
        yield
    finally:
        for name, value in env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        _set_mlflow_globals(uris)


def _set_mlflow_globals(values: dict) -> None:
    for module, value in values.items():
        if module in sys.modules:  # one imported later was unset before: None is its state
            setattr(sys.modules[module], _MLFLOW_GLOBALS[module], value)


@contextlib.contextmanager
def mlflow_pointed_at(uri: str):
    """MLflow pointed at the store ``uri`` through the environment alone, as a user's process
    is, whatever an earlier test in this worker set (the globals win over the environment, so
    they are cleared); all of it put back on leaving."""
    import importlib

    for module in _MLFLOW_GLOBALS:
        importlib.import_module(module)
    with mlflow_uris_kept(cleared=True):
        os.environ["MLFLOW_TRACKING_URI"] = uri
        os.environ.pop("MLFLOW_REGISTRY_URI", None)
        yield


@pytest.fixture(autouse=True)
def _mlflow_uris_restored():
    """Each test leaves MLflow's tracking and registry URIs as it found them, in the
    environment and in MLflow's process-wide globals: a leaked ``mlflow.set_registry_uri`` sent
    every later test's registrations to one store, and a leaked ``set_tracking_uri`` made a
    later ``load_model`` read another store than its environment named, in whatever order
    pytest-xdist ran them."""
    with mlflow_uris_kept():
        yield


@pytest.fixture(autouse=True, scope="module")
def _mlflow_uris_restored_per_module():
    """The same for each test module: a module-scoped fixture that runs dbspec in this process
    (which sets the URIs, as a run's process does) leaves them set for its module's tests
    only, not for whatever module this worker runs next."""
    with mlflow_uris_kept():
        yield


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A fresh project directory: its own .dbspec state and MLflow store."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    """One local Spark session per test module (local[2], no UI, its own warehouse); code
    that asks for the active session gets this one."""
    from pyspark.sql import SparkSession

    warehouse = tmp_path_factory.mktemp("warehouse")
    session = (SparkSession.builder.master("local[2]").appName("dbspec-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.warehouse.dir", str(warehouse)).getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


from tests.cluster import spark_cluster  # noqa: E402,F401  (a standalone cluster, once per session)
from tests.servers import mlflow_server  # noqa: E402,F401  (a real mlflow server, once per session)


# The session's servers start in the background as soon as collection shows that a test will
# need them (the tracking tests ask for the server through their `store` fixture), so their
# start (the MLflow server 10-40 s, the cluster's JVMs 20-40 s, on 2 loaded cores) overlaps the
# tests that run first instead of adding to the first test that uses them. Still one of each per
# session, waited for by the fixtures; a run that needs neither starts neither.
_NEEDS_SERVER = {"mlflow_server", "store"}


#: Test files that share an expensive session fixture run in one pytest-xdist worker
#: (``-n 2 --dist loadgroup``, as CI runs them): the cluster's, the serving tests' two
#: trained model versions (``tests/serving/conftest.py``) and the fine-tuned model
#: (``tests/finetune/conftest.py``). Every other file is its own group, so module fixtures
#: (a Spark session, a trained model) start once as well.
_GROUPS = {"tests/spark/test_cluster.py": "cluster",
           "tests/spark/test_cluster_shared_app.py": "cluster",
           "tests/serving/": "serving",
           "tests/finetune/test_run.py": "finetune",
           "tests/finetune/test_serving.py": "finetune"}


def _xdist_group(path: str) -> str:
    return next((group for prefix, group in _GROUPS.items() if path.startswith(prefix)), path)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the marks
def pytest_collection_modifyitems(config, items):
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    for item in items:
        path = Path(str(item.fspath)).resolve().relative_to(ROOT).as_posix()
        item.add_marker(pytest.mark.xdist_group(_xdist_group(path)))


def pytest_collection_finish(session):
    if session.config.option.collectonly or not session.items:
        return
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return  # every worker collects every test: the fixtures start where they are used
    from tests import cluster, servers

    needed = set().union(*(getattr(item, "fixturenames", ()) for item in session.items))
    factory = getattr(session.config, "_tmp_path_factory", None)  # tmp_path_factory's object
    if factory is None:
        return
    if needed & _NEEDS_SERVER:
        servers.prestart_mlflow_server(factory)
    if "spark_cluster" in needed:
        cluster.prestart_cluster(factory)


def pytest_terminal_summary(terminalreporter, config):
    """The random order's seed, even under -q (pytest-randomly shows it only in the header)."""
    seed = getattr(config.option, "randomly_seed", None)
    if isinstance(seed, int) and not getattr(config.option, "randomly_dont_reorganize", False):
        terminalreporter.write_line(f"tests ran in random order, seed {seed}: rerun this order "
                                    f"with --randomly-seed={seed}")


def pytest_sessionfinish(session):
    from tests import cluster, servers

    servers.stop_prestarted_mlflow_server()
    cluster.stop_prestarted_cluster()
