"""Serving's registry (MLflow's client, its first read in a child process) answers as
``mlflow.MlflowClient`` does, with the same errors, and keeps MLflow out of the server."""

from __future__ import annotations

import subprocess
import sys

import pytest

from dbspec.registry import RegistryError, RegistryUnavailable
from dbspec.errors import DbspecError
from dbspec.serving.registry_reader import ServingRegistry, local_artifacts
from dbspec.serving.source import ModelTarget, open_client, resolve_version
from dbspec.tracking.stores import TrackingError

NAME = "reader_model"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A SQLite registry: NAME with v1 (@champion), v2 (@challenger, then deleted: MLflow keeps
    its row), v3; 'empty_model' with no version. (URI, mlflow client, artifact directories)."""
    import mlflow

    root = tmp_path_factory.mktemp("reader")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri, registry_uri=uri)
    client.create_registered_model(NAME)
    client.create_registered_model("empty_model")
    sources = []
    for number in (1, 2, 3):
        source = root / f"v{number}"
        source.mkdir()
        sources.append(source)
        client.create_model_version(NAME, str(source))
    client.set_registered_model_alias(NAME, "champion", "1")
    client.set_registered_model_alias(NAME, "challenger", "2")
    client.delete_model_version(NAME, "2")
    return uri, client, sources


@pytest.fixture
def clean_env(monkeypatch):
    for key in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI", "MLFLOW_ENABLE_WORKSPACES",
                "MLFLOW_WORKSPACE"):
        monkeypatch.delenv(key, raising=False)
    return monkeypatch


def outcome(client, target):
    try:
        return "version", resolve_version(client, target)
    except RegistryError as exc:
        return type(exc).__name__, str(exc)


TARGETS = [ModelTarget(NAME, alias="champion"), ModelTarget(NAME, alias="challenger"),
           ModelTarget(NAME, alias="nobody"), ModelTarget(NAME, alias="latest"),
           ModelTarget(NAME, version="1"), ModelTarget(NAME, version="2"),
           ModelTarget(NAME, version="9"), ModelTarget(NAME),
           ModelTarget("no_such_model", alias="champion"), ModelTarget("no_such_model"),
           ModelTarget("no_such_model", version="1"), ModelTarget("empty_model"),
           ModelTarget("empty_model", alias="latest")]


@pytest.mark.parametrize("target", TARGETS, ids=[t.uri for t in TARGETS])
def test_it_resolves_every_target_as_mlflow_does(store, clean_env, target, tmp_path):
    uri, client, _ = store
    assert outcome(open_client(uri, tmp_path), target) == outcome(client, target)


def test_the_files_are_where_mlflow_says(store, clean_env, tmp_path):
    uri, client, sources = store
    registry = open_client(uri, tmp_path)
    assert resolve_version(registry, ModelTarget(NAME, version="3")) == "3"
    assert registry.get_model_version_download_uri(NAME, "3") == str(sources[2])
    assert local_artifacts(client.get_model_version_download_uri(NAME, "3")) == sources[2]
    # a version the child did not resolve is asked of the client here
    assert registry.get_model_version_download_uri(NAME, "1") == \
        client.get_model_version_download_uri(NAME, "1")


def test_files_that_are_gone_are_a_clear_error(store, clean_env, tmp_path):
    uri, _, sources = store
    moved = tmp_path / "v3"
    sources[2].rename(moved)
    try:
        with pytest.raises(RegistryError, match=r"cannot download models:/reader_model/3: its "
                                                r"files are not at .*v3"):
            resolve_version(open_client(uri, tmp_path), ModelTarget(NAME, version="3"))
    finally:
        moved.rename(sources[2])


def test_local_artifacts_only_for_this_disk():
    assert str(local_artifacts("file:///a/b%20c")) == "/a/b c"
    assert str(local_artifacts("/a/b")) == "/a/b"
    for remote in ("s3://bucket/a", "mlflow-artifacts:/0/models/m-1", "file://otherhost/a",
                   "models:/m-123", "dbfs:/a"):
        assert local_artifacts(remote) is None


def test_open_client_needs_a_store(store, clean_env, tmp_path):
    uri, _, _ = store
    assert isinstance(open_client(uri, tmp_path), ServingRegistry)
    with pytest.raises(RegistryError, match="no tracking store at"):
        open_client(None, tmp_path / "nowhere")


def test_a_store_mlflow_cannot_use_is_named_in_one_line(clean_env, tmp_path):
    (tmp_path / "text.db").write_text("not a database")
    registry = open_client(f"sqlite:///{tmp_path / 'text.db'}", tmp_path)
    with pytest.raises(TrackingError, match=r"text.db is not a SQLite database$"):
        resolve_version(registry, ModelTarget(NAME, version="1"))
    with pytest.raises(TrackingError, match="missing.db"):  # not created empty by MLflow
        resolve_version(open_client(f"sqlite:///{tmp_path / 'missing.db'}", tmp_path),
                        ModelTarget(NAME, version="1"))
    assert not (tmp_path / "missing.db").exists()


def test_a_child_that_does_not_answer_in_time_is_a_registry_error(store, clean_env, tmp_path,
                                                                   monkeypatch):
    from dbspec.serving import registry_reader

    uri, _, _ = store
    monkeypatch.setattr(registry_reader, "_CHILD_TIMEOUT_S", 0.01)  # no registry that slow here
    with pytest.raises(RegistryUnavailable, match=r"^the registry did not answer: resolving "
                                                  r"models:/reader_model/1 took over"):
        resolve_version(open_client(uri, tmp_path), ModelTarget(NAME, version="1"))


def test_a_child_that_dies_is_a_clear_error(store, clean_env, tmp_path, monkeypatch):
    """A child that fails without an answer (here: an interpreter that cannot start)."""
    uri, _, _ = store
    monkeypatch.setattr(sys, "executable", "/bin/false")
    with pytest.raises(DbspecError, match=r"reading models:/reader_model/1 from the registry "
                                          r"failed: exit status 1"):
        resolve_version(open_client(uri, tmp_path), ModelTarget(NAME, version="1"))


def test_later_reads_follow_the_alias_with_the_client_here(store, clean_env, tmp_path):
    """What ``--watch-alias`` does: the first read in the child, the next ones here."""
    uri, client, _ = store
    registry = open_client(uri, tmp_path)
    target = ModelTarget(NAME, alias="champion")
    assert resolve_version(registry, target) == "1"
    client.set_registered_model_alias(NAME, "champion", "3")
    try:
        assert resolve_version(registry, target) == "3"
        assert registry.get_model_version_download_uri(NAME, "3") == \
            client.get_model_version_download_uri(NAME, "3")
    finally:
        client.set_registered_model_alias(NAME, "champion", "1")


def test_reading_imports_no_mlflow(store, tmp_path):
    uri, _, _ = store
    code = ("import sys\n"
            "from dbspec.serving.source import ModelTarget, open_client, resolve_version\n"
            "from pathlib import Path\n"
            f"client = open_client({uri!r}, Path('.'))\n"
            f"print(resolve_version(client, ModelTarget({NAME!r}, alias='champion')))\n"
            f"print(client.get_model_version_download_uri({NAME!r}, '1'))\n"
            "assert 'mlflow' not in sys.modules, 'mlflow was imported'\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120, env={k: v for k, v in __import__("os").environ.items()
                                              if not k.startswith("MLFLOW_")})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["1", str(store[2][0])]
