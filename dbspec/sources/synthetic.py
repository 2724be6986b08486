"""``data.source.kind: synthetic``: generated data with a known structure, reproducible from
the seed (tabular here; ``text`` and ``mixed`` generators in :mod:`dbspec.data.synthetic`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal, Optional

from dbspec.seams.sources import Finding
from dbspec.sources.common import GeneratedSource
from dbspec.spec.sections.base import SpecModel, d


class SyntheticSource(SpecModel):
    """Generated data with a known structure, reproducible from the seed."""

    kind: Literal["synthetic"] = d("Source kind: generated data.")
    rows: int = d("Number of rows.", default=10_000, ge=10, le=100_000_000)
    features: int = d("Number of feature columns (named f0, f1, ...).", default=100, ge=1,
                      le=100_000)
    informative: Optional[int] = d("How many features carry signal; default: all, up to 10.",
                                   default=None, ge=1)
    generator: Literal["tabular", "text", "text_words", "mixed"] = d(
        "tabular: numeric columns f0..fN; text: a 'text' column of generated sentences whose "
        "class depends on words and their order; text_words: the same sentences, but the "
        "class follows from the words used (a bag of words tells it); mixed: numeric columns "
        "plus high-cardinality categorical ID columns whose effect only an embedding can "
        "learn.", default="tabular")
    cardinality: int = d("Distinct IDs per categorical column (generator: mixed).",
                         default=2_000, ge=2, le=10_000_000)
    classes: int = d("Classes for binary/multiclass tasks.", default=2, ge=2, le=10_000)
    noise: float = d("Noise level added to the signal.", default=0.1, ge=0)
    seed: int = d("Random seed of the generator.", default=0, ge=0)


class SyntheticKind(GeneratedSource):
    """Made on the driver from the section's settings; width and classes known at validate."""

    name = "synthetic"
    model = SyntheticSource
    uri = "synthetic"

    def check(self, spec):
        """More informative features than features; a binary task with other than 2 classes."""
        data, source = spec.data, spec.data.source
        if source.informative is not None and source.informative > source.features:
            yield Finding(("data", "source", "informative"), f"{source.informative} informative "
                          f"features but only {source.features} features")
        if data.task == "binary" and source.classes != 2:
            yield Finding(("data", "source", "classes"), "a binary task has 2 classes")

    def known_width(self, source) -> int:
        return source.features

    def known_classes(self, source) -> int:
        return source.classes

    def version(self, data, *, base: Path) -> str:
        """A digest of the settings (tabular data keeps the version it had before generators)."""
        from dbspec.data.sources import digest

        params = data.source.model_dump(mode="json")
        if data.source.generator == "tabular":
            params = {k: v for k, v in params.items() if k not in ("generator", "cardinality")}
        return "synthetic-" + digest(json.dumps(params, sort_keys=True).encode())

    def frame(self, data):
        """Generated rows; ``generator: text`` and ``mixed`` live in :mod:`dbspec.data.synthetic`.

        The tabular path below must keep producing the same rows for the same settings: runs and
        their cached stages are keyed on them.
        """
        from dbspec.data.sources import DataError

        if data.source.generator in ("text", "text_words"):
            from dbspec.data.synthetic import TEXT_MAX_CLASSES, generate_text

            if data.task == "regression":
                raise DataError(f"data.source.generator: {data.source.generator} makes a "
                                "classification corpus; use task binary or multiclass")
            if data.source.classes > TEXT_MAX_CLASSES:
                raise DataError(f"data.source.classes: the text generator makes 2 to "
                                f"{TEXT_MAX_CLASSES} classes (every document names an actor of "
                                f"each class); got {data.source.classes}")
            return generate_text(data.source, data.source.generator == "text_words")
        if data.source.generator == "mixed":
            from dbspec.data.synthetic import generate_mixed

            return generate_mixed(data.source, data.task)
        import numpy as np
        import pandas as pd
        from sklearn.datasets import make_classification, make_regression

        source = data.source
        informative = source.informative or min(source.features, 10)
        if data.task == "regression":
            x, y = make_regression(n_samples=source.rows, n_features=source.features,
                                   n_informative=informative, noise=source.noise * 100,
                                   random_state=source.seed)
        else:
            x, y = make_classification(
                n_samples=source.rows, n_features=source.features, n_informative=informative,
                n_redundant=0, n_classes=source.classes, flip_y=min(source.noise, 0.5),
                n_clusters_per_class=1, random_state=source.seed)
        frame = pd.DataFrame(x.astype(np.float32), columns=[f"f{i}" for i in range(source.features)])
        frame["target"] = y.astype(np.float32 if data.task == "regression" else np.int64)
        return frame


SOURCE = SyntheticKind()
