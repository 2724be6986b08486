"""The MLflow-free registry reader of ``dbspec serve`` answers as ``mlflow.MlflowClient`` does."""

from __future__ import annotations

import sqlite3
import subprocess
import sys

import pytest

from dbspec.registry import RegistryError
from dbspec.serving.registry_reader import (RegistryReadError, SqliteRegistryReader,
                                            local_artifacts, open_sqlite_reader)
from dbspec.serving.source import ModelTarget, _artifacts, open_client, resolve_version

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
def test_it_resolves_every_target_as_mlflow_does(store, clean_env, target):
    uri, client, _ = store
    reader = open_sqlite_reader(uri)
    assert isinstance(reader, SqliteRegistryReader)
    assert outcome(reader, target) == outcome(client, target)


def test_the_download_location_is_mlflows(store, clean_env):
    uri, client, sources = store
    reader = open_sqlite_reader(uri)
    for version in ("1", "3"):
        assert reader.get_model_version_download_uri(NAME, version) == \
            client.get_model_version_download_uri(NAME, version)
    assert local_artifacts(reader.get_model_version_download_uri(NAME, "1")) == sources[0]
    with pytest.raises(RegistryReadError) as missing:
        reader.get_model_version_download_uri(NAME, "2")  # deleted
    assert missing.value.error_code == "RESOURCE_DOES_NOT_EXIST"


def test_files_that_are_gone_are_a_clear_error(store, clean_env, tmp_path):
    uri, _, _ = store
    reader = open_sqlite_reader(uri)
    gone = ModelTarget(NAME, version="3")
    with pytest.raises(RegistryError, match=r"cannot download .*/2: Model Version .* not found"):
        _artifacts(reader, ModelTarget(NAME, version="2"), "2")
    moved = tmp_path / "v3"
    (store[2][2]).rename(moved)
    try:
        with pytest.raises(RegistryError, match=r"cannot download models:/reader_model/3: its "
                                                r"files are not at .*v3"):
            _artifacts(reader, gone, "3")
    finally:
        moved.rename(store[2][2])


def test_local_artifacts_only_for_this_disk():
    assert str(local_artifacts("file:///a/b%20c")) == "/a/b c"
    assert str(local_artifacts("/a/b")) == "/a/b"
    for remote in ("s3://bucket/a", "mlflow-artifacts:/0/models/m-1", "file://otherhost/a",
                   "models:/m-123", "dbfs:/a"):
        assert local_artifacts(remote) is None


def test_stores_it_cannot_stand_in_for_are_left_to_mlflow(store, clean_env, tmp_path):
    uri, _, _ = store
    assert open_sqlite_reader("http://127.0.0.1:5000") is None
    assert open_sqlite_reader("databricks") is None
    assert open_sqlite_reader(f"sqlite:///{tmp_path / 'missing.db'}") is None
    (tmp_path / "text.db").write_text("not a database")
    assert open_sqlite_reader(f"sqlite:///{tmp_path / 'text.db'}") is None
    sqlite3.connect(tmp_path / "empty.db").close()  # no MLflow tables yet
    assert open_sqlite_reader(f"sqlite:///{tmp_path / 'empty.db'}") is None
    clean_env.setenv("MLFLOW_REGISTRY_URI", f"sqlite:///{tmp_path / 'other.db'}")
    assert open_sqlite_reader(uri) is None
    clean_env.delenv("MLFLOW_REGISTRY_URI")
    clean_env.setenv("MLFLOW_ENABLE_WORKSPACES", "true")
    assert open_sqlite_reader(uri) is None
    clean_env.delenv("MLFLOW_ENABLE_WORKSPACES")
    assert open_sqlite_reader(uri) is not None


def test_open_client_falls_back_to_mlflow(store, clean_env, tmp_path):
    import mlflow

    uri, _, _ = store
    assert isinstance(open_client(uri, tmp_path), SqliteRegistryReader)
    with pytest.raises(RegistryError, match="no tracking store at"):
        open_client(None, tmp_path / "nowhere")
    sqlite3.connect(tmp_path / "empty.db").close()
    fallback = open_client(f"sqlite:///{tmp_path / 'empty.db'}", tmp_path)
    assert isinstance(fallback, mlflow.MlflowClient)


def test_a_database_that_breaks_after_opening_is_a_registry_error(tmp_path, clean_env, store):
    uri, _, _ = store
    copy = tmp_path / "copy.db"
    copy.write_bytes(open(uri[len("sqlite:///"):], "rb").read())
    reader = open_sqlite_reader(f"sqlite:///{copy}")
    copy.write_text("truncated")
    with pytest.raises(RegistryError, match="the registry did not answer: cannot read"):
        resolve_version(reader, ModelTarget(NAME, version="1"))


def test_reading_imports_no_mlflow(store):
    uri, _, _ = store
    code = ("import sys\n"
            "from dbspec.serving.source import ModelTarget, open_client, resolve_version\n"
            "from pathlib import Path\n"
            f"client = open_client({uri!r}, Path('.'))\n"
            f"print(resolve_version(client, ModelTarget({NAME!r}, alias='champion')))\n"
            "assert 'mlflow' not in sys.modules, 'mlflow was imported'\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120, env={k: v for k, v in __import__("os").environ.items()
                                              if not k.startswith("MLFLOW_")})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "1"
