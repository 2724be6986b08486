"""load_data, split and preprocess: source rows to split arrays and fitted preprocessing."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from dbspec.data import store
from dbspec.data.prepare import (Splits, Table, build_table, build_typed_table,
                                 fit_preprocessing, split_rows)
from dbspec.data.sources import DataError
from dbspec.seams.sources import source_kind
from dbspec.spec.layout import has_typed_features
from dbspec.stages.base import SMOKE_ROWS, StageContext, write_json
from dbspec.stages.outputs import LoadDataOutput, PreprocessOutput, SplitOutput


class LoadDataStage:
    """Read the source, check features and target, store them as arrays."""

    name = "load_data"

    def run(self, ctx: StageContext) -> LoadDataOutput:
        if ctx.spec.data.streaming is not None:
            return _load_streaming_spec(ctx)
        kind = source_kind(ctx.spec.data)
        source = kind.read(ctx.spec.data, base=Path.cwd()) if ctx.spark is None else \
            kind.read_spark(ctx.spark, ctx.spec.data, base=Path.cwd())
        features = None  # typed features: each one's spec, its type resolved
        if has_typed_features(ctx.spec.data.features):
            table, features = _load_typed(ctx, source.frame)
        else:
            table = build_table(source.frame, ctx.spec.data)
        store.write_table(ctx.directory, table)
        output = LoadDataOutput(rows=len(table.target), feature_names=table.feature_names,
                                classes=table.classes, data_version=source.version,
                                uri=source.uri, features=features)
        write_json(ctx.directory / "table.json", output.to_json())
        return output

    def damaged(self, output: dict) -> Optional[str]:
        """Why a finished run's output is unusable now (its shard set is gone or contradicts
        its index), or None."""
        from dbspec.data.shards import BrokenShardSet, open_shard_set

        try:
            if output.get("shards"):
                open_shard_set(Path(output["shards"]))
        except BrokenShardSet as exc:
            return exc.problem
        return None


def _load_typed(ctx: StageContext, frame) -> tuple[Table, list[dict]]:
    """A spec with typed features: the target checked, the feature columns kept as they are
    in ``raw.parquet`` (``preprocess`` fits vocabularies on the training rows, then encodes)."""
    from dbspec.models.feature_types import resolve_features

    features = resolve_features(ctx.spec.data, frame)
    table, raw = build_typed_table(frame, ctx.spec.data, features)
    store.write_raw_features(ctx.directory, raw)
    kinds = ", ".join(f"{f.name} ({f.type})" for f in features[:12]) \
        + (f", ... ({len(features)} in all)" if len(features) > 12 else "")
    ctx.reporter.line(f"  features: {kinds}")
    return table, [f.model_dump(mode="json") for f in features]


def _load_streaming_spec(ctx: StageContext) -> LoadDataOutput:
    """A spec with ``data.streaming``: convert the source into shards (or find them), or,
    when it fits in memory, read it whole; either way the split is the hash split."""
    import pyarrow as pa

    from dbspec.data.convert import convert_source, count_rows, decide
    from dbspec.data.shard_writing import check_schema

    data = ctx.spec.data
    opened = source_kind(data).open(data, base=Path.cwd(), spark=ctx.spark)
    features = check_schema(opened.dataset.schema, data)
    limit = SMOKE_ROWS * STREAMED_SMOKE_FACTOR if ctx.options.smoke else None
    try:
        rows = count_rows(opened)  # reads every file's footer
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"data.source: cannot read {opened.uri}: {exc}") from None
    decision = decide(data, min(rows, limit) if rows is not None and limit else rows,
                      len(features))
    if decision.stream:
        ctx.reporter.line(f"  data: streamed from shards ({decision.reason})")
        shard_set = convert_source(data, opened, shard_location(ctx), limit=limit,
                                   spark=ctx.spark, say=ctx.reporter.line)
        output = LoadDataOutput(rows=shard_set.index["rows"], feature_names=features,
                                classes=shard_set.classes, data_version=opened.version,
                                uri=opened.uri, shards=str(shard_set.root))
    else:
        ctx.reporter.line(f"  data: in memory ({decision.reason})")
        try:
            output = _load_in_memory(ctx, opened, limit)
        except (pa.ArrowException, OSError) as exc:
            raise DataError(f"data.source: cannot read {opened.uri}: {exc}") from None
    write_json(ctx.directory / "table.json", output.to_json())
    return output


#: A streamed smoke run converts this many times ``SMOKE_ROWS`` of the source's first rows.
STREAMED_SMOKE_FACTOR = 5


def _load_in_memory(ctx: StageContext, opened, limit) -> LoadDataOutput:
    """The whole source as a table, with each row's hash split (the streamed path's split)."""
    import numpy as np

    from dbspec.data.shards import hash_split_rows, key_values

    import pyarrow as pa

    from dbspec.data.convert import first_rows
    from dbspec.data.shard_writing import record_batches

    data = ctx.spec.data
    # batch by batch on this thread: Dataset.to_table()'s thread pool aborted the process at
    # exit now and then here ("terminate called without an active exception")
    batches = record_batches(opened.dataset, opened.dataset.schema.names)
    arrow = pa.Table.from_batches(list(first_rows(batches, limit) if limit else batches),
                                  schema=opened.dataset.schema)
    key = data.streaming.key
    frame = arrow.to_pandas()
    if key is not None and key not in (data.feature_names or ()):
        frame = frame.drop(columns=[key])  # a row ID decides the split; it is no feature
    table = build_table(frame, data)
    keys = key_values(arrow.column(key).combine_chunks()) if key else None
    codes = hash_split_rows(data, np.arange(arrow.num_rows), keys)
    np.save(ctx.directory / "hash_split.npy", codes)
    store.write_table(ctx.directory, table)
    return LoadDataOutput(rows=len(table.target), feature_names=table.feature_names,
                          classes=table.classes, data_version=opened.version, uri=opened.uri)


def shard_location(ctx: StageContext) -> Path:
    """Where shard sets live: ``data.streaming.location``, else ``<shared dir>/shards``, else
    ``shards/`` in the state dir (``.dbspec/shards``; only where every process runs on this
    machine). Absolute: ranks and Spark tasks run in other working directories.

    Raises:
        DbspecError: the source converts, or ranks read, on other machines and neither the
            location nor a shared dir is set.
    """
    import os

    from dbspec.errors import DbspecError
    from dbspec.spark.session import master_url
    from dbspec.spark.placement import ranks_on_executors
    from dbspec.spec.locations import is_local_master

    location = ctx.spec.data.streaming.location
    if location is not None:
        return Path(os.path.expanduser(location)).resolve()
    if ctx.options.shared_dir:
        return Path(ctx.options.shared_dir).resolve() / "shards"
    master = ctx.spark.sparkContext.master if ctx.spark is not None \
        else master_url(ctx.spec, ctx.options.master)
    remote = (ctx.spark is not None or ranks_on_executors(ctx.spec)) \
        and not is_local_master(master)
    if remote:
        raise DbspecError(f"data.streaming.location: the shards are written or read on the "
                          f"executors of {master}, which cannot see this machine's disk; set "
                          "data.streaming.location or spark.shared_dir to a directory every "
                          "node mounts")
    return (ctx.project_dir / "shards").resolve()  # the state dir (.dbspec by default)


def shard_set_of(ctx: StageContext):
    """The shard set ``load_data`` wrote, or None when the rows are in memory."""
    from dbspec.data.shards import open_shard_set

    shards = ctx.output(LoadDataOutput).shards
    return open_shard_set(Path(shards)) if shards else None


def load_data_access(ctx: StageContext):
    """The prepared data as later stages read it: streamed from shards or in memory
    (:mod:`dbspec.data.access`)."""
    from dbspec.data.access import InMemoryData, StreamedData

    shard_set = shard_set_of(ctx)
    if shard_set is not None:
        return StreamedData(shard_set)
    splits = store.read_splits(ctx.dir_of("split"))
    if ctx.output(LoadDataOutput).features is not None:  # the encoded matrix of preprocess
        table = store.read_table(ctx.dir_of("load_data"), ctx.output(LoadDataOutput).to_json(),
                                 ctx.dir_of("preprocess"))
        return InMemoryData(table, splits, raw=ctx.dir_of("load_data") / "raw.parquet")
    return InMemoryData(load_table(ctx), splits)


def load_table(ctx: StageContext) -> Table:
    """The table written by ``load_data``."""
    return store.read_table(ctx.dir_of("load_data"), ctx.output(LoadDataOutput).to_json())


class SplitStage:
    """Reproducible train/validation/test row indices (stratified for classification)."""

    name = "split"

    def run(self, ctx: StageContext) -> SplitOutput:
        if ctx.spec.data.streaming is not None:
            return _hash_split(ctx)
        limit = SMOKE_ROWS if ctx.options.smoke else None
        return _write_splits(ctx, split_rows(load_table(ctx), ctx.spec.data, limit=limit))


def _write_splits(ctx: StageContext, splits: Splits) -> SplitOutput:
    store.write_splits(ctx.directory, splits)
    return SplitOutput(train=len(splits.train), validation=len(splits.validation),
                       test=len(splits.test))


def _hash_split(ctx: StageContext) -> SplitOutput:
    """The split of a ``data.streaming`` spec: decided by ``load_data`` (shards are written
    per split; in memory, each row's split code is stored beside the table)."""
    import numpy as np

    shard_set = shard_set_of(ctx)
    if shard_set is not None:
        return SplitOutput(train=shard_set.rows("train"),
                           validation=shard_set.rows("validation"), test=shard_set.rows("test"))
    codes = np.load(ctx.dir_of("load_data") / "hash_split.npy")
    return _write_splits(ctx, Splits(*(np.flatnonzero(codes == code) for code in range(3))))


class PreprocessStage:
    """Fit preprocessing on the training rows only."""

    name = "preprocess"

    def run(self, ctx: StageContext) -> PreprocessOutput:
        shard_set = shard_set_of(ctx)
        if shard_set is not None:
            from dbspec.data.statistics import fit_streamed

            stats = fit_streamed(ctx.spec.data, shard_set)
            steps = store.write_preprocessing(ctx.directory, stats.fitted)
            write_json(ctx.directory / "stats.json", stats.to_json())
            how = "exact" if stats.exact else f"quantiles from {stats.sampled_rows:,} sampled rows"
            ctx.reporter.line(f"  fitted on {shard_set.rows('train'):,} streamed training rows "
                              f"({how})")
            return PreprocessOutput(steps=[step["kind"] for step in steps])
        table, splits = load_table(ctx), store.read_splits(ctx.dir_of("split"))
        if ctx.output(LoadDataOutput).features is not None:
            return _preprocess_typed(ctx, table, splits)
        steps = store.write_preprocessing(ctx.directory,
                                          fit_preprocessing(ctx.spec.data, table, splits.train))
        return PreprocessOutput(steps=[step["kind"] for step in steps])


def _preprocess_typed(ctx: StageContext, table: Table, splits: Splits) -> PreprocessOutput:
    """Fit every typed feature on the training rows (vocabularies, tokenizers), encode all rows
    into one matrix (``encoded.npz``, the fitted inputs in ``inputs.json``), then fit the
    numeric preprocessing steps on its numeric columns."""
    import json
    import time

    import numpy as np
    import pyarrow.parquet as pq
    from pydantic import TypeAdapter

    from dbspec.models.encoding import encode_columns, fit_inputs, matrix_names
    from dbspec.models.inputs import InputError
    from dbspec.spec.sections.features import TypedFeature

    started = time.perf_counter()
    adapter = TypeAdapter(TypedFeature)
    features = [adapter.validate_python(f) for f in ctx.output(LoadDataOutput).features]
    raw = pq.read_table(ctx.dir_of("load_data") / "raw.parquet").to_pandas()
    inputs = fit_inputs(features, raw.iloc[splits.train].reset_index(drop=True),
                        ctx.spec.model.pretrained)
    try:
        x = encode_columns(inputs, raw)
    except InputError as exc:
        raise DataError(f"data.features: {exc}") from None
    names = matrix_names(inputs)
    np.savez(ctx.directory / "encoded.npz", features=x)
    (ctx.directory / "inputs.json").write_text(json.dumps(inputs))
    numeric_names = {i["name"] for i in inputs if i["type"] == "numeric"}
    numeric = [j for j, name in enumerate(names) if name in numeric_names]
    encoded = Table(x, table.target, names, table.classes)
    steps = store.write_preprocessing(ctx.directory, fit_preprocessing(
        ctx.spec.data, encoded, splits.train, numeric=numeric))
    for item in inputs:
        if "indices" in item:
            ctx.reporter.line(f"  {item['name']} ({item['type']}): {item['indices']:,} indices "
                              + ("of the checkpoint's tokenizer" if "config" in item
                                 else "fitted on the training rows"))
    ctx.reporter.line(f"  encoded {len(x):,} rows into {x.shape[1]:,} columns in "
                      f"{time.perf_counter() - started:.1f}s")
    return PreprocessOutput(steps=[step["kind"] for step in steps])
