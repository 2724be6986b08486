"""Which model version answered a gateway row: its ``served_entity_id`` as a version.

Databricks' AI Gateway inference tables name the served entity by its ID ("the unique ID of the
served entity": 32 hex digits), not by its name. The system table
``system.serving.served_entities`` maps an ID to the entity's ``entity_name`` (for a Unity
Catalog model, its full name) and ``entity_version``, one row per endpoint configuration
(``change_time``): the latest row of an ID is read. An ID of the form ``<name>-<version>``, the
served-entity names Databricks gives by default and ``dbspec endpoint`` keeps, is read as it is,
without the lookup. IDs no lookup could place, and entities of another model, leave their rows
out with the reason, which the pass reports.
"""

from __future__ import annotations

import re
from typing import Any, Iterable, NamedTuple

#: The system table that maps a served entity's ID to its model and version.
SERVED_ENTITIES = "system.serving.served_entities"
_NAMED = re.compile(r"-(\d+)$")


class EntityVersions(NamedTuple):
    """``versions``: served entity ID -> version of the watched model; ``left_out``: ID -> why
    its rows cannot be placed."""

    versions: dict[str, str]
    left_out: dict[str, str]


def entity_versions(ids: Iterable[Any], model_name: str, spark: Any = None) -> EntityVersions:
    """The versions of ``model_name`` that the served entity ``ids`` stand for, looked up in
    :data:`SERVED_ENTITIES` through ``spark`` (else the running session, or Databricks') where an
    ID is no ``<name>-<version>``."""
    ids = list(ids)  # walked twice
    named = {i: m.group(1) for i in ids if i and (m := _NAMED.search(i))}
    rest = sorted({str(i) for i in ids if i and i not in named})
    if not rest:
        return EntityVersions(named, {})
    rows, failure = _lookup(rest, spark)
    latest: dict[str, Any] = {}
    for row in sorted(rows, key=lambda r: str(r["change_time"] or "")):
        latest[row["served_entity_id"]] = row
    versions, left_out = dict(named), {}
    for entity in rest:
        row = latest.get(entity)
        if row is None:
            left_out[entity] = f"served entity {entity!r}: " + (
                failure or f"not in {SERVED_ENTITIES}")
        elif _unquoted(row["entity_name"]) != _unquoted(model_name):
            left_out[entity] = f"served entity {entity!r} serves {row['entity_name']}, not " \
                               f"{model_name}"
        else:
            versions[entity] = str(row["entity_version"])
    return EntityVersions(versions, left_out)


def _unquoted(name: Any) -> str:
    return str(name or "").replace("`", "").lower()


def _lookup(ids: list[str], spark: Any) -> tuple[list[Any], str]:
    """The rows of :data:`SERVED_ENTITIES` for ``ids``, or why none could be read."""
    from dbspec.spark.session import session_at_hand

    spark = spark or session_at_hand()
    if spark is None:
        return [], f"IDs are mapped to versions through {SERVED_ENTITIES}: run on Databricks " \
                   "(or with a Spark session that reads it)"
    from pyspark.sql import functions as F

    from dbspec.monitoring.layout import spark_error

    try:
        return spark.table(SERVED_ENTITIES).where(F.col("served_entity_id").isin(ids)).select(
            "served_entity_id", "entity_name", "entity_version", "change_time").collect(), ""
    except Exception as exc:  # noqa: BLE001 - no such table, no access: every ID unplaced
        return [], f"{SERVED_ENTITIES} cannot be read: {spark_error(exc)}"
