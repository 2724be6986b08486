"""The served model scores frames as pandas 3 hands them out."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd

from dbspec.models.served import ModelCard, ServedModel


def test_a_read_only_frame_is_scored_without_a_warning():
    card = ModelCard(task="regression", loss="mse", feature_names=["a", "b"], out_features=1,
                     model={"layers": [{"linear": {"out": 1}}]}, preprocessing=[],
                     target_mean=10.0, target_std=2.0)
    model = ServedModel(card).eval()
    frame = pd.DataFrame({"b": [3.0, 4.0], "a": [1.0, 2.0]}, dtype=np.float32)
    assert not np.asarray(frame[["a", "b"]], dtype=np.float32).flags.writeable  # pandas 3 CoW
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch: "The given NumPy array is not writable"
        scored = model.predict_frame(frame)
    weight, bias = model.network[0].weight.detach().numpy()[0], model.network[0].bias.item()
    expected = (np.array([[1.0, 3.0], [2.0, 4.0]]) @ weight + bias) * 2.0 + 10.0
    np.testing.assert_allclose(scored["prediction"], expected, rtol=1e-5)


def test_preprocessing_leaves_the_callers_rows_as_they_were():
    import torch

    card = ModelCard(task="regression", loss="mse", feature_names=["a", "b"], out_features=1,
                     model={"layers": [{"linear": {"out": 1}}]},
                     preprocessing=[{"kind": "impute", "columns": [0], "params": {"fill": [9.0]}},
                                    {"kind": "clip", "columns": [0, 1],
                                     "params": {"low": [0.0, 0.0], "high": [5.0, 5.0]}}])
    rows = torch.tensor([[float("nan"), 7.0], [1.0, -2.0]])
    given = rows.clone()
    out = ServedModel(card).transform(rows)
    assert torch.equal(out, torch.tensor([[5.0, 5.0], [1.0, 0.0]]))
    assert torch.equal(rows.isnan(), given.isnan()) and rows[1].tolist() == [1.0, -2.0]
    assert rows[0, 1].item() == 7.0


def test_served_predictions_use_the_spec_threshold():
    import torch


    card = ModelCard(task="binary", loss="bce", feature_names=["a"], out_features=1,
                     model={"layers": [{"linear": {"out": 1}}]}, preprocessing=[],
                     classes=[0, 1], threshold=0.8)
    served = ServedModel(card).eval()
    with torch.no_grad():
        served.network[0].weight.fill_(1.0)
        served.network[0].bias.zero_()
    frame = served.predict_frame(np.array([[1.0]], dtype=np.float32))  # sigmoid(1) = 0.73
    assert frame["prediction"].tolist() == [0]
