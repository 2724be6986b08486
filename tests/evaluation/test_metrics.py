"""Classification metrics take a float32 model's probabilities without sklearn's warnings."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from dbspec.evaluation.metrics import classification_metrics


def softmax32(logits: np.ndarray) -> np.ndarray:
    exp = np.exp(logits - logits.max(axis=1, keepdims=True)).astype(np.float32)
    return exp / exp.sum(axis=1, keepdims=True)


def test_multiclass_probabilities_give_no_warning_and_the_right_log_loss():
    rng = np.random.default_rng(0)
    probabilities = softmax32(rng.normal(0, 4, (300, 10)))
    probabilities[0] = np.eye(10, dtype=np.float32)[3]  # a certain row, clipped at 0
    y = rng.integers(0, 10, 300)
    assert not np.allclose(probabilities.astype(np.float64).sum(axis=1), 1, atol=1e-12, rtol=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # sklearn's "y_prob values do not sum to one" fails here
        found = classification_metrics(y, probabilities, ["log_loss", "roc_auc", "accuracy"],
                                       binary=False)
    full = np.clip(probabilities.astype(np.float64), 1e-7, 1)
    full /= full.sum(axis=1, keepdims=True)
    expected = -np.mean(np.log(full[np.arange(300), y]))
    assert found["log_loss"] == pytest.approx(expected, rel=1e-9)
    assert found["accuracy"] == pytest.approx(np.mean(probabilities.argmax(axis=1) == y))


def test_binary_probabilities_of_exactly_0_and_1_give_a_finite_log_loss():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        found = classification_metrics(np.array([0, 1, 1, 0]),
                                       np.array([0.0, 1.0, 0.9, 0.2], dtype=np.float32),
                                       ["log_loss"], binary=True)
    assert np.isfinite(found["log_loss"]) and found["log_loss"] < 0.2


def test_scoring_runs_the_model_on_bounded_blocks_and_keeps_every_row():
    """A 200,000-row profile sample through a 256-unit layer took 400 MiB of activations in
    one forward pass (issue 35's 6M-row peak): scoring goes SCORE_ROWS rows at a time."""
    from dbspec.stages.lifecycle import SCORE_ROWS, _score

    seen: list[int] = []

    def served(x):
        seen.append(len(x))
        return x[:, :1] * 2

    x = np.arange(2 * (2 * SCORE_ROWS + 5), dtype=np.float32).reshape(-1, 2)
    scored = _score(served, x)
    assert seen == [SCORE_ROWS, SCORE_ROWS, 5]
    assert np.array_equal(scored, x[:, :1] * 2)
    assert _score(served, x[:0]).shape == (0, 1)
