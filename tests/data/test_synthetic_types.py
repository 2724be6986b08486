"""Generated sources for typed features (text, mixed), the tabular generator left as it was,
and the committed digits_png Delta table."""

from __future__ import annotations

import importlib.util
import io
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dbspec.data.sources import DataError
from dbspec.seams.sources import source_kind
from dbspec.spec.sections.data import DataSpec

ROOT = Path(__file__).resolve().parents[2]


def synthetic(task: str, **source) -> pd.DataFrame:
    spec = DataSpec.model_validate({"source": {"kind": "synthetic", **source}, "task": task})
    return source_kind(spec).read(spec, base=ROOT).frame


def word_model():
    """Logistic regression over sparse counts (newton-cg: lbfgs crawls on separable counts)."""
    from sklearn.linear_model import LogisticRegression

    return LogisticRegression(solver="newton-cg", max_iter=500)


def fit_and_score(model, x, y, train: int) -> float:
    """Fit on the first ``train`` rows, score (accuracy or R2) on the rest."""
    return model.fit(x[:train], y[:train]).score(x[train:], y[train:])


# --- tabular: the code path existing runs depend on -------------------------------------------

@pytest.mark.parametrize("task, source", [
    ("multiclass", {"rows": 300, "features": 7, "classes": 3, "seed": 5}),
    ("binary", {"rows": 200, "features": 12, "informative": 4, "noise": 0.7, "seed": 2}),
    ("regression", {"rows": 250, "features": 9, "noise": 0.3, "seed": 1}),
])
def test_tabular_is_scikit_learn_as_before(task, source):
    from sklearn.datasets import make_classification, make_regression

    frame = synthetic(task, **source)
    informative = source.get("informative", min(source["features"], 10))
    if task == "regression":
        x, y = make_regression(n_samples=source["rows"], n_features=source["features"],
                               n_informative=informative, noise=source["noise"] * 100,
                               random_state=source["seed"])
    else:
        x, y = make_classification(
            n_samples=source["rows"], n_features=source["features"],
            n_informative=informative, n_redundant=0, n_classes=source.get("classes", 2),
            flip_y=min(source.get("noise", 0.1), 0.5), n_clusters_per_class=1,
            random_state=source["seed"])
    expected = pd.DataFrame(x.astype(np.float32),
                            columns=[f"f{i}" for i in range(source["features"])])
    expected["target"] = y.astype(np.float32 if task == "regression" else np.int64)
    pd.testing.assert_frame_equal(frame, expected, check_exact=True)
    assert synthetic(task, generator="tabular", **source).equals(frame)


# --- text --------------------------------------------------------------------------------------

def test_text_needs_word_order_not_just_words():
    """A bag of words is at chance; word pairs recover the class."""
    from sklearn.feature_extraction.text import CountVectorizer

    frame = synthetic("binary", generator="text", rows=2000, classes=2, noise=0, seed=3)
    train = 1600
    scores = {}
    for name, ngrams in {"words": (1, 1), "word pairs": (1, 2)}.items():
        x = CountVectorizer(ngram_range=ngrams).fit_transform(frame["text"])
        scores[name] = fit_and_score(word_model(), x,
                                     frame["target"].to_numpy(), train)
    assert scores["words"] < 0.6, scores
    assert scores["word pairs"] > 0.95, scores


def test_text_multiclass_order_carries_the_class():
    from sklearn.feature_extraction.text import CountVectorizer

    frame = synthetic("multiclass", generator="text", rows=3000, classes=5, noise=0, seed=4)
    y = frame["target"].to_numpy()
    assert set(y) == set(range(5))
    words = CountVectorizer().fit_transform(frame["text"])
    pairs = CountVectorizer(ngram_range=(1, 2)).fit_transform(frame["text"])
    assert fit_and_score(word_model(), words, y, 2400) < 0.3
    assert fit_and_score(word_model(), pairs, y, 2400) > 0.9


@pytest.mark.parametrize("classes", [2, 4])
def test_text_words_class_follows_from_the_words_alone(classes):
    """generator: text_words: the same kind of document, every actor of the document's class,
    so a bag of words recovers the class; the labels are those of generator: text."""
    from sklearn.feature_extraction.text import CountVectorizer

    settings = {"rows": 2000, "classes": classes, "noise": 0, "seed": 3}
    frame = synthetic("multiclass", generator="text_words", **settings)
    x = CountVectorizer().fit_transform(frame["text"])
    assert fit_and_score(word_model(), x, frame["target"].to_numpy(), 1600) > 0.95
    ordered = synthetic("multiclass", generator="text", **settings)
    assert frame["target"].equals(ordered["target"]) and not frame["text"].equals(ordered["text"])


def test_text_shape_lengths_and_reproducibility():
    settings = {"generator": "text", "rows": 500, "classes": 10, "noise": 0.2, "seed": 7}
    frame = synthetic("multiclass", **settings)
    assert list(frame.columns) == ["text", "target"] and frame["target"].dtype == np.int64
    assert frame["text"].map(type).eq(str).all()
    lengths = frame["text"].map(lambda text: len(re.findall(r"\w+|[^\w\s]", text)))
    assert lengths.between(5, 40).all()
    assert frame["text"].str.contains(r"[.!?]$").all() and frame["text"].str.contains(",").any()
    assert synthetic("multiclass", **settings).equals(frame)
    assert not synthetic("multiclass", **{**settings, "seed": 8}).equals(frame)


def test_text_short_documents_for_two_classes():
    frame = synthetic("binary", generator="text", rows=400, classes=2, seed=1)
    lengths = frame["text"].map(lambda text: len(re.findall(r"\w+|[^\w\s]", text)))
    assert lengths.min() <= 8 and lengths.max() == 40


def test_text_noise_flips_that_fraction_of_labels():
    clean = synthetic("binary", generator="text", rows=1000, noise=0, seed=2)
    noisy = synthetic("binary", generator="text", rows=1000, noise=0.2, seed=2)
    assert clean["text"].equals(noisy["text"])
    assert (clean["target"] != noisy["target"]).sum() == 200
    capped = synthetic("binary", generator="text", rows=1000, noise=3, seed=2)
    assert (clean["target"] != capped["target"]).sum() == 500


@pytest.mark.parametrize("generator", ["text", "text_words"])
@pytest.mark.parametrize("task, classes, message", [
    ("regression", 2, "data.source.generator: {} makes a classification corpus; use task "
                      "binary or multiclass"),
    ("multiclass", 11, r"data.source.classes: the text generator makes 2 to 10 classes .*got 11"),
])
def test_text_refuses_what_it_cannot_make(task, classes, message, generator):
    with pytest.raises(DataError, match=message.format(generator)):
        synthetic(task, generator=generator, rows=100, classes=classes)


# --- mixed -------------------------------------------------------------------------------------

def id_numbers(column: pd.Series) -> np.ndarray:
    return column.str[1:].astype(int).to_numpy()


def target_encoded(frame: pd.DataFrame, train: int, column: str, smoothing: float = 5.0):
    """Each ID's mean target on the training rows, shrunk towards the overall mean."""
    seen = frame.iloc[:train]
    prior = seen["target"].mean()
    stats = seen.groupby(column)["target"].agg(["sum", "count"])
    means = (stats["sum"] + smoothing * prior) / (stats["count"] + smoothing)
    return frame[column].map(means).fillna(prior).to_numpy(dtype=float)


@pytest.mark.parametrize("task", ["binary", "regression"])
def test_mixed_ids_carry_signal_the_numbers_do_not(task):
    from sklearn.linear_model import LinearRegression, LogisticRegression

    frame = synthetic(task, generator="mixed", rows=6000, features=8, cardinality=60,
                      noise=0, seed=1)
    train = 4800
    model = LinearRegression if task == "regression" else LogisticRegression
    numeric = frame[[f"f{i}" for i in range(8)]].to_numpy()
    encoded = np.column_stack([numeric] + [target_encoded(frame, train, c)
                                           for c in ("user_id", "item_id")])
    y = frame["target"].to_numpy()
    alone = fit_and_score(model(), numeric, y, train)
    with_ids = fit_and_score(model(), encoded, y, train)
    assert with_ids > alone + (0.1 if task == "binary" else 0.3), (alone, with_ids)
    assert alone > (0.6 if task == "binary" else 0.25)  # the numeric columns carry part of it


def test_mixed_id_numbers_are_uninformative():
    from sklearn.linear_model import LogisticRegression

    frame = synthetic("binary", generator="mixed", rows=20000, features=6, cardinality=2000,
                      noise=0.1, seed=2)
    y = frame["target"].to_numpy()
    for column in ("user_id", "item_id"):
        assert abs(np.corrcoef(id_numbers(frame[column]), y)[0, 1]) < 0.1
    numeric = frame[[f"f{i}" for i in range(6)]].to_numpy()
    raw = np.column_stack([numeric, id_numbers(frame["user_id"]),
                           id_numbers(frame["item_id"])])
    alone = fit_and_score(LogisticRegression(), numeric, y, 16000)
    assert fit_and_score(LogisticRegression(), raw, y, 16000) < alone + 0.02


def test_mixed_columns_classes_and_reproducibility():
    settings = {"generator": "mixed", "rows": 3000, "features": 5, "cardinality": 400,
                "classes": 4, "seed": 9, "noise": 0}
    frame = synthetic("multiclass", **settings)
    assert list(frame.columns) == ["f0", "f1", "f2", "f3", "f4", "user_id", "item_id", "target"]
    assert (frame.dtypes.iloc[:5] == np.float32).all() and frame["target"].dtype == np.int64
    assert frame["user_id"].str.fullmatch(r"u\d{3}").all()
    assert frame["item_id"].str.fullmatch(r"i\d{2}").all()
    assert frame["user_id"].nunique() > 350 and frame["item_id"].nunique() == 100
    assert np.bincount(frame["target"]).tolist() == [750] * 4  # cut at the score's quantiles
    assert synthetic("multiclass", **settings).equals(frame)
    noisy = synthetic("multiclass", **{**settings, "noise": 0.1})
    assert (noisy["target"] != frame["target"]).sum() == 300
    regression = synthetic("regression", **settings)
    assert regression["target"].dtype == np.float32
    assert regression["target"].std() == pytest.approx(1, abs=0.1)  # the score's unit variance


# --- the digits_png Delta table ----------------------------------------------------------------

def load_maker():
    path = ROOT / "specs" / "data" / "make_digits_png.py"
    spec = importlib.util.spec_from_file_location("make_digits_png", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_digits_png_table_holds_sklearn_digits():
    from PIL import Image
    from sklearn.datasets import load_digits

    table = ROOT / "specs" / "data" / "digits_png"
    assert len(list(table.glob("*.parquet"))) == 1
    spec = DataSpec.model_validate({"source": {"kind": "delta", "path": "specs/data/digits_png"},
                                    "task": "multiclass", "target": "label"})
    read = source_kind(spec).read(spec, base=ROOT)
    frame = read.frame
    assert read.version == "delta-v0" and list(frame.columns) == ["image", "label", "id"]
    assert frame["label"].dtype == np.int64 and frame["id"].dtype == np.int64
    digits = load_digits()
    assert frame["id"].tolist() == list(range(1797))
    assert frame["label"].tolist() == digits.target.tolist()
    expected = np.rint(digits.images * 255 / 16).astype(np.uint8)
    for index, data in zip(frame["id"], frame["image"]):
        image = Image.open(io.BytesIO(data))
        assert image.format == "PNG" and image.mode == "L" and image.size == (8, 8)
        np.testing.assert_array_equal(np.asarray(image), expected[index])
    assert expected.max() == 255 and expected.min() == 0


def test_digits_png_writer_is_deterministic_and_refuses_to_overwrite(tmp_path, capsys):
    from deltalake import DeltaTable

    maker = load_maker()
    for name in ("a", "b"):
        assert maker.main(["--output", str(tmp_path / name)]) == 0
    first, second = (DeltaTable(str(tmp_path / name)).to_pyarrow_table() for name in "ab")
    assert first.equals(second)
    assert maker.main(["--output", str(tmp_path / "a")]) == 1
    assert "--force" in capsys.readouterr().err
    assert maker.main(["--output", str(tmp_path / "a"), "--force"]) == 0
    assert DeltaTable(str(tmp_path / "a")).version() == 0
