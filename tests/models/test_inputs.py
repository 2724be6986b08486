"""What a model accepts (:mod:`dbspec.models.inputs`): named or positional columns, and the
training range that flags rows the model has never seen anything like."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dbspec.models.inputs import FeatureRanges, InputError, feature_matrix, training_ranges

NAMES = ["age", "bmi", "bp"]
X = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])


@pytest.mark.parametrize("given", [
    pd.DataFrame(X, columns=NAMES),
    pd.DataFrame(X, columns=NAMES)[["bp", "age", "bmi"]],  # by name, any order
    pd.DataFrame(X, columns=NAMES).assign(id=[7, 8])[["id", "bp", "bmi", "age"]],  # extras
    X, X.tolist(), pd.DataFrame(X),  # positional: 0..n-1 columns, as pd.DataFrame(X) makes
    pd.DataFrame(X, columns=["0", "1", "2"]),  # a Spark struct of pd.DataFrame(X)'s columns
], ids=["named", "reordered", "extra-columns", "array", "list", "int-columns", "str-columns"])
def test_named_and_positional_input_give_the_same_matrix(given):
    x = feature_matrix(NAMES, given)
    assert x.dtype == np.float32 and x.flags.writeable
    assert np.array_equal(x, X.astype(np.float32))


def test_one_feature_accepts_a_flat_column():
    assert feature_matrix(["age"], [1.0, 2.0]).shape == (2, 1)


@pytest.mark.parametrize("given, message", [
    (X[:, :2], "the input has 2 columns; the model takes 3 (age, bmi, bp)"),
    (np.ones((2, 4)), "the input has 4 columns; the model takes 3"),
    (pd.DataFrame(np.ones((2, 4))), "the input has 4 columns; the model takes 3"),
    (pd.DataFrame(X, columns=["age", "bmi", "pressure"]),
     "the input has no column bp and has columns the model does not know (pressure)"),
    (pd.DataFrame(X, columns=["1", "2", "3"]), "no column age, bmi, bp"),  # not 0..n-1
    (np.ones((2, 3, 1)), "an array of shape (2, 3, 1)"),
    ([["a", "b", "c"]], "the input is not a table of numbers"),
])
def test_input_the_model_cannot_take_says_what_it_needs(given, message):
    with pytest.raises(InputError) as raised:
        feature_matrix(NAMES, given)
    assert message in str(raised.value)
    assert isinstance(raised.value, ValueError)  # what MLflow callers catch


def test_training_ranges_ignore_missing_values_and_keep_empty_columns_unbounded():
    ranges = training_ranges(np.array([[1.0, np.nan], [3.0, np.nan], [np.nan, np.nan]]))
    assert ranges == {"low": [1.0, None], "high": [3.0, None]}
    assert training_ranges(np.empty((0, 2))) == {"low": [], "high": []}


def test_rows_far_outside_the_training_range_are_flagged_and_named():
    ranges = FeatureRanges(["a", "b", "c"], [0.0, -1.0, 5.0], [10.0, 1.0, 5.0], tolerance=0.5)
    x = np.array([
        [-5.0, 2.0, 5.0],     # on the edges of the band: in range
        [15.1, 0.0, 5.0],     # a beyond max + 0.5 * span
        [0.0, -2.01, 5.0],    # b below min - 0.5 * 2
        [0.0, 0.0, 7.6],      # c constant 5 in training: 0.5 * |5| is the margin
        [np.nan, 0.0, 5.0],   # missing: for the imputer, never flagged
    ])
    outside = ranges.outside(x)
    assert outside.rows.tolist() == [1, 2, 3]
    assert outside.counts() == {"a": 1, "b": 1, "c": 1}
    assert outside.messages(x, offset=10) == [
        "row 11: a=15.1 (trained on 0..10)", "row 12: b=-2.01 (trained on -1..1)",
        "row 13: c=7.6 (trained on 5..5)"]
    assert outside.messages(x, limit=1)[-1] == "and 2 more row(s)"
    assert not ranges.outside(x[[0, 4]])


def test_a_feature_with_no_training_values_is_never_flagged():
    ranges = FeatureRanges(["a"], [None], [None])
    assert not ranges.outside(np.array([[1e30]]))


def test_models_logged_before_ranges_were_recorded_have_none():
    class Card:
        feature_names = NAMES
        feature_ranges = None

    assert FeatureRanges.of_card(Card()) is None


def test_bad_ranges_are_refused():
    with pytest.raises(ValueError, match="ranges for 1/1 features, the model has 2"):
        FeatureRanges(["a", "b"], [0.0], [1.0])
    with pytest.raises(ValueError, match="tolerance must be 0 or more"):
        FeatureRanges(["a"], [0.0], [1.0], tolerance=-1)
