"""The data stages' files: the checked table, the split indices and the fitted preprocessing."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any, Optional

import numpy as np

from dbspec.data.prepare import FittedStep, Splits, Table


def write_table(directory: Path, table: Table) -> None:
    np.savez(directory / "table.npz", features=table.features, target=table.target)


def write_raw_features(directory: Path, frame: Any) -> None:
    """The typed features' columns as read (strings, image bytes, lists), for ``preprocess``
    to fit and encode: ``raw.parquet``.

    Raises:
        DataError: a column Arrow cannot store (values of mixed kinds in one column).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    from dbspec.data.sources import DataError

    try:
        arrow = pa.Table.from_pandas(frame, preserve_index=False)
    except (pa.ArrowException, TypeError, ValueError) as exc:
        raise DataError(f"data.features: the feature columns cannot be stored: {exc}") from None
    pq.write_table(arrow, Path(directory) / "raw.parquet")


def read_table(directory: Path, meta: dict[str, Any],
               preprocess: Optional[Path] = None) -> Table:
    """The table ``load_data`` wrote in ``directory`` (``meta``: its output). With typed
    features and the ``preprocess`` stage's directory, its features are the encoded matrix
    ``preprocess`` wrote, with the fitted inputs."""
    arrays = np.load(Path(directory) / "table.npz")
    if meta.get("features") is not None and preprocess is not None:
        inputs = json.loads((Path(preprocess) / "inputs.json").read_text())
        features = np.load(Path(preprocess) / "encoded.npz")["features"]
        names = [column for item in inputs for column in item["columns"]]
        return Table(features, arrays["target"], names, meta["classes"], inputs)
    return Table(arrays["features"], arrays["target"], meta["feature_names"], meta["classes"])


def write_splits(directory: Path, splits: Splits) -> None:
    np.savez(directory / "splits.npz", **asdict(splits))


def read_splits(directory: Path) -> Splits:
    return Splits(**np.load(Path(directory) / "splits.npz"))


def write_preprocessing(directory: Path, fitted: list[FittedStep]) -> list[dict[str, Any]]:
    steps = [asdict(step) for step in fitted]
    (directory / "preprocessing.json").write_text(json.dumps(steps, indent=2))
    return steps


def read_preprocessing(directory: Path) -> list[FittedStep]:
    raw = json.loads((Path(directory) / "preprocessing.json").read_text())
    return [FittedStep(**step) for step in raw]
