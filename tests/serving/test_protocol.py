"""MLflow's scoring protocol: every accepted body shape, and every refusal with its status."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dbspec.serving.protocol import RequestError, check_content_type, parse_body

NAMES = ["a", "b", "c"]
ROWS = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]


def body(value) -> bytes:
    return json.dumps(value).encode()


@pytest.mark.parametrize("payload", [
    {"inputs": ROWS},
    {"instances": ROWS},
    {"inputs": {"a": [1, 4], "b": [2, 5], "c": [3, 6]}},
    {"inputs": [{"a": 1, "b": 2, "c": 3}, {"c": 6, "b": 5, "a": 4}]},
    {"dataframe_split": {"columns": ["a", "b", "c"], "data": ROWS}},
    {"dataframe_split": {"columns": ["c", "extra", "a", "b"], "data": [[3, 9, 1, 2],
                                                                       [6, 9, 4, 5]]}},
    {"dataframe_split": {"data": ROWS}},
    {"dataframe_records": [{"a": 1, "b": 2, "c": 3}, {"a": 4, "b": 5, "c": 6, "x": "ignored"}]},
    {"inputs": ROWS, "params": {"unused": 1}},
])
def test_every_format_gives_the_rows_in_model_order(payload):
    matrix = parse_body(body(payload), NAMES)
    assert matrix.dtype == np.float32
    assert matrix.tolist() == ROWS


def test_a_single_feature_model_takes_a_flat_list():
    assert parse_body(body({"inputs": [1, 2]}), ["only"]).tolist() == [[1.0], [2.0]]


@pytest.mark.parametrize("raw, message", [
    (b"", "empty request body"),
    (b"{not json", "malformed JSON"),
    (b"[1, 2]", "must be a JSON object"),
    (body({"rows": ROWS}), "exactly one of inputs, instances, dataframe_split, "
                           "dataframe_records (unknown key: rows)"),
    (body({"inputs": ROWS, "instances": ROWS}), "not 2"),
    (body({"inputs": []}), "inputs is empty"),
    (body({"inputs": [[1, 2]]}), "rows have 2 values; the model takes 3"),
    (body({"inputs": [[1, 2, 3], [1, 2]]}), "every row must have 3 values"),
    (body({"inputs": [[1, "x", 3]]}), 'found string "x"'),
    (body({"inputs": [[1, None, 3]]}), "found null"),
    (body({"inputs": [[True, False, True]]}), "found boolean true"),
    (body({"inputs": [[1, 2, 3], [4, False, 6]]}), "found boolean false"),
    (body({"dataframe_records": [{"a": 1, "b": True, "c": 3}]}), "found boolean true"),
    (b'{"inputs": [[1, NaN, 3]]}', "NaN is not a number the model can score"),
    (b'{"inputs": [[1, Infinity, 3]]}', "Infinity is not a number the model can score"),
    (body({"inputs": [[1, 1e300, 3]]}), "out of float32 range"),
    (body({"inputs": 5}), "inputs must be a list of rows"),
    (body({"inputs": [[[1, 2, 3]]]}), "shape [1, 1, 3]"),
    (body({"dataframe_split": {"columns": ["a", "b"], "data": [[1, 2]]}}),
     "missing column(s) c"),
    (body({"dataframe_split": [1]}), "must be an object with 'columns' and 'data'"),
    (body({"dataframe_split": {"columns": ["c", "a", "b"], "data": [[1]]}}),
     "every row needs 3 values"),
    (body({"dataframe_records": [{"a": 1, "b": 2}]}), "dataframe_records[0]: missing column c"),
    (body({"dataframe_records": [1]}), "dataframe_records[0] must be a {column: value} record"),
    (body({"dataframe_records": {"a": 1}}), "must be a list of {column: value} records"),
    (body({"inputs": {"a": [1], "b": [2]}}), "missing column(s) c"),
    (body({"inputs": {"a": [1], "b": [2, 3], "c": [4]}}), "same length"),
    (b"\xff\xfe", "malformed JSON"),
    (b'{"inputs":' + b"[" * 5000 + b"x", "malformed JSON"),
    (b'{"inputs":' + b'{"a":' * 100000 + b"1" + b"}" * 100000 + b"}", "malformed JSON"),
    (body({"dataframe_split": {"columns": ["c", "b", "a"], "data": [{"a": 1}]}}),
     "every row needs 3 values"),
])
def test_bad_bodies_are_refused_with_a_400_that_says_why(raw, message):
    with pytest.raises(RequestError) as refused:
        parse_body(raw, NAMES)
    assert refused.value.status == 400
    assert message in refused.value.message


@pytest.mark.parametrize("content_type", [None, "application/json",
                                          "application/json; charset=utf-8", "Application/JSON"])
def test_json_or_no_content_type_is_accepted(content_type):
    check_content_type(content_type)


@pytest.mark.parametrize("content_type", ["text/plain", "text/csv", "application/xml"])
def test_other_content_types_are_415(content_type):
    with pytest.raises(RequestError) as refused:
        check_content_type(content_type)
    assert refused.value.status == 415
