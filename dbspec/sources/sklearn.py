"""``data.source.kind: sklearn``: a data set that ships with scikit-learn (no download)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Literal, Optional

from dbspec.errors import did_you_mean
from dbspec.seams.sources import Finding
from dbspec.sources.common import GeneratedSource
from dbspec.spec.datasets import BUILTIN_DATASETS
from dbspec.spec.sections.base import SpecModel, d

BuiltinDataset = Literal["diabetes", "digits", "breast_cancer", "iris", "wine"]


class SklearnSource(SpecModel):
    """A data set that ships with scikit-learn (no download)."""

    kind: Literal["sklearn"] = d("Source kind: a scikit-learn built-in data set.")
    name: BuiltinDataset = d("Which built-in data set: diabetes, digits, breast_cancer, iris, wine.")


def _unknown_columns(path: tuple, columns, known: tuple[str, ...]) -> Iterable[Finding]:
    for index, column in enumerate(columns or ()):
        if column not in known:
            yield Finding(path + (index,), f"no column '{column}'{did_you_mean(column, known)} "
                          f"in this data set; it has: {', '.join(known[:12])}"
                          + (", ..." if len(known) > 12 else ""))


class SklearnKind(GeneratedSource):
    """Loaded from scikit-learn's package data; its columns and classes are known at validate."""

    name = "sklearn"
    model = SklearnSource

    def check(self, spec):
        """The task, the target's name and every named column against the data set."""
        data, source = spec.data, spec.data.source
        info = BUILTIN_DATASETS[source.name]
        if info.task != data.task and not (info.task == "binary" and data.task == "multiclass"):
            yield Finding(("data", "task"), f"'{source.name}' is a {info.task} data set, not "
                          f"{data.task}; set task: {info.task}")
        if data.target != "target":
            yield Finding(("data", "target"), f"built-in data sets name their target 'target', "
                          f"not '{data.target}'")
        yield from _unknown_columns(("data", "features"), data.feature_names, info.features)
        for index, step in enumerate(data.preprocessing):
            if step.args.columns != "all":
                yield from _unknown_columns(("data", "preprocessing", index, step.key),
                                            step.args.columns, info.features)

    def known_width(self, source) -> int:
        """The data set's feature columns."""
        return len(BUILTIN_DATASETS[source.name].features)

    def known_classes(self, source) -> Optional[int]:
        """The data set's classes (None for a regression set)."""
        return BUILTIN_DATASETS[source.name].classes

    def version(self, data, *, base: Path) -> str:
        """The scikit-learn release and the data set's name."""
        from importlib.metadata import version

        return f"sklearn-{version('scikit-learn')}-{data.source.name}"

    def frame(self, data):
        """The data set as scikit-learn's frame (features and ``target``)."""
        from sklearn import datasets

        return getattr(datasets, f"load_{data.source.name}")(as_frame=True).frame

    def uri_of(self, data) -> str:
        """``sklearn:<name>``."""
        return f"sklearn:{data.source.name}"


SOURCE = SklearnKind()
