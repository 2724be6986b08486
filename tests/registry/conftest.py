"""Registry fixtures: a SQLite MLflow registry per test, built without training."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

NAME = "integrity_model"


@pytest.fixture(scope="module")
def empty_database(tmp_path_factory) -> Path:
    """A migrated, empty MLflow database, copied by each test (migrating takes seconds)."""
    import mlflow

    path = tmp_path_factory.mktemp("empty") / "mlflow.db"
    mlflow.MlflowClient(f"sqlite:///{path}").search_registered_models()
    return path


@pytest.fixture
def store(tmp_path, monkeypatch, empty_database):
    """A SQLite registry with NAME and no versions: (tracking URI, client, registry)."""
    import mlflow

    from dbspec.registry import Registry

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    shutil.copy(empty_database, tmp_path / "mlflow.db")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    client.create_registered_model(NAME)
    (tmp_path / "model").mkdir()
    return uri, client, Registry(client)
