"""The pyfunc under MLflow's scoring server: records for the server, a DataFrame elsewhere, and a
frozen heap only in a server process. The real ``mlflow models serve`` round trip (``inputs``,
``dataframe_split``, ``dataframe_records``) is tested in tests/serving/test_course_code.py.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from dbspec.models.served import ModelCard, ServedModel, save_served_model
from tests.conftest import checkout_env

SERVING_FLAG = "_MLFLOW_IS_IN_SERVING_ENVIRONMENT"


def served(task: str = "regression", **overrides) -> ServedModel:
    out = {"regression": 1, "binary": 1, "multiclass": 3}[task]
    base = dict(task=task, loss={"regression": "mse", "binary": "bce",
                                 "multiclass": "cross_entropy"}[task],
                feature_names=["a", "b"], out_features=out,
                model={"layers": [{"linear": {"out": out}}]},
                preprocessing=[{"kind": "scale", "columns": [0, 1],
                                "params": {"center": [1.0, 2.0], "scale": [2.0, 4.0]}}],
                classes={"regression": None, "binary": [0, 1],
                         "multiclass": ["x", "y", "z"]}[task],
                target_mean=100.0, target_std=10.0,
                feature_ranges={"low": [0.0, 0.0], "high": [10.0, 10.0]})
    return ServedModel(ModelCard(**{**base, **overrides})).eval()


@pytest.fixture
def pyfunc_of(tmp_path):
    """A loaded DbspecPyfuncModel around a served model, as MLflow loads it."""
    from dbspec.models.pyfunc import DbspecPyfuncModel

    def load(model: ServedModel, model_config=None) -> DbspecPyfuncModel:
        python_model = DbspecPyfuncModel()
        directory = save_served_model(model, tmp_path / "served")
        python_model.load_context(SimpleNamespace(artifacts={"served_model": str(directory)},
                                                  model_config=model_config))
        return python_model

    return load


@pytest.mark.parametrize("task", ["regression", "binary", "multiclass"])
def test_the_server_gets_the_json_the_dataframe_would_give(task, pyfunc_of, monkeypatch):
    from mlflow.pyfunc.scoring_server import predictions_to_json

    model = pyfunc_of(served(task))
    rows = pd.DataFrame({"b": [3.0, 7.5, np.nan], "a": [1.0, 2.0, 4.0]})
    frame = model.predict(None, rows)
    assert isinstance(frame, pd.DataFrame)
    monkeypatch.setenv(SERVING_FLAG, "true")
    records = model.predict(None, rows)
    assert isinstance(records, list)  # a NaN row (no imputation here) compares unequal: JSON does
    answers = []
    for answer in (frame, records):
        text = io.StringIO()
        predictions_to_json(answer, text)
        answers.append(text.getvalue())
    assert answers[0] == answers[1]
    assert len(json.loads(answers[1])["predictions"]) == 3


def test_out_of_range_rows_are_logged_when_serving_too(pyfunc_of, monkeypatch, caplog):
    monkeypatch.setenv(SERVING_FLAG, "true")
    model = pyfunc_of(served())
    with caplog.at_level("WARNING", logger="dbspec.model"):
        records = model.predict(None, np.array([[1.0, 2.0], [1.0, 99.0]]))
    assert len(records) == 2
    [record] = caplog.records
    assert "1 of 2 row(s)" in record.getMessage() and "b=99" in record.getMessage()


def test_the_logged_out_of_range_action_holds(pyfunc_of, monkeypatch, caplog):
    from mlflow.exceptions import MlflowException

    from dbspec.models.inputs import InputError
    from dbspec.models.pyfunc import out_of_range_config

    far = np.array([[1.0, 2.0], [1.0, 99.0]])
    rejecting = pyfunc_of(served(), out_of_range_config("reject", 0.5))
    assert len(rejecting.predict(None, far[:1])) == 1  # rows in range are scored
    with pytest.raises(InputError, match=r"1 of 2 row\(s\) lie far outside .*reject\): row 1: "
                                         r"b=99 \(trained on 0..10\)"):
        rejecting.predict(None, far)
    monkeypatch.setenv(SERVING_FLAG, "true")
    with pytest.raises(MlflowException, match="serving.out_of_range: reject") as raised:
        rejecting.predict(None, far)
    assert raised.value.get_http_status_code() == 400
    with caplog.at_level("WARNING", logger="dbspec.model"):
        assert len(pyfunc_of(served(), out_of_range_config("off", 0.5)).predict(None, far)) == 2
        # a wider tolerance: 99 lies within 10 spans of 0..10
        assert len(pyfunc_of(served(), out_of_range_config("warn", 10)).predict(None, far)) == 2
    assert not caplog.records


def test_an_unknown_out_of_range_action_is_refused_at_load(pyfunc_of):
    from dbspec.models.inputs import InputError

    with pytest.raises(InputError, match="out_of_range.action is 'rejct'; expected warn, reject"):
        pyfunc_of(served(), {"out_of_range": {"action": "rejct"}})


def test_bad_input_is_refused_the_same_way_when_serving(pyfunc_of, monkeypatch):
    from mlflow.exceptions import MlflowException

    from dbspec.models.inputs import InputError

    with pytest.raises(InputError, match="the input has 3 columns; the model takes 2"):
        pyfunc_of(served()).predict(None, np.zeros((1, 3)))
    # answering MLflow's scoring server, the same message as an MlflowException: the server
    # answers it with a 400 and that message, any other exception with a generic one
    monkeypatch.setenv(SERVING_FLAG, "true")
    with pytest.raises(MlflowException, match="the input has 3 columns; the model takes 2") \
            as raised:
        pyfunc_of(served()).predict(None, np.zeros((1, 3)))
    assert raised.value.get_http_status_code() == 400


_LOAD_AND_COUNT = """
import gc, sys
from types import SimpleNamespace
from dbspec.models.pyfunc import DbspecPyfuncModel
DbspecPyfuncModel().load_context(SimpleNamespace(artifacts={"served_model": sys.argv[1]}))
print(gc.get_freeze_count())
"""


@pytest.mark.parametrize("server", [True, False])
def test_the_heap_is_frozen_only_in_a_server_process(server, tmp_path):
    directory = save_served_model(served(), tmp_path / "served")
    env = checkout_env({"__pyfunc_model_path__": str(tmp_path)} if server else {})
    if not server:
        env.pop("__pyfunc_model_path__", None)
    env.pop(SERVING_FLAG, None)
    result = subprocess.run([sys.executable, "-c", _LOAD_AND_COUNT, str(directory)], env=env,
                            capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr
    frozen = int(result.stdout.split()[-1])
    assert (frozen > 10_000) if server else frozen == 0
