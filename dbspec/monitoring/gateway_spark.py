"""An AI Gateway inference table unpacked in Spark: a Unity Catalog table (``catalog.schema.table``)
or a large gateway Delta path with a Spark session at hand (a cluster).

The request and response JSON are parsed where the table lies (``from_json`` with the shapes of
MLflow's scoring protocol; feature values as their JSON text), exploded into one row per scored
row, and typed by the same rule as :mod:`.gateway`: a column is numeric when most of its values
are JSON numbers (float32, int64 when all are integers), and a row holding a value of the other
kind is left out as :data:`~.gateway.MIXED`. Two Spark jobs (the columns and their kinds, then
the typed rows); only the unpacked rows, without the payload, come back to the driver, in
dbspec serve's layout with the same :data:`~.gateway.LEFT_OUT` reasons as the local path.
Values the local path tells apart and text cannot: a number sent as a JSON string counts as a
number here, and a JSON boolean as text.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Any, Callable, Optional

from dbspec.errors import DbspecError
from dbspec.monitoring.gateway import (LEFT_OUT, LOGGING_ERROR, MIXED, NOT_ANSWERED, UNPARSABLE,
                                       is_gateway_table)
from dbspec.monitoring.layout import BASE_COLUMNS, GATEWAY_COLUMNS, InferenceRows, \
    check_base_columns, spark_error
from dbspec.monitoring.served_entities import EntityVersions, entity_versions
from dbspec.spec.sections.monitoring import CATALOG_TABLE

#: A gateway Delta path of at least this many rows is unpacked in Spark when a session that
#: spreads work over executors is at hand (on one machine the Python path measured ~3x faster).
SPARK_ROWS = 200_000
_NUMBER = r"^-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$|^-?Infinity$|^NaN$"
_INTEGER = r"^-?[0-9]+$"
_REQUEST = ("struct<dataframe_split:struct<columns:array<string>,data:array<array<string>>>,"
            "dataframe_records:array<map<string,string>>,inputs:string,instances:string>")
_ROW = "gateway_row"  # a row's place in its request (sorted on, then dropped)
_UNPLACED = "~"  # marks the rows that cannot be placed (warned about, then dropped)


def is_table_name(path: str) -> bool:
    """Whether ``path`` names a catalog table (``schema.table`` or ``catalog.schema.table``)
    rather than a path."""
    return bool(CATALOG_TABLE.match(path)) and not Path(path).exists()


def open_catalog_table(name: str, model_name: str, since: Optional[float],
                       version: Optional[str]) -> InferenceRows:
    """The catalog table ``name`` read through Spark (the cluster's session, or one started
    here): a gateway table unpacked, a table in dbspec serve's layout as is."""
    from dbspec.spark.session import session_at_hand

    session = session_at_hand()
    if session is None:
        raise DbspecError(f"inference table {name} does not exist as a path; to read it as a "
                          "catalog table, run on a Databricks cluster (or with a Spark session "
                          "running, pip install 'dbspec[spark]'), else give a Delta path")
    return unpack_in_spark(_read(lambda: session.table(name), name), name, model_name, since,
                           version)


def cluster_session(table: InferenceRows) -> Any:
    """The Spark session to unpack the gateway Delta table ``table`` in (one already running
    that reads Delta, or the cluster's), or None: too small, no session at hand, or one whose
    work stays on this machine (a local master, a single-node cluster)."""
    from dbspec.spark.session import session_at_hand

    if not is_gateway_table(table) or table.dataset.count_rows() < SPARK_ROWS:
        return None
    spark = session_at_hand()
    if spark is None:
        return None
    from dbspec.data.spark_sources import has_delta_format

    on_databricks = bool(os.environ.get("DATABRICKS_RUNTIME_VERSION"))
    reads = on_databricks or has_delta_format(spark)
    return spark if reads and spreads_work(spark) else None


def spreads_work(spark: Any) -> bool:
    """Whether ``spark`` runs its tasks on executors beyond this process: a master that is not
    ``local`` (Databricks' single-node clusters run ``local[*, 4]``); a session that cannot say
    (Spark Connect, as on shared clusters) is taken as a cluster's."""
    from dbspec.spec.locations import is_local_master

    try:
        master = str(spark.conf.get("spark.master", ""))
    except Exception:  # noqa: BLE001 (a Connect session may refuse to read it)
        return True
    return not is_local_master(master)


def open_delta_in_spark(spark: Any, path: str, model_name: str, since: Optional[float],
                        version: Optional[str]) -> InferenceRows:
    """The gateway Delta table at ``path`` unpacked in ``spark``."""
    where = "dbfs:/" + path[len("/dbfs/"):] if path.startswith("/dbfs/") else path
    return unpack_in_spark(_read(lambda: spark.read.format("delta").load(where), path), path,
                           model_name, since, version)


def _read(read: Callable[[], Any], where: str) -> Any:
    try:
        return read()
    except Exception as exc:  # AnalysisException: no such table, no access, no Delta reader
        raise DbspecError(f"inference table {where}: Spark cannot read it: {spark_error(exc)}") \
            from None


def unpack_in_spark(frame: Any, where: str, model_name: str, since: Optional[float],
                    version: Optional[str]) -> InferenceRows:
    """``frame`` (a gateway table) unpacked into dbspec serve's layout, rows of ``version``
    (None: every version) since ``since`` (epoch seconds); a frame in dbspec serve's layout is
    collected as it is.

    Raises:
        DbspecError: neither layout, or gateway columns of other types (naming ``where``).
    """
    import pyarrow.dataset as ds
    from pyspark.sql import functions as F

    names = frame.columns
    if not all(c in names for c in GATEWAY_COLUMNS):
        check_base_columns(InferenceRows(where, ds.dataset(_to_arrow(frame.limit(0), where))))
        kept = F.col("model_name") == model_name
        if since is not None:
            kept = kept & (F.col("timestamp") >= F.timestamp_seconds(F.lit(since)))
        return InferenceRows(where, ds.dataset(_to_arrow(frame.where(kept), where)))
    _check_gateway_types(frame, where)
    spark = frame.sparkSession
    ids = [r[0] for r in frame.select("served_entity_id").distinct().collect()]
    entities = entity_versions(ids, model_name, spark)  # a few IDs: looked up once
    with _last_key_wins(spark), \
            _cached(_rows(_requests(frame, since, version, entities))) as rows:
        typed = _typed(rows, _kinds(rows, where), model_name)
        return InferenceRows(where, ds.dataset(_finish(_to_arrow(typed, where), where)))


def _check_gateway_types(frame: Any, where: str) -> None:
    expected = {"request": "string", "response": "string", "status_code": "int|bigint|smallint",
                "logging_error_codes": "array<string>", "served_entity_id": "string",
                "request_time": "timestamp|timestamp_ntz"}
    found = dict(frame.dtypes)
    for column, kinds in expected.items():
        if found[column] not in kinds.split("|"):
            raise DbspecError(f"inference table {where}: column '{column}' is {found[column]}, "
                              f"expected {kinds.replace('|', ' or ')} (a Databricks AI Gateway "
                              "table's)")


@contextlib.contextmanager
def _cached(frame: Any):
    """``frame`` kept by Spark while the block reads it twice (as it is where a cluster does not
    cache, serverless compute)."""
    try:
        frame = frame.persist()
    except Exception:  # noqa: BLE001 - NOT_SUPPORTED_WITH_SERVERLESS and the like
        yield frame
        return
    try:
        yield frame
    finally:
        frame.unpersist()


@contextlib.contextmanager
def _last_key_wins(spark: Any):
    """A JSON object or split with a repeated column keeps the last value, as ``json.loads``
    does (Spark's default refuses the whole query)."""
    key = "spark.sql.mapKeyDedupPolicy"
    before = spark.conf.get(key, "EXCEPTION")
    try:
        spark.conf.set(key, "LAST_WIN")
    except Exception:  # noqa: BLE001 - serverless compute sets few confs: a repeat is an error
        yield
        return
    try:
        yield
    finally:
        spark.conf.set(key, before)


def _columns_shape(parsed: str) -> str:
    """SQL: the rows of ``parsed``, a ``{column: [values]}`` map (null: none, or ragged)."""
    sizes = f"transform(map_values({parsed}), a -> size(a))"
    return (f"CASE WHEN {parsed} IS NULL OR size({parsed}) = 0 OR exists(map_values({parsed}), "
            f"a -> a IS NULL) OR size(array_distinct({sizes})) != 1 OR {sizes}[0] = 0 THEN NULL "
            f"ELSE transform(sequence(0, {sizes}[0] - 1), i -> map_from_arrays(map_keys("
            f"{parsed}), transform(map_values({parsed}), a -> a[i]))) END")


def _requests(frame: Any, since: Optional[float], version: Optional[str],
              entities: EntityVersions) -> Any:
    """One row per request: its base columns, feature rows ``f`` and prediction rows ``p``
    (arrays of maps of JSON text), and why it is left out (null: it is used). Each JSON text is
    parsed once, in a projection of its own (Spark does not inline a costly expression twice)."""
    from pyspark.sql import functions as F

    micros = F.unix_micros("request_time") if dict(frame.dtypes)["request_time"] == \
        "timestamp" else F.expr("timestampdiff(MICROSECOND, TIMESTAMP_NTZ'1970-01-01 00:00:00', "
                                "request_time)")
    g = frame.select(F.coalesce("databricks_request_id", F.lit("")).alias("request_id"),
                     micros.alias("timestamp"),
                     F.coalesce(_lookup(entities.versions, "served_entity_id"), F.lit(""))
                     .alias("model_version"),
                     F.col("execution_duration_ms").cast("double").alias("latency_ms"),
                     "served_entity_id", "status_code", "logging_error_codes",
                     "request", "response")
    if since is not None:
        g = g.where((F.col("timestamp") >= int(since * 1e6)) | F.col("timestamp").isNull())
    if version is not None:
        g = g.where(F.col("model_version").isin(version, "") | F.col("timestamp").isNull())
    g = g.withColumn("q", F.from_json("request", _REQUEST)).withColumn(
        "a", F.from_json("response", "struct<predictions:string>")).drop("request", "response")
    given, told = F.coalesce("q.inputs", "q.instances"), F.col("a.predictions")
    g = g.select("*", *(F.when(F.ltrim(text).startswith("{"), F.from_json(
        text, "map<string,array<string>>")).otherwise(None).alias(name) for text, name in
        ((given, "q_columns"), (told, "a_columns"))), *(F.when(~F.ltrim(text).startswith("{"),
        F.from_json(text, schema)).alias(name) for text, schema, name in (
            (given, "array<map<string,string>>", "q_records"),
            (told, "array<string>", "a_values"))))
    split = "q.dataframe_split"
    features = F.expr(
        f"CASE WHEN {split} IS NOT NULL THEN CASE WHEN {split}.columns IS NULL OR "
        f"{split}.data IS NULL OR exists({split}.columns, c -> c IS NULL) OR exists({split}.data,"
        f" r -> r IS NULL OR size(r) != size({split}.columns)) THEN NULL ELSE transform("
        f"{split}.data, r -> map_from_arrays({split}.columns, r)) END "
        "WHEN q.dataframe_records IS NOT NULL THEN q.dataframe_records "
        f"WHEN q_columns IS NOT NULL THEN {_columns_shape('q_columns')} ELSE q_records END")
    predictions = F.expr(
        f"CASE WHEN a_columns IS NOT NULL THEN {_columns_shape('a_columns')} ELSE transform("
        "a_values, e -> CASE WHEN startswith(ltrim(e), '{') THEN from_json(e, "
        "'map<string,string>') ELSE map('prediction', e) END) END")
    g = g.select("request_id", "timestamp", "model_version", "latency_ms",
                 _lookup(entities.left_out, "served_entity_id").alias("unplaced"),
                 "served_entity_id", "status_code", "logging_error_codes", features.alias("f"),
                 predictions.alias("p"))
    why = F.expr(
        f"CASE WHEN timestamp IS NULL THEN '{_UNPLACED}no request_time' "
        f"WHEN model_version = '' THEN '{_UNPLACED}' || coalesce(unplaced, 'served entity ' || "
        "coalesce(served_entity_id, 'null') || ': none named') "
        f"WHEN coalesce(status_code, -1) != 200 THEN '{NOT_ANSWERED}' "
        f"WHEN coalesce(size(logging_error_codes), 0) > 0 THEN '{LOGGING_ERROR}' "
        "WHEN f IS NULL OR p IS NULL OR size(f) = 0 OR size(f) != size(p) "
        f"OR exists(f, r -> r IS NULL) OR exists(p, r -> r IS NULL) THEN '{UNPARSABLE}' END")
    return g.withColumn(LEFT_OUT, why)


def _lookup(mapping: dict[str, str], column: str) -> Any:
    """``mapping[column]`` as a Spark column (null where it has no entry)."""
    from pyspark.sql import functions as F

    if not mapping:
        return F.lit(None).cast("string")
    return F.create_map(*(F.lit(x) for pair in sorted(mapping.items()) for x in pair))[
        F.col(column)]


def _rows(requests: Any) -> Any:
    """One row per scored row (``m``: its features, renamed ``feature_<name>`` when one clashes
    as dbspec serve does, and predictions), one per left-out request."""
    from pyspark.sql import functions as F

    base = ", ".join(f"'{c}'" for c in (*BASE_COLUMNS, LEFT_OUT))
    clash = (f"exists(map_keys(f[0]), k -> lower(k) IN ({base}) OR array_contains(transform("
             "map_keys(p[0]), x -> lower(x)), lower(k)))")
    renamed = (f"CASE WHEN {clash} THEN transform(f, r -> transform_keys(r, (k, v) -> "
               "concat('feature_', k))) ELSE f END")
    merged = F.expr(f"CASE WHEN {LEFT_OUT} IS NULL THEN zip_with({renamed}, p, "
                    "(x, y) -> map_concat(x, y)) END")
    return requests.select("request_id", "timestamp", "model_version", "latency_ms",
                           LEFT_OUT, F.posexplode_outer(merged).alias("row", "m"))


def _kinds(rows: Any, where: str) -> list[tuple[str, str]]:
    """Each unpacked column, in the order it first appears, with its type: ``float``,
    ``bigint`` (every value an integer) or ``string`` (most values text)."""
    from pyspark.sql import functions as F

    cells = rows.select("timestamp", "request_id", "row",
                        F.posexplode("m").alias("at", "key", "value"))
    number = F.col("value").rlike(_NUMBER)
    found = cells.groupBy("key").agg(
        F.min(F.struct("timestamp", "request_id", "row", "at")).alias("first"),
        F.count("value").alias("values"), F.sum(number.cast("long")).alias("numbers"),
        F.sum((number & ~F.col("value").rlike(_INTEGER)).cast("long")).alias("floats"))
    try:
        collected = sorted(found.collect(), key=lambda r: tuple(r["first"]))
    except Exception as exc:  # the JSON of a row Spark cannot take apart
        raise DbspecError(f"inference table {where}: Spark cannot unpack it: {spark_error(exc)}") \
            from None
    return [(r["key"], "string" if (r["numbers"] or 0) * 2 < r["values"] else
             "float" if r["floats"] else "bigint") for r in collected]


def _typed(rows: Any, kinds: list[tuple[str, str]], model_name: str) -> Any:
    """The rows with one typed column per unpacked column; a value of the other kind than its
    column's is null and leaves its row out (:data:`MIXED`)."""
    from pyspark.sql import functions as F

    columns, mixed = [], F.lit(False)
    for key, kind in kinds:
        value = F.try_element_at("m", F.lit(key))
        other = ~value.rlike(_NUMBER) if kind != "string" else value.rlike(_NUMBER)
        mixed = mixed | F.coalesce(other, F.lit(False))
        typed = F.when(other, None).otherwise(value if kind == "string" else F.expr(
            f"try_cast(try_element_at(m, '{_escaped(key)}') AS double)").cast(kind))
        columns.append(typed.alias(key))
    left_out = F.coalesce(F.col(LEFT_OUT), F.when(mixed, F.lit(MIXED)))
    return rows.select("request_id", "timestamp", F.lit(model_name).alias("model_name"),
                       "model_version", "latency_ms", *columns, left_out.alias(LEFT_OUT),
                       F.coalesce("row", F.lit(0)).alias(_ROW))


def _escaped(key: str) -> str:
    return key.replace("\\", "\\\\").replace("'", "\\'")


def _to_arrow(frame: Any, where: str) -> Any:
    """``frame`` collected as an Arrow table (``toArrow`` on Spark 4, through pandas before)."""
    import pyarrow as pa

    try:
        if hasattr(frame, "toArrow"):
            return frame.toArrow()
        frame.sparkSession.conf.set("spark.sql.execution.arrow.pyspark.enabled", "true")
        return pa.Table.from_pandas(frame.toPandas(), preserve_index=False)
    except Exception as exc:  # the JSON of a row Spark cannot take apart, a lost executor
        raise DbspecError(f"inference table {where}: Spark cannot unpack it: {spark_error(exc)}") \
            from None


def _finish(table: Any, where: str) -> Any:
    """The collected rows: timestamps as UTC, rows that cannot be placed warned about and
    dropped, as the local path does."""
    import pyarrow as pa
    import pyarrow.compute as pc

    stamps = table.column("timestamp").cast(pa.int64()).cast(pa.timestamp("us", tz="UTC"))
    table = table.set_column(table.schema.get_field_index("timestamp"), "timestamp", stamps)
    reasons = table.column(LEFT_OUT)
    unplaced = pc.fill_null(pc.starts_with(reasons, _UNPLACED), False)
    counts: dict[str, int] = {}
    for reason in reasons.filter(unplaced).to_pylist():
        counts[reason] = counts.get(reason, 0) + 1
    for reason, count in counts.items():
        why = reason[len(_UNPLACED):]
        print(f"warning: {where}: {count:,} request(s) left out: {why}", file=sys.stderr)
    table = table.filter(pc.invert(unplaced))  # rows of a request stay together, in order
    return table.sort_by([("timestamp", "ascending"), ("request_id", "ascending"),
                          (_ROW, "ascending")]).drop_columns([_ROW])
