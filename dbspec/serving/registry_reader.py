"""A read-only registry client for SQLite stores that does not import MLflow.

``dbspec serve`` needs three reads from the registry: which version an alias (or number, or
"latest") names, where that version's files are, and, with ``--watch-alias``, the same again
every few seconds. Importing MLflow for them costs about 2 s and 150-200 MB of the server's
memory (its tracking, GenAI and SQLAlchemy store modules), several times what the model needs.
On a ``sqlite:///`` store, the default of dbspec's local runs, those reads are three SQL
queries, done here with the standard library's ``sqlite3``.

:class:`SqliteRegistryReader` answers the calls of ``mlflow.MlflowClient`` that serving makes,
with the same shapes (objects with ``.version``, ``.aliases``) and the same error codes
(``RESOURCE_DOES_NOT_EXIST``, ``INVALID_PARAMETER_VALUE``) as MLflow's own SQL store, so the
code that takes a client (alias lookups, :mod:`dbspec.serving.source`) works unchanged on
either. It is used only where it is known to agree with MLflow (:func:`open_sqlite_reader`):
a store whose tables hold the columns it reads, MLflow's workspaces off, and a version whose
files are on the local disk; everywhere else serving goes through MLflow. Tests compare its
answers with ``MlflowClient``'s on the same store.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from pathlib import Path
from typing import NamedTuple, Optional
from urllib.parse import unquote, urlparse

#: What MLflow's SQL store marks a deleted version with (it keeps the row).
_DELETED_STAGE = "Deleted_Internal"
#: Columns the queries read, per table; a store without one of them is left to MLflow.
_NEEDED = {"registered_models": {"name"},
           "model_versions": {"name", "version", "current_stage", "source", "storage_location"},
           "registered_model_aliases": {"alias", "name", "version"}}
_DEFAULT_WORKSPACE = "default"


class RegistryReadError(Exception):
    """A failed read, with the error code MLflow's SQL store would give (``error_code``)."""

    def __init__(self, message: str, error_code: str):
        super().__init__(message)
        self.error_code = error_code


class VersionRecord(NamedTuple):
    """The fields of a model version that serving reads (as ``ModelVersion`` names them)."""

    name: str
    version: str
    source: str
    storage_location: Optional[str]


class ModelRecord(NamedTuple):
    """A registered model's name and aliases (as ``RegisteredModel`` names them)."""

    name: str
    aliases: dict[str, str]


class SqliteRegistryReader:
    """Reads of an MLflow SQLite registry (see the module docstring); never writes.

    Each call opens the database read-only and closes it: the server holds no connection
    between ``--watch-alias`` polls, and MLflow's writers are never blocked by a reader.
    """

    def __init__(self, database: Path, tracking_uri: str, workspace_column: bool):
        self.database = database
        self.tracking_uri = tracking_uri
        self._workspace = " AND workspace = ?" if workspace_column else ""
        self._workspace_args: tuple = (_DEFAULT_WORKSPACE,) if workspace_column else ()

    def _query(self, sql: str, *args) -> list[tuple]:
        try:
            with _connect(self.database) as connection:
                return connection.execute(sql, args + self._workspace_args).fetchall()
        except sqlite3.Error as exc:
            raise RegistryReadError(f"cannot read {self.database}: {exc}",
                                    "INTERNAL_ERROR") from None

    def get_registered_model(self, name: str) -> ModelRecord:
        if not self._query(f"SELECT name FROM registered_models WHERE name = ?{self._workspace}",
                           name):
            raise RegistryReadError(f"Registered Model with name={name} not found",
                                    "RESOURCE_DOES_NOT_EXIST")
        rows = self._query("SELECT alias, version FROM registered_model_aliases WHERE name = ?"
                           f"{self._workspace}", name)
        return ModelRecord(name, {alias: str(version) for alias, version in rows})

    def get_model_version(self, name: str, version) -> VersionRecord:
        try:
            number = int(version)
        except (TypeError, ValueError):
            raise RegistryReadError(f"Parameter 'version' must be an integer, got '{version}'.",
                                    "INVALID_PARAMETER_VALUE") from None
        rows = self._query("SELECT name, version, source, storage_location FROM model_versions "
                           f"WHERE name = ? AND version = ? AND current_stage != ?"
                           f"{self._workspace}", name, number, _DELETED_STAGE)
        if not rows:
            raise RegistryReadError(f"Model Version (name={name}, version={number}) not found",
                                    "RESOURCE_DOES_NOT_EXIST")
        return _version(rows[0])

    def get_model_version_by_alias(self, name: str, alias: str) -> VersionRecord:
        if alias.lower() == "latest":  # MLflow's reserved alias: the highest version
            versions = self.search_model_versions(f"name = '{name}'", _name=name)
            if not versions:
                raise RegistryReadError(f"Latest version not found for model {name}.",
                                        "RESOURCE_DOES_NOT_EXIST")
            return max(versions, key=lambda v: int(v.version))
        self.get_registered_model(name)  # MLflow says "no such model" before "no such alias"
        rows = self._query("SELECT version FROM registered_model_aliases WHERE name = ? AND "
                           f"alias = ?{self._workspace}", name, alias)
        if not rows:
            raise RegistryReadError(f"Registered model alias {alias} not found.",
                                    "INVALID_PARAMETER_VALUE")
        return self.get_model_version(name, rows[0][0])

    def search_model_versions(self, filter_string: str, *, _name: Optional[str] = None
                              ) -> list[VersionRecord]:
        """Only the ``name = '...'`` filter that serving sends is understood."""
        name = _name if _name is not None else _name_filter(filter_string)
        rows = self._query("SELECT name, version, source, storage_location FROM model_versions "
                           f"WHERE name = ? AND current_stage != ?{self._workspace}",
                           name, _DELETED_STAGE)
        return [_version(row) for row in rows]

    def get_model_version_download_uri(self, name: str, version) -> str:
        found = self.get_model_version(name, version)
        return found.storage_location or found.source


def local_artifacts(uri: str) -> Optional[Path]:
    """The directory of a ``file:`` URI or a plain path; None for any remote location."""
    parsed = urlparse(uri)
    if parsed.scheme == "file" and parsed.netloc in ("", "localhost"):
        return Path(unquote(parsed.path))
    if parsed.scheme == "" and uri.startswith("/"):
        return Path(uri)
    return None


def open_sqlite_reader(tracking_uri: str) -> Optional[SqliteRegistryReader]:
    """A reader for ``tracking_uri`` when it can stand in for MLflow there, else None.

    None for: a URI that is not ``sqlite:///FILE``; a registry URI of its own
    (``MLFLOW_REGISTRY_URI``), or MLflow's workspaces switched on (they choose rows by
    settings this reader does not follow); a file that is missing, not a database, or lacks a
    table or column the reads need (a store MLflow has not created or must migrate). MLflow
    then opens the store and says what is wrong with it.
    """
    from dbspec.tracking.stores import sqlite_path

    registry_uri = os.environ.get("MLFLOW_REGISTRY_URI")
    if registry_uri and registry_uri != tracking_uri:
        return None
    if os.environ.get("MLFLOW_ENABLE_WORKSPACES", "").strip().lower() in ("1", "true", "yes") \
            or os.environ.get("MLFLOW_WORKSPACE"):
        return None
    database = sqlite_path(tracking_uri)
    if database is None or not database.is_file():
        return None
    try:
        with _connect(database) as connection:
            columns = {table: {row[1] for row in connection.execute(
                f"PRAGMA table_info({table})")} for table in _NEEDED}
    except sqlite3.Error:
        return None
    if any(not needed <= columns[table] for table, needed in _NEEDED.items()):
        return None
    workspace = all("workspace" in found for found in columns.values())
    return SqliteRegistryReader(database, tracking_uri, workspace)


def _connect(database: Path) -> "contextlib.closing[sqlite3.Connection]":
    # read-only; and closed on exit (sqlite3's own context manager only commits)
    return contextlib.closing(sqlite3.connect(f"{database.resolve().as_uri()}?mode=ro",
                                              uri=True, timeout=30))


def _version(row: tuple) -> VersionRecord:
    name, version, source, storage_location = row
    return VersionRecord(name, str(version), source, storage_location)


def _name_filter(filter_string: str) -> str:
    prefix, suffix = "name = '", "'"
    if not (filter_string.startswith(prefix) and filter_string.endswith(suffix)):
        raise RegistryReadError(f"unsupported filter {filter_string!r}: only name = '...'",
                                "INVALID_PARAMETER_VALUE")
    return filter_string[len(prefix):-len(suffix)].replace("''", "'")
