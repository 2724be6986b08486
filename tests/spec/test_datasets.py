"""The built-in data set table matches what scikit-learn actually ships."""

from __future__ import annotations

import pytest

from dbspec.spec.datasets import BUILTIN_DATASETS

datasets = pytest.importorskip("sklearn.datasets")


@pytest.mark.parametrize("name", sorted(BUILTIN_DATASETS))
def test_table_matches_scikit_learn(name):
    bunch = getattr(datasets, f"load_{name}")(as_frame=True)
    info = BUILTIN_DATASETS[name]
    assert tuple(bunch.data.columns) == info.features
    assert len(bunch.frame) == info.rows
    assert bunch.frame.columns[-1] == "target"
    if info.classes is not None:
        assert bunch.target.nunique() == info.classes
