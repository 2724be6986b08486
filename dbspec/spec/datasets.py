"""What dbspec knows about scikit-learn's built-in data sets without loading them.

Shapes and feature names let ``dbspec validate`` infer layer sizes in a PR check that has no
scikit-learn installed. A test compares this table with scikit-learn itself.
"""

from __future__ import annotations

from typing import NamedTuple, Optional


class BuiltinDataset(NamedTuple):
    """Facts about one built-in data set."""

    rows: int
    features: tuple[str, ...]
    task: str
    classes: Optional[int] = None


def _pixels() -> tuple[str, ...]:
    return tuple(f"pixel_{r}_{c}" for r in range(8) for c in range(8))


_BREAST_CANCER = tuple(
    pattern.format(name)
    for pattern in ("mean {}", "{} error", "worst {}")
    for name in ("radius", "texture", "perimeter", "area", "smoothness", "compactness",
                 "concavity", "concave points", "symmetry", "fractal dimension")
)

BUILTIN_DATASETS: dict[str, BuiltinDataset] = {
    "diabetes": BuiltinDataset(442, ("age", "sex", "bmi", "bp", "s1", "s2", "s3", "s4", "s5", "s6"),
                               "regression"),
    "digits": BuiltinDataset(1797, _pixels(), "multiclass", 10),
    "breast_cancer": BuiltinDataset(569, _BREAST_CANCER, "binary", 2),
    "iris": BuiltinDataset(150, ("sepal length (cm)", "sepal width (cm)", "petal length (cm)",
                                 "petal width (cm)"), "multiclass", 3),
    "wine": BuiltinDataset(178, ("alcohol", "malic_acid", "ash", "alcalinity_of_ash", "magnesium",
                                 "total_phenols", "flavanoids", "nonflavanoid_phenols",
                                 "proanthocyanins", "color_intensity", "hue",
                                 "od280/od315_of_diluted_wines", "proline"), "multiclass", 3),
}
