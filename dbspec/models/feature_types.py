"""Which features a spec trains on, and the type of each: declared, or read off its column
(:mod:`.encoding` then fits and encodes them).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from dbspec.data.sources import DataError
from dbspec.errors import did_you_mean
from dbspec.models.encoding import NUMERIC_KINDS, listing
from dbspec.spec.sections.data import DataSpec
from dbspec.spec.sections.features import CategoricalFeature, NumericFeature


def resolve_features(data: DataSpec, frame: pd.DataFrame) -> list:
    """The typed spec of every feature column, in the order of ``data.features`` (unset: the
    frame's columns but the target). A plain name is typed by its column: numbers and booleans
    are numeric, a pandas ``category`` column is categorical.

    Raises:
        DataError: a missing column, or one whose values leave its type open (strings, bytes,
            lists): the message says which entry to write.
    """
    labels = {str(c): c for c in frame.columns}
    names = data.feature_names or [c for c in labels if c != data.target]
    declared = data.declared_types
    features = []
    for name in names:
        if name not in labels:
            raise DataError(f"data.features: no column '{name}'{did_you_mean(name, labels)}; "
                            f"the data has: {listing(list(labels))}")
        features.append(declared.get(name) or _typed_by_column(name, frame[labels[name]]))
    return features


def _typed_by_column(name: str, column: pd.Series) -> Any:
    if column.dtype.kind in NUMERIC_KINDS:
        return NumericFeature(name=name, type="numeric")
    if isinstance(column.dtype, pd.CategoricalDtype):
        return CategoricalFeature(name=name, type="categorical")
    held = pd.api.types.infer_dtype(column, skipna=True)
    if held in ("integer", "floating", "mixed-integer-float", "boolean", "decimal"):
        return NumericFeature(name=name, type="numeric")  # numbers with None among them
    where = f"data.features: column '{name}'"
    first = next(iter(column.dropna()), None)
    if held == "string" or (held.startswith("mixed") and isinstance(first, str)):
        raise DataError(f"{where} holds strings: declare its type, '- {{name: {name}, type: "
                        f"text}}' or '- {{name: {name}, type: categorical}}'")
    if held == "bytes":
        raise DataError(f"{where} holds bytes: declare it an image with the size to resize "
                        f"to, '- {{name: {name}, type: image, height: 64, width: 64}}'")
    if isinstance(first, (list, tuple, np.ndarray)):
        values = "numeric" if all(isinstance(v, (int, float, np.number)) and
                                  not isinstance(v, bool) for v in first) else "tokens"
        raise DataError(f"{where} holds lists: declare a sequence, '- {{name: {name}, type: "
                        f"sequence, values: {values}}}'")
    if first is None:
        raise DataError(f"{where} has no values to tell its type by: declare it, e.g. "
                        f"'- {{name: {name}, type: numeric}}', or leave it out")
    raise DataError(f"{where} holds {held} values ({column.dtype}): convert it to numbers, "
                    "or declare its type (numeric, categorical, text, sequence or image)")
