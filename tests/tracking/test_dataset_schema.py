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


def test_the_logged_dataset_digest_follows_the_version_and_the_frame_not_every_value():
    from dbspec.tracking.mlflow_tracking import dataset_digest

    frame = pd.DataFrame(np.zeros((100, 3)), columns=["a", "b", "target"])
    digest = dataset_digest(frame, "delta-v3")
    assert len(digest) == 8 and digest == dataset_digest(frame.copy(), "delta-v3")
    assert dataset_digest(frame, "delta-v4") != digest  # a new version of the source
    assert dataset_digest(frame.head(50), "delta-v3") != digest  # a smoke run's rows
    assert dataset_digest(frame.drop(columns="b"), "delta-v3") != digest  # other features


def test_a_run_logs_its_dataset_with_that_digest(workdir):
    import mlflow

    from dbspec.spec.loader import load_spec
    from dbspec.tracking.mlflow_tracking import Tracker, dataset_digest
    from tests.conftest import MINIMAL

    (workdir / "spec.yaml").write_text(MINIMAL)
    tracker = Tracker(load_spec("spec.yaml").spec, workdir / ".dbspec")
    frame = pd.DataFrame({"x": [1.0, 2.0, 3.0], "target": [0, 1, 0]})
    with tracker.run() as run_id:
        tracker.log_dataset(frame, source="synthetic", target="target", version="v1",
                            name="tiny")
    (logged,) = mlflow.MlflowClient(tracker.tracking_uri).get_run(run_id).inputs.dataset_inputs
    assert logged.dataset.digest == dataset_digest(frame, "v1")
    assert logged.dataset.name == "tiny"


def test_a_dataset_too_wide_for_the_store_is_logged_without_its_schema(workdir, capsys):
    import mlflow

    from dbspec.spec.loader import load_spec
    from dbspec.tracking.mlflow_tracking import DATASET_SCHEMA_LIMIT, Tracker
    from tests.conftest import MINIMAL

    (workdir / "spec.yaml").write_text(MINIMAL)
    tracker = Tracker(load_spec("spec.yaml").spec, workdir / ".dbspec")
    narrow = pd.DataFrame({"x": [1.0, 2.0], "target": [0, 1]})
    wide = pd.DataFrame(np.zeros((2, 30_000)), columns=[f"feature_{i}" for i in range(30_000)])
    wide["target"] = [0, 1]
    with tracker.run() as run_id:
        tracker.log_dataset(narrow, source="synthetic", target="target", version="v1",
                            name="narrow")
        tracker.log_dataset(wide, source="synthetic", target="target", version="v1", name="wide")
    logged = {i.dataset.name: i.dataset for i in
              mlflow.MlflowClient(tracker.tracking_uri).get_run(run_id).inputs.dataset_inputs}
    assert "feature_29999" not in (logged["wide"].schema or "")  # the run was not lost
    assert '"name": "x"' in logged["narrow"].schema
    warned = capsys.readouterr().err
    assert "the dataset is logged without its schema: 30,001 columns make" in warned
    assert f"over MLflow's {DATASET_SCHEMA_LIMIT:,}" in warned and "narrow" not in warned


def test_an_input_example_too_wide_for_mlflow_to_check_is_left_out(capsys):
    """MLflow checks a model's input example column by column, in quadratic time: 100,000
    features kept the train stage in log_model for over half an hour."""
    from dbspec.tracking.mlflow_tracking import EXAMPLE_COLUMNS_LIMIT, served_example

    narrow = pd.DataFrame(np.zeros((2, EXAMPLE_COLUMNS_LIMIT)))
    assert served_example(narrow) is narrow and capsys.readouterr().err == ""
    assert served_example(pd.DataFrame(np.zeros((2, EXAMPLE_COLUMNS_LIMIT + 1)))) is None
    assert "the model is logged without an input example: 2,001 columns, over 2,000" in \
        capsys.readouterr().err
