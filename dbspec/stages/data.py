"""load_data, split and preprocess: source rows to split arrays and fitted preprocessing."""

from __future__ import annotations

from pathlib import Path
from dbspec.data import store
from dbspec.data.prepare import FittedStep, Splits, Table, build_table, fit_preprocessing, split_rows
from dbspec.data.sources import read_source
from dbspec.stages.base import SMOKE_ROWS, StageContext, write_json
from dbspec.stages.outputs import LoadDataOutput, PreprocessOutput, SplitOutput


class LoadDataStage:
    """Read the source, check features and target, store them as arrays."""

    name = "load_data"

    def run(self, ctx: StageContext) -> LoadDataOutput:
        if ctx.spark is not None:
            from dbspec.data.spark_sources import read_source_spark

            source = read_source_spark(ctx.spark, ctx.spec.data, base=Path.cwd())
        else:
            source = read_source(ctx.spec.data, base=Path.cwd())
        table = build_table(source.frame, ctx.spec.data)
        store.write_table(ctx.directory, table)
        output = LoadDataOutput(rows=len(table.target), feature_names=table.feature_names,
                                classes=table.classes, data_version=source.version,
                                uri=source.uri)
        write_json(ctx.directory / "table.json", output.to_json())
        return output


def load_table(ctx: StageContext) -> Table:
    """The table written by ``load_data``."""
    return store.read_table(ctx.dir_of("load_data"), ctx.output(LoadDataOutput).to_json())


class SplitStage:
    """Reproducible train/validation/test row indices (stratified for classification)."""

    name = "split"

    def run(self, ctx: StageContext) -> SplitOutput:
        table = load_table(ctx)
        limit = SMOKE_ROWS if ctx.options.smoke else None
        splits = split_rows(table, ctx.spec.data, limit=limit)
        store.write_splits(ctx.directory, splits)
        return SplitOutput(train=len(splits.train), validation=len(splits.validation),
                           test=len(splits.test))


def load_splits(ctx: StageContext) -> Splits:
    """The indices written by ``split``."""
    return store.read_splits(ctx.dir_of("split"))


class PreprocessStage:
    """Fit preprocessing on the training rows only."""

    name = "preprocess"

    def run(self, ctx: StageContext) -> PreprocessOutput:
        table, splits = load_table(ctx), load_splits(ctx)
        steps = store.write_preprocessing(ctx.directory,
                                          fit_preprocessing(ctx.spec.data, table, splits.train))
        return PreprocessOutput(steps=[step["kind"] for step in steps])


def load_preprocessing(ctx: StageContext) -> list[FittedStep]:
    """The fitted steps written by ``preprocess``."""
    return store.read_preprocessing(ctx.dir_of("preprocess"))
