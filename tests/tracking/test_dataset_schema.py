"""The logged dataset's schema is MLflow's own inference, computed without a Python loop over
every value (which took most of a smoke run on the 200,000-row monitoring spec)."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd

from dbspec.tracking.mlflow_tracking import dataset_schema


def test_the_schema_is_what_mlflow_infers_from_all_rows():
    from mlflow.types.utils import _infer_schema

    rng = np.random.default_rng(0)
    frame = pd.DataFrame(rng.normal(size=(5000, 4)), columns=["a", "b", "c", "d"])
    frame.loc[4321, "c"] = np.nan  # missing far past the sample: the column is not required
    frame["label"] = rng.integers(0, 3, 5000)
    frame["name"] = [f"row{i}" for i in range(5000)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # MLflow's hint about integer columns
        expected, found = _infer_schema(frame), dataset_schema(frame, sample_rows=100)
    assert found.to_json() == expected.to_json()
    assert [spec.required for spec in found.inputs] == [True, True, False, True, True, True]
