"""load_data, split and preprocess: source rows to split arrays and fitted preprocessing."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from dbspec.data.prepare import FittedStep, Splits, Table, build_table, fit_preprocessing, split_rows
from dbspec.data.sources import read_source
from dbspec.stages.base import SMOKE_ROWS, StageContext, write_json


class LoadDataStage:
    """Read the source, check features and target, store them as arrays."""

    name = "load_data"

    def run(self, ctx: StageContext) -> dict[str, Any]:
        source = read_source(ctx.spec.data, base=Path.cwd())
        table = build_table(source.frame, ctx.spec.data)
        np.savez(ctx.directory / "table.npz", features=table.features, target=table.target)
        meta = {"rows": len(table.target), "feature_names": table.feature_names,
                "classes": table.classes, "data_version": source.version, "uri": source.uri}
        write_json(ctx.directory / "table.json", meta)
        return meta


def load_table(ctx: StageContext) -> Table:
    """The table written by ``load_data``."""
    arrays = np.load(ctx.dir_of("load_data") / "table.npz")
    meta = ctx.output_of("load_data")
    return Table(arrays["features"], arrays["target"], meta["feature_names"], meta["classes"])


class SplitStage:
    """Reproducible train/validation/test row indices (stratified for classification)."""

    name = "split"

    def run(self, ctx: StageContext) -> dict[str, Any]:
        table = load_table(ctx)
        limit = SMOKE_ROWS if ctx.options.smoke else None
        splits = split_rows(table, ctx.spec.data, limit=limit)
        np.savez(ctx.directory / "splits.npz", train=splits.train, validation=splits.validation,
                 test=splits.test)
        return {"train": len(splits.train), "validation": len(splits.validation),
                "test": len(splits.test)}


def load_splits(ctx: StageContext) -> Splits:
    """The indices written by ``split``."""
    arrays = np.load(ctx.dir_of("split") / "splits.npz")
    return Splits(arrays["train"], arrays["validation"], arrays["test"])


class PreprocessStage:
    """Fit preprocessing on the training rows only."""

    name = "preprocess"

    def run(self, ctx: StageContext) -> dict[str, Any]:
        table, splits = load_table(ctx), load_splits(ctx)
        fitted = fit_preprocessing(ctx.spec.data, table, splits.train)
        steps = [asdict(step) for step in fitted]
        write_json(ctx.directory / "preprocessing.json", steps)
        return {"steps": [step["kind"] for step in steps]}


def load_preprocessing(ctx: StageContext) -> list[FittedStep]:
    """The fitted steps written by ``preprocess``."""
    import json

    raw = json.loads((ctx.dir_of("preprocess") / "preprocessing.json").read_text())
    return [FittedStep(**step) for step in raw]
