"""Typed features encoded into one float32 matrix (:mod:`dbspec.models.encoding`): fitted on
training rows, applied to raw columns of any form, the same for training and serving."""

from __future__ import annotations

import base64
import io
import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from PIL import Image

from dbspec.data.sources import DataError
from dbspec.models.card import has_typed_inputs
from dbspec.models.encoding import (InputEncoder, encode_columns, fit_inputs,
                                    matrix_names, raw_columns, required_packages,
                                    signature_types)
from dbspec.models.feature_types import resolve_features
from dbspec.models.inputs import InputError
from dbspec.spec.sections.data import DataSpec
from dbspec.spec.sections.features import (CategoricalFeature, ImageFeature, NumericFeature,
                                           SequenceFeature, TextFeature)

NAN = np.nan


def categorical(name: str = "city", **kwargs) -> CategoricalFeature:
    return CategoricalFeature(name=name, type="categorical", **kwargs)


def text(name: str = "review", **kwargs) -> TextFeature:
    return TextFeature(name=name, type="text", **kwargs)


def image(name: str = "photo", **kwargs) -> ImageFeature:
    return ImageFeature(name=name, type="image", **kwargs)


def encode(feature, train, values):
    """Fit ``feature`` on the ``train`` values, then encode ``values``."""
    inputs = fit_inputs([feature], pd.DataFrame({feature.name: train}))
    return encode_columns(inputs, {feature.name: values})


def png(pixels, mode: str) -> bytes:
    """A lossless PNG of ``pixels`` (uint8, (h, w) for L, (h, w, 3) for RGB)."""
    buffer = io.BytesIO()
    Image.fromarray(np.asarray(pixels, dtype=np.uint8), mode=mode).save(buffer, format="PNG")
    return buffer.getvalue()


# 2 x 3 RGB image, hand-made; channel-first and flattened it reads R-plane, G-plane, B-plane
RGB = np.array([[[255, 0, 0], [0, 255, 0], [0, 0, 255]],
                [[10, 20, 30], [40, 50, 60], [70, 80, 90]]], dtype=np.uint8)
RGB_CHW = RGB.transpose(2, 0, 1).reshape(-1).astype(np.float32)
GREY = np.array([[0, 51, 102], [153, 204, 255]], dtype=np.uint8)


# --- categorical ----------------------------------------------------------------------------

def test_categorical_vocabulary_is_most_frequent_first_ties_by_key():
    train = ["b", "c", "a", "c", "b", "c", "d"]
    (fitted,) = fit_inputs([categorical()], pd.DataFrame({"city": train}))
    assert fitted["vocabulary"] == ["c", "b", "a", "d"]  # 3, 2, then a and d by key
    assert fitted["indices"] == 5 and fitted["columns"] == ["city"]
    assert fitted["spec"] == categorical().model_dump(mode="json")
    x = encode_columns([fitted], {"city": ["c", "b", "a", "d"]})
    assert x.dtype == np.float32 and x[:, 0].tolist() == [1, 2, 3, 4]


def test_categorical_min_frequency_and_max_vocabulary_send_rare_values_to_zero():
    train = ["a"] * 5 + ["b"] * 4 + ["c"] * 3 + ["d"]
    (fitted,) = fit_inputs([categorical(min_frequency=2, max_vocabulary=2)],
                           pd.DataFrame({"city": train}))
    assert fitted["vocabulary"] == ["a", "b"] and fitted["indices"] == 3
    x = encode_columns([fitted], {"city": ["a", "b", "c", "d"]})
    assert x[:, 0].tolist() == [1, 2, 0, 0]


def test_categorical_unknown_and_missing_values_are_zero():
    x = encode(categorical(), ["a", "b", None, "a"], ["b", "never seen", None, NAN, pd.NA, "a"])
    assert x[:, 0].tolist() == [2, 0, 0, 0, 0, 1]


def test_categorical_keys_agree_across_ints_floats_strings_and_bools():
    # pandas turns an int column with a missing value into floats: 5.0 is the key '5'
    (fitted,) = fit_inputs([categorical()], pd.DataFrame({"city": [5, 7, 5, None]}))
    assert fitted["vocabulary"] == ["5", "7"] and fitted["raw_dtype"] == "double"
    for values in ([5, 7, 9], [5.0, 7.0, 9.0], ["5", "7", "9"], np.array([5, 7, 9]),
                   pd.array([5, 7, 9], dtype="Int64"), pa.array([5, 7, 9])):
        assert encode_columns([fitted], {"city": values})[:, 0].tolist() == [1, 2, 0]
    assert encode(categorical(), [2.5, 2.5, 1.0], [2.5, "2.5", 1, "1.0"])[:, 0].tolist() \
        == [1, 1, 2, 0]
    flags = encode(categorical(), [True, True, False], ["True", False, True, None])
    assert flags[:, 0].tolist() == [1, 2, 1, 0]


# --- text -----------------------------------------------------------------------------------

def test_word_text_ids_lowercase_truncate_and_pad():
    train = ["The cat sat.", "the cat ran!", "A dog"]
    (fitted,) = fit_inputs([text(max_length=4)], pd.DataFrame({"review": train}))
    # the:2 cat:2, then every other token once, by key (punctuation sorts before letters)
    assert fitted["vocabulary"] == ["cat", "the", "!", ".", "a", "dog", "ran", "sat"]
    assert fitted["indices"] == 10 and fitted["columns"] == [f"review[{i}]" for i in range(4)]
    x = encode_columns([fitted], {"review": ["THE CAT, sat on the mat.", "dog!", "", None]})
    assert x.tolist() == [[3, 2, 1, 9],  # ',' is unknown (1); cut after 4 tokens
                          [7, 4, 0, 0],  # padded with 0
                          [0, 0, 0, 0], [0, 0, 0, 0]]


def test_text_keeps_case_when_told():
    x = encode(text(lowercase=False, max_length=2), ["Cat cat cat"], ["cat Cat"])
    assert x.tolist() == [[2, 3]]


def test_char_text_ids():
    (fitted,) = fit_inputs([text(tokenizer="char", max_length=5)],
                           pd.DataFrame({"review": ["abba", "Ab c"]}))
    assert fitted["vocabulary"] == ["a", "b", " ", "c"]
    x = encode_columns([fitted], {"review": ["CAB!", "ab"]})
    assert x.tolist() == [[5, 2, 3, 1, 0], [2, 3, 0, 0, 0]]


def test_text_vocabulary_size_counts_the_reserved_ids_and_min_frequency_applies():
    train = [" ".join(f"w{i}" for i in range(30) for _ in range(30 - i))]
    (fitted,) = fit_inputs([text(vocabulary_size=10)], pd.DataFrame({"review": train}))
    assert fitted["vocabulary"] == [f"w{i}" for i in range(8)] and fitted["indices"] == 10
    (fitted,) = fit_inputs([text(min_frequency=28)], pd.DataFrame({"review": train}))
    assert fitted["vocabulary"] == ["w0", "w1", "w2"]


@pytest.mark.parametrize("tokenizer", ["bpe", "wordpiece"])
def test_subword_tokenizers_train_locally_and_survive_a_json_round_trip(tokenizer):
    train = ["the quick brown fox jumps over the lazy dog",
             "a quick brown dog outpaces a lazy fox", "Foxes and dogs, quick and lazy!"] * 4
    feature = text(tokenizer=tokenizer, vocabulary_size=60, max_length=6)
    inputs = fit_inputs([feature], pd.DataFrame({"review": train}))
    fitted = inputs[0]
    vocab = json.loads(fitted["tokenizer"])["model"]["vocab"]
    assert vocab["[PAD]"] == 0 and vocab["[UNK]"] == 1
    assert 10 < fitted["indices"] <= 60 and fitted["indices"] == len(vocab)
    assert required_packages(inputs) == ["tokenizers"]

    texts = ["THE QUICK brown fox jumps over the lazy dog again", "fox", None, "zebra €"]
    x = encode_columns(inputs, {"review": texts})
    assert x.shape == (4, 6) and (x[0] > 1).all()  # cut at 6 tokens, all known
    assert x[1, 0] > 1 and (x[1, 1:] == 0).all()  # padded
    assert (x[2] == 0).all()  # missing: all padding
    assert 1 in x[3]  # € never seen: unknown
    assert np.array_equal(x[0], encode_columns(inputs, {"review": [texts[0].lower()]})[0])
    assert len(np.unique(x[0])) > 3  # words map to different ids

    again = json.loads(json.dumps(inputs))
    assert np.array_equal(InputEncoder(again).encode({"review": texts}), x)


# --- sequences ------------------------------------------------------------------------------

def test_token_sequences_from_lists_and_strings():
    feature = SequenceFeature(name="basket", type="sequence", values="tokens", max_length=3)
    train = [["milk", "eggs"], "milk bread,milk", [101, 102], None]
    (fitted,) = fit_inputs([feature], pd.DataFrame({"basket": train}))
    assert fitted["vocabulary"] == ["milk", "101", "102", "bread", "eggs"]
    assert fitted["indices"] == 7 and fitted["columns"] == ["basket[0]", "basket[1]",
                                                            "basket[2]"]
    x = encode_columns([fitted], {"basket": [["eggs", "milk", "tea", "milk"], "101, 102",
                                             (102.0,), np.array(["bread"]), None, ""]})
    assert x.tolist() == [[6, 2, 1], [3, 4, 0], [4, 0, 0], [5, 0, 0], [0, 0, 0], [0, 0, 0]]


def test_numeric_sequences_are_padded_with_nan():
    feature = SequenceFeature(name="readings", type="sequence", max_length=3)
    (fitted,) = fit_inputs([feature], pd.DataFrame({"readings": [[1.0], [2.0, 3.0]]}))
    assert "vocabulary" not in fitted and "indices" not in fitted
    x = encode_columns([fitted], {"readings": [[1, 2, 3, 4], (5.5,), np.array([6.0, 7.0]),
                                               "8 9,10", None, []]})
    expected = [[1, 2, 3], [5.5, NAN, NAN], [6, 7, NAN], [8, 9, 10], [NAN] * 3, [NAN] * 3]
    np.testing.assert_array_equal(x, np.array(expected, dtype=np.float32))


@pytest.mark.parametrize("row, message", [
    ([1.0, NAN], "column 'readings', row 1: a missing (NaN) or infinite value inside"),
    ([1.0, None], "column 'readings', row 1: a missing (NaN) or infinite value inside"),
    (["1", "x"], "column 'readings', row 1: the sequence holds an item that is not a number"),
    (7.0, "column 'readings', row 1: expected a list"),
])
def test_bad_numeric_sequences_name_column_and_row(row, message):
    feature = SequenceFeature(name="readings", type="sequence", max_length=3)
    inputs = fit_inputs([feature], pd.DataFrame({"readings": [[1.0]]}))
    values = pd.Series([[1.0], row], dtype=object)
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        encode_columns(inputs, {"readings": values})


# --- images ---------------------------------------------------------------------------------

def pixels(feature, values) -> np.ndarray:
    inputs = fit_inputs([feature], pd.DataFrame({"photo": [None]}))
    return encode_columns(inputs, {"photo": values})


def test_image_bytes_base64_and_paths_decode_to_the_same_pixels(tmp_path):
    data = png(RGB, "RGB")
    (tmp_path / "a.png").write_bytes(data)
    feature = image(height=2, width=3, normalize="none")
    x = pixels(feature, [data, bytearray(data), memoryview(data),
                         base64.b64encode(data).decode()])
    assert x.shape == (4, 18)
    for row in x:
        np.testing.assert_array_equal(row, RGB_CHW)
    by_path = pixels(image(height=2, width=3, normalize="none", format="path",
                           root=str(tmp_path)), ["a.png", str(tmp_path / "a.png")])
    np.testing.assert_array_equal(by_path, x[:2])


def test_base64_text_handed_over_as_bytes_is_decoded():
    # MLflow's scoring server passes a binary column sent in 'inputs' on as the base64 text's
    # bytes; image files are never mistaken for base64 (they start with their magic bytes)
    data = png(RGB, "RGB")
    feature = image(height=2, width=3, normalize="none")
    x = pixels(feature, [base64.b64encode(data), data])
    np.testing.assert_array_equal(x[0], x[1])
    with pytest.raises(InputError, match="column 'photo', row 0: not a decodable image"):
        pixels(feature, [base64.b64encode(b"not an image at all")])


def test_grayscale_images_and_conversion_from_rgb():
    x = pixels(image(height=2, width=3, channels=1, normalize="none"),
               [png(GREY, "L"), png(RGB, "RGB")])
    np.testing.assert_array_equal(x[0], GREY.reshape(-1))
    # Pillow's ITU-R 601-2 luma: red 255 -> 76, green -> 150, blue -> 29
    assert x[1, :3].tolist() == [76, 150, 29]
    rgb = pixels(image(height=2, width=3, normalize="none"), [png(GREY, "L")])
    np.testing.assert_array_equal(rgb[0], np.tile(GREY.reshape(-1), 3))  # grey repeated


@pytest.mark.parametrize("normalize, expected", [
    ("none", RGB_CHW),
    ("unit", RGB_CHW / 255),
    ("imagenet", (RGB_CHW.reshape(3, -1) / 255 - np.array([[0.485], [0.456], [0.406]]))
     / np.array([[0.229], [0.224], [0.225]])),
    ({"mean": [0.5, 0.5, 0.5], "std": [0.5, 0.25, 2.0]},
     (RGB_CHW.reshape(3, -1) / 255 - 0.5) / np.array([[0.5], [0.25], [2.0]])),
], ids=["none", "unit", "imagenet", "mean-std"])
def test_each_normalisation_on_exact_pixels(normalize, expected):
    x = pixels(image(height=2, width=3, normalize=normalize), [png(RGB, "RGB")])
    np.testing.assert_allclose(x[0], np.asarray(expected, dtype=np.float32).reshape(-1),
                               rtol=1e-6, atol=1e-6)


def test_images_are_resized_bilinearly_to_the_spec():
    uniform = np.full((5, 7, 3), (10, 100, 200), dtype=np.uint8)
    x = pixels(image(height=2, width=3, normalize="none"), [png(uniform, "RGB")])
    assert x.shape == (1, 18)
    np.testing.assert_array_equal(x[0], np.repeat([10.0, 100.0, 200.0], 6))
    ramp = np.tile(np.arange(0, 256, 17, dtype=np.uint8), (4, 1))  # 4 x 16, left to right
    small = pixels(image(height=2, width=4, channels=1, normalize="none"), [png(ramp, "L")])
    expected = np.asarray(Image.fromarray(ramp).resize((4, 2), Image.Resampling.BILINEAR))
    np.testing.assert_array_equal(small[0], expected.reshape(-1).astype(np.float32))
    assert np.all(np.diff(small[0][:4]) > 0)  # still a ramp, averaged


def test_pixel_arrays_nested_or_flat():
    feature = image(height=2, width=3, normalize="none", format="array")
    flat = RGB.reshape(-1).tolist()  # (H, W, C) order
    x = pixels(feature, [RGB.tolist(), RGB, flat, np.array(flat)])
    for row in x:
        np.testing.assert_array_equal(row, RGB_CHW)
    grey = pixels(image(height=2, width=3, channels=1, normalize="none", format="array"),
                  [GREY.tolist(), GREY[:, :, None], GREY.reshape(-1).tolist()])
    for row in grey:
        np.testing.assert_array_equal(row, GREY.reshape(-1))
    # an array of another size is resized like a decoded image
    big = np.repeat(np.repeat(RGB, 2, axis=0), 2, axis=1)  # 4 x 6
    resized = pixels(feature, [big.tolist()])[0]
    decoded = pixels(image(height=2, width=3, normalize="none"), [png(big, "RGB")])[0]
    np.testing.assert_allclose(resized, decoded, atol=1.0)  # decoded ones round to bytes
    assert not np.allclose(resized, RGB_CHW, atol=1.0)  # a 2x2 block of each pixel, blended


@pytest.mark.parametrize("feature, value, message", [
    (image(height=2, width=3), b"not an image",
     "column 'photo', row 1: not a decodable image (cannot identify image file)"),
    (image(height=2, width=3), "%%% not base64 %%%",
     "column 'photo', row 1: not base64-encoded image bytes"),
    (image(height=2, width=3), None,
     "column 'photo', row 1: no image (an image model cannot score a row without one)"),
    (image(height=2, width=3), 12, "column 'photo', row 1: expected image bytes"),
    (image(height=2, width=3, format="path", root="/nowhere"), "x.png",
     "column 'photo', row 1: no image file at '/nowhere/x.png'"),
    (image(height=2, width=3, format="array"), [1, 2, 3],
     "column 'photo', row 1: a flat array of 3 values; the model takes 18"),
    (image(height=2, width=3, format="array"), [[[1, 2, 3, 4, 5]]],
     "column 'photo', row 1: an array of shape (1, 1, 5) is not an image"),
])
def test_bad_images_name_column_and_row(feature, value, message):
    good = {"bytes": png(RGB, "RGB"), "path": None, "array": RGB.tolist()}[feature.format]
    values = pd.Series([good if good is not None else value, value], dtype=object)
    if feature.format == "path":
        values = pd.Series([value, value], dtype=object)
        message = message.replace("row 1", "row 0")
    with pytest.raises(InputError) as caught:
        pixels(feature, values)
    assert str(caught.value).startswith(message)


# --- other errors ---------------------------------------------------------------------------

def test_non_string_text_and_missing_columns_are_input_errors():
    inputs = fit_inputs([text(), NumericFeature(name="age", type="numeric")],
                        pd.DataFrame({"review": ["good", "bad"], "age": [1, 2]}))
    with pytest.raises(InputError, match=r"column 'review', row 2: expected text \(a string\), "
                                         r"got int 5"):
        encode_columns(inputs, {"review": ["a", None, 5], "age": [1, 2, 3]})
    with pytest.raises(InputError, match=r"the input has no column 'age' \(did you mean 'ag'\?"
                                         r"\): the model takes the columns review, age"):
        encode_columns(inputs, pd.DataFrame({"review": ["a"], "ag": [1]}))
    with pytest.raises(InputError, match="column 'age', row 1: expected a number, got str 'x'"):
        encode_columns(inputs, {"review": ["a", "b"], "age": pd.Series([1, "x"],
                                                                       dtype=object)})


def test_training_rows_that_cannot_fit_are_located_data_errors():
    with pytest.raises(DataError, match=r"^data\.features\.review: no text in the training"):
        fit_inputs([text()], pd.DataFrame({"review": [None, "", "  "]}))
    with pytest.raises(DataError, match=r"^data\.features\.review: column 'review', row 1: "
                                        r"expected text \(a string\), got float 1\.5"):
        fit_inputs([text()], pd.DataFrame({"review": ["ok", 1.5]}))
    with pytest.raises(DataError, match=r"^data\.features\.city: no value occurs 3 time"):
        fit_inputs([categorical(min_frequency=3)], pd.DataFrame({"city": ["a", "a", "b"]}))
    with pytest.raises(DataError, match=r"^data\.features\.review: no text in the training"):
        fit_inputs([text(tokenizer="bpe")], pd.DataFrame({"review": [None, ""]}))


# --- which features -------------------------------------------------------------------------

def data_spec(features=None, target="target") -> DataSpec:
    return DataSpec.model_validate({"source": {"kind": "csv", "path": "x.csv"},
                                    "task": "regression", "target": target,
                                    "features": features})


FRAME = pd.DataFrame({
    "age": [30, 40], "member": [True, False], "score": [1.5, None],
    "review": ["good", "bad"], "photo": [b"\x89PNG", None], "basket": [["a"], ["b", "c"]],
    "readings": [[1.0, 2.0], [3.0]], "shop": pd.Categorical(["x", "y"]), "target": [1.0, 2.0],
    "counts": pd.Series([1, None], dtype=object),
})


def test_plain_names_are_typed_by_their_column_in_order():
    features = resolve_features(data_spec(["score", "member", "age", "shop", "counts"]), FRAME)
    assert [(f.name, f.type) for f in features] == [
        ("score", "numeric"), ("member", "numeric"), ("age", "numeric"),
        ("shop", "categorical"), ("counts", "numeric")]
    declared = resolve_features(data_spec(["age", {"name": "review", "type": "text",
                                                   "max_length": 9}]), FRAME)
    assert declared[0] == NumericFeature(name="age", type="numeric")
    assert declared[1] == text(max_length=9)


def test_every_column_but_the_target_when_features_are_unset():
    frame = FRAME[["age", "target", "score"]]
    assert [f.name for f in resolve_features(data_spec(), frame)] == ["age", "score"]
    assert [f.name for f in resolve_features(data_spec(target="age"), frame)] == [
        "target", "score"]


@pytest.mark.parametrize("column, message", [
    ("review", "data.features: column 'review' holds strings: declare its type, "
               "'- {name: review, type: text}' or '- {name: review, type: categorical}'"),
    ("photo", "data.features: column 'photo' holds bytes: declare it an image with the size "
              "to resize to, '- {name: photo, type: image, height: 64, width: 64}'"),
    ("basket", "data.features: column 'basket' holds lists: declare a sequence, "
               "'- {name: basket, type: sequence, values: tokens}'"),
    ("readings", "data.features: column 'readings' holds lists: declare a sequence, "
                 "'- {name: readings, type: sequence, values: numeric}'"),
    ("agee", "data.features: no column 'agee' (did you mean 'age'?); the data has: age, "),
])
def test_columns_of_open_type_or_missing_say_what_to_write(column, message):
    with pytest.raises(DataError) as caught:
        resolve_features(data_spec([column]), FRAME)
    assert str(caught.value).startswith(message)


def test_features_unset_with_a_string_column_asks_for_its_type():
    with pytest.raises(DataError, match="column 'review' holds strings"):
        resolve_features(data_spec(), FRAME[["age", "review", "target"]])


# --- input forms and the inputs' metadata ---------------------------------------------------

MIXED = pd.DataFrame({
    "age": [31.0, None, 45.0],
    "city": ["paris", None, "oslo"],
    "review": ["Great food!", "meh", None],
    "basket": ["a b", "b", ""],
    "photo": [png(RGB, "RGB"), png(255 - RGB, "RGB"), png(RGB[::-1], "RGB")],
})
MIXED_FEATURES = [
    NumericFeature(name="age", type="numeric"), categorical(), text(max_length=3),
    SequenceFeature(name="basket", type="sequence", values="tokens", max_length=2),
    image(height=2, width=3, normalize="unit"),
]


@pytest.mark.parametrize("form", ["frame", "series", "numpy", "arrow", "chunked", "list",
                                  "arrow-table"])
def test_every_input_form_gives_the_same_matrix(form):
    inputs = fit_inputs(MIXED_FEATURES, MIXED)
    expected = encode_columns(inputs, MIXED)
    convert = {
        "frame": lambda s: s, "series": lambda s: s, "list": lambda s: s.tolist(),
        "numpy": lambda s: s.to_numpy(),
        "arrow": pa.Array.from_pandas,
        "chunked": lambda s: pa.chunked_array([pa.Array.from_pandas(s[:1]),
                                               pa.Array.from_pandas(s[1:])]),
    }
    if form == "frame":
        columns = MIXED[["photo", "review", "basket", "city", "age"]].assign(other=1)
    elif form == "arrow-table":
        columns = pa.Table.from_pandas(MIXED, preserve_index=False)
    else:
        columns = {name: convert[form](MIXED[name]) for name in MIXED.columns}
    x = encode_columns(inputs, columns)
    assert x.dtype == np.float32 and x.shape == (3, 1 + 1 + 3 + 2 + 18)
    np.testing.assert_array_equal(x, expected)
    assert x[1, 0] != x[1, 0] and x[1, 1] == 0  # missing number: NaN; missing category: 0


def test_inputs_describe_their_columns_packages_and_signature(tmp_path):
    features = MIXED_FEATURES + [
        SequenceFeature(name="readings", type="sequence", max_length=2),
        image(name="scan", format="path", height=1, width=1),
        image(name="raw", format="array", height=1, width=1, channels=1),
        CategoricalFeature(name="code", type="categorical")]
    train = MIXED.assign(readings=[[1.0], [2.0], [3.0]], scan="x.png", raw=[[0]] * 3,
                         code=[1, 2, 2])
    inputs = fit_inputs(features, train)
    assert raw_columns(inputs) == ["age", "city", "review", "basket", "photo", "readings",
                                   "scan", "raw", "code"]
    names = matrix_names(inputs)
    assert names[:7] == ["age", "city", "review[0]", "review[1]", "review[2]", "basket[0]",
                         "basket[1]"]
    assert names[7:9] == ["photo[0]", "photo[1]"] and len(names) == 7 + 18 + 2 + 3 + 1 + 1
    assert required_packages(inputs) == ["pillow"]
    assert signature_types(inputs) == [
        ("age", "double"), ("city", "string"), ("review", "string"), ("basket", "string"),
        ("photo", "binary"), ("readings", "array<double>"), ("scan", "string"),
        ("raw", "array<double>"), ("code", "long")]
    assert has_typed_inputs(inputs) and not has_typed_inputs(inputs[:1])
    assert json.loads(json.dumps(inputs)) == inputs  # JSON-able as it is
