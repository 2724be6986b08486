"""A model with typed features (numeric, text, categorical, image) served for real on raw rows:
``dbspec serve`` over HTTP, MLflow's own scoring server and ``mlflow.pyfunc`` on the logged
model, ``dbspec predict`` and the local batch engine on a Delta table with a binary image
column, and the Spark engine on the same table. The model (and, for the batch engines, its
twin without text) is trained once per session (:mod:`tests.serving.typed_models`); every
expected prediction is the served model's own ``predict_frame`` on the same raw rows, in this
process.
"""

from __future__ import annotations

import io
import json
import re
import threading

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from dbspec.data.sources import DataError
from tests.conftest import mlflow_pointed_at, run_in_process
from tests.serving.conftest import start_server
from tests.serving.typed_models import (COLUMNS, IMAGE_NAME, IMAGE_URI, NAME, SIGNATURE, URI,
                                        b64, load_typed_model, png, scoring_rows,
                                        train_typed_model, write_table)
from tests.servers import mlflow_models_serve


@pytest.fixture(scope="session")
def typed_registered(tmp_path_factory):
    """The typed model, trained once per session (``Registered``: its project and store)."""
    return train_typed_model(tmp_path_factory.mktemp("typed-serving"))


@pytest.fixture(scope="module")
def typed_model(typed_registered):
    """The typed model loaded in this process (a ``LoadedModel``), as ``dbspec`` loads it."""
    return load_typed_model(typed_registered)


@pytest.fixture(scope="session")
def image_registered(tmp_path_factory):
    """The typed model without its text feature (numeric, categorical, image), trained once."""
    return train_typed_model(tmp_path_factory.mktemp("typed-images"), with_text=False)


@pytest.fixture(scope="module")
def image_model(image_registered):
    return load_typed_model(image_registered)


#: 64 bytes that no image decoder takes, as valid base64 (an image that cannot be decoded)
GARBAGE = bytes(np.random.default_rng(5).integers(0, 256, 64, dtype=np.uint8))


def expected(loaded, table: pa.Table) -> np.ndarray:
    """What the served model ``loaded`` predicts for the raw rows of ``table`` (its columns
    taken by name, the others ignored), in this process."""
    return loaded.model.predict_frame(table.to_pandas())["prediction"].to_numpy()


def json_rows(table: pa.Table, columns=COLUMNS) -> list[list]:
    """The rows of ``table`` as a JSON request carries them: image bytes as base64 text."""
    return [[b64(v) if isinstance(v, bytes) else v for v in row]
            for row in zip(*(table[c].to_pylist() for c in columns))]


def records(table: pa.Table, columns=COLUMNS) -> list[dict]:
    return [dict(zip(columns, row)) for row in json_rows(table, columns)]


def with_cell(rows: list[list], row: int, column: str, value) -> list[list]:
    """``rows`` (model column order) with one cell replaced."""
    changed = [list(r) for r in rows]
    changed[row][COLUMNS.index(column)] = value
    return changed


# --- dbspec serve ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def typed_server(typed_registered, tmp_path_factory):
    """``dbspec serve models:/typed_serving_smoke/1`` on 127.0.0.1, no token; it must exit
    cleanly on SIGINT at the end."""
    log = tmp_path_factory.mktemp("typed-serve") / "serve.log"
    server = start_server(typed_registered, URI, token=None, log=log)
    yield server
    assert server.stop() == 0, server.output()


def predictions(response: httpx.Response) -> list[float]:
    assert response.status_code == 200, response.text
    return [p["prediction"] for p in response.json()["predictions"]]


def test_raw_rows_in_every_format_get_the_in_process_predictions(typed_server,
                                                                 typed_model):
    table = scoring_rows()
    want = expected(typed_model, table)
    assert np.ptp(want) > 0  # rows that differ score differently: the check can fail
    rows = json_rows(table)
    shuffled = ["image", "id", "color", "x", "text"]  # another order, and a column more
    data_urls = [{**r, "image": "data:image/png;base64," + r["image"]} for r in records(table)]
    bodies = {
        "dataframe_split": {"dataframe_split": {"columns": COLUMNS, "data": rows}},
        "dataframe_split, shuffled": {"dataframe_split": {
            "columns": shuffled, "data": json_rows(table, shuffled)}},
        "dataframe_records": {"dataframe_records": records(table)},
        "inputs as records": {"inputs": records(table)},
        "instances as records": {"instances": records(table)},
        "inputs as rows": {"inputs": rows},
        "inputs as columns": {"inputs": {c: [r[j] for r in rows] for j, c in enumerate(COLUMNS)}},
        "data URLs": {"dataframe_records": data_urls},
    }
    with httpx.Client(timeout=30) as client:
        health = client.get(typed_server.url + "/health").json()
        assert (health["model_name"], health["model_version"]) == (NAME, "1")
        # text (gru), categorical and image encoders: all in the model's ONNX export
        version = client.get(typed_server.url + "/version").json()
        assert version["runtime"].startswith("onnxruntime "), version
        for name, body in bodies.items():
            got = predictions(client.post(typed_server.url + "/invocations", json=body))
            assert got == pytest.approx(want.tolist(), rel=1e-5), name
        # one row at a time: the same as in a batch (no state leaks between rows)
        one = predictions(client.post(typed_server.url + "/invocations",
                                      json={"dataframe_records": records(table)[2:3]}))
        assert one == pytest.approx([want[2]], rel=1e-5)


def test_the_image_changes_the_prediction_over_http(typed_server, typed_model):
    """Two rows that differ only in their image score differently, as in process: the server
    decodes the base64 image, it does not ignore it."""
    table = scoring_rows(2)
    dark, light = (png(np.full((8, 8), v, dtype=np.uint8)) for v in (0, 255))
    rows = json_rows(table)[:1] * 2
    rows = with_cell(with_cell(rows, 0, "image", b64(dark)), 1, "image", b64(light))
    got = predictions(httpx.post(typed_server.url + "/invocations", timeout=30,
                                 json={"dataframe_split": {"columns": COLUMNS, "data": rows}}))
    frame = table.select(COLUMNS).to_pandas().iloc[[0, 0]].reset_index(drop=True)
    frame["image"] = [dark, light]
    want = typed_model.model.predict_frame(frame)["prediction"].tolist()
    assert got == pytest.approx(want, rel=1e-5)
    assert got[0] != pytest.approx(got[1], rel=1e-4)


def _bad_requests() -> list[tuple[str, dict, str]]:
    rows = json_rows(scoring_rows(3))
    split = lambda data: {"dataframe_split": {"columns": COLUMNS, "data": data}}  # noqa: E731
    return [
        ("an undecodable image", split(with_cell(rows, 1, "image", b64(GARBAGE))),
         "dataframe_split: column 'image', row 1: not a decodable image"),
        ("invalid base64", split(with_cell(rows, 1, "image", "@@ not base64 @@")),
         "dataframe_split: column 'image', row 1: not base64-encoded image bytes"),
        ("a number for an image", split(with_cell(rows, 2, "image", 7)),
         "column 'image', row 2: expected image bytes (or base64 text), got int 7"),
        ("no image", split(with_cell(rows, 0, "image", None)),
         "column 'image', row 0: no image"),
        ("a number for text", split(with_cell(rows, 1, "text", 5)),
         "dataframe_split: column 'text', row 1: expected text (a string), got int 5"),
        ("a list for text", {"inputs": with_cell(rows, 0, "text", ["the", "cat"])},
         "inputs: column 'text', row 0: expected text (a string), got list"),
        ("a missing column in records",
         {"dataframe_records": [{c: v for c, v in zip(COLUMNS, r) if c != "color"}
                                for r in rows]},
         "dataframe_records[0]: missing column color"),
        ("a missing column in a split", {"dataframe_split": {
            "columns": ["x", "text", "image"],
            "data": [[r[0], r[1], r[3]] for r in rows]}},
         "dataframe_split: missing column(s) color; the model needs x, text, color, image"),
        ("a row of the wrong length", split([rows[0], rows[1][:3], rows[2]]),
         "dataframe_split: row 1 must have 4 values, one per column (x, text, color, image)"),
        ("an input row of the wrong length", {"inputs": [rows[0] + ["extra"]]},
         "inputs: row 0 must have 4 values"),
    ]


def test_bad_values_are_400_naming_the_column_and_the_server_keeps_serving(typed_server):
    with httpx.Client(timeout=30) as client:
        for name, body, message in _bad_requests():
            response = client.post(typed_server.url + "/invocations", json=body)
            assert response.status_code == 400, (name, response.text)
            assert response.json()["error_code"] == "BAD_REQUEST", name
            assert message in response.json()["message"], (name, response.text)
        good = client.post(typed_server.url + "/invocations",
                           json={"dataframe_records": records(scoring_rows(2))})
        assert good.status_code == 200, good.text
        metrics = client.get(typed_server.url + "/metrics").text
    errors = [line for line in metrics.splitlines()
              if line.startswith("dbspec_requests_total{") and 'status="500"' in line
              and not line.endswith(" 0") and not line.endswith(" 0.0")]
    assert errors == [], errors


def blank_png(width: int, height: int) -> str:
    """A black RGB PNG of ``width`` x ``height`` as base64 text: a few KB that decode to
    ``3 * width * height`` bytes."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (width, height)).save(buffer, format="PNG")
    return b64(buffer.getvalue())


def test_images_far_larger_than_the_models_input_are_refused_before_decoding(typed_server):
    """Issue 34: the model takes 8 x 8 images; one of 3000 x 3000 was decoded and scored (a
    12000 x 12000 one took seconds and hundreds of MB). The header's size is read first: at most
    256 times the input's pixels, never under 2048 x 2048, and 16 such images a request."""
    rows = json_rows(scoring_rows(2))
    split = lambda data: {"dataframe_split": {"columns": COLUMNS, "data": data}}  # noqa: E731
    with httpx.Client(timeout=60) as client:
        huge = client.post(typed_server.url + "/invocations",
                           json=split(with_cell(rows, 1, "image", blank_png(3000, 3000))))
        assert huge.status_code == 413, huge.text
        assert huge.json()["message"] == (
            "dataframe_split: column 'image', row 1: an image of 3000 x 3000 pixels is over the "
            "4194304-pixel limit of this model, which takes 8 x 8: send it smaller")
        at_limit = with_cell(rows, 0, "image", blank_png(2048, 2048))[0]
        many = client.post(typed_server.url + "/invocations", json=split([at_limit] * 17))
        assert many.status_code == 413, many.text
        assert many.json()["message"].startswith(
            "dataframe_split: column 'image', row 16: the request's images hold over 67108864 "
            "pixels (16 images of the 4194304-pixel limit)")
        one = client.post(typed_server.url + "/invocations", json=split([at_limit]))
        assert len(predictions(one)) == 1  # at the limit: decoded and scored


def test_ping_answers_while_another_request_decodes_its_images(typed_server):
    """Issue 34: images were decoded on the event loop, so /ping waited for them. A request
    of 15 large images (a second or so of decoding) ending in an undecodable one is answered
    400 only after every image before it was decoded; three pings sent once its body is out
    are all answered before it."""
    rows = json_rows(scoring_rows(2))
    large = with_cell(rows, 0, "image", blank_png(2048, 2048))[0]
    body = json.dumps({"dataframe_split": {"columns": COLUMNS, "data": [large] * 15 + [
        with_cell(rows, 0, "image", b64(GARBAGE))[0]]}}).encode()
    answered: list[tuple[str, int, str]] = []
    sent = threading.Event()

    def content():
        yield body
        sent.set()  # httpx asks for the next piece once this one is written

    def score() -> None:
        response = httpx.post(typed_server.url + "/invocations", content=content(),
                              headers={"content-type": "application/json"}, timeout=120)
        answered.append(("invocations", response.status_code, response.json()["message"]))

    scoring = threading.Thread(target=score)
    scoring.start()
    try:
        assert sent.wait(60)
        with httpx.Client(timeout=120) as client:
            for _ in range(3):
                answered.append(("ping", client.get(typed_server.url + "/ping").status_code, ""))
    finally:
        scoring.join(120)
    assert answered[:3] == [("ping", 200, "")] * 3, answered
    assert answered[3][:2] == ("invocations", 400), answered
    assert "column 'image', row 15: not a decodable image" in answered[3][2]


# --- MLflow: the logged model, pyfunc and MLflow's scoring server ----------------------------

@pytest.fixture(scope="module")
def typed_store(typed_registered):
    """MLflow pointed at the typed model's store through the environment, as a user's process
    is; MLflow's process-wide URIs are put back afterwards."""
    with mlflow_pointed_at(typed_registered.tracking_uri):
        yield typed_registered


def test_the_signature_names_each_raw_column_with_its_type(typed_store):
    import mlflow

    inputs = mlflow.models.get_model_info(URI).signature.inputs
    assert inputs.has_input_names()
    assert [(spec.name, spec.type.name) for spec in inputs.inputs] == SIGNATURE
    assert all(spec.required for spec in inputs.inputs)


def test_the_logged_model_requires_pillow_to_decode_images(typed_store):
    import mlflow

    with open(mlflow.pyfunc.get_model_dependencies(URI), encoding="utf-8") as file:
        names = {re.split(r"[=<>!~ ;\[]", line.strip(), maxsplit=1)[0].lower()
                 for line in file if line.strip() and not line.startswith("#")}
    assert "pillow" in names
    assert {"torch", "pandas", "numpy"} <= names
    assert "tokenizers" not in names  # a word tokenizer needs no subword library


def test_pyfunc_scores_a_frame_of_raw_bytes(typed_store, typed_model):
    import mlflow

    from dbspec.models.inputs import InputError

    model = mlflow.pyfunc.load_model(URI)
    table = scoring_rows()
    frame = table.to_pandas()  # id first, the image as bytes
    got = model.predict(frame)["prediction"].to_numpy()
    assert np.allclose(got, expected(typed_model, table), rtol=1e-5)
    reordered = frame[["image", "color", "text", "x"]]
    assert np.allclose(model.predict(reordered)["prediction"].to_numpy(), got, rtol=1e-6)
    broken = frame.copy()
    broken.loc[3, "image"] = GARBAGE
    with pytest.raises(InputError, match=r"column 'image', row 3: not a decodable image"):
        model.predict(broken)


@pytest.fixture(scope="module")
def mlflow_scoring_server(typed_store, tmp_path_factory):
    """``mlflow models serve`` of the logged model (MLflow's own scoring server, this Python)."""
    with mlflow_models_serve(URI, tmp_path_factory.mktemp("mlflow-serve"),
                             {"MLFLOW_TRACKING_URI": typed_store.tracking_uri}) as url:
        yield url


@pytest.mark.slow
def test_mlflow_scoring_server_takes_base64_images(mlflow_scoring_server,
                                                   typed_model):
    table = scoring_rows()
    want = expected(typed_model, table).tolist()
    for body in ({"dataframe_split": {"columns": COLUMNS, "data": json_rows(table)}},
                 {"dataframe_records": records(table)}):
        got = predictions(httpx.post(mlflow_scoring_server, json=body, timeout=60))
        assert got == pytest.approx(want, rel=1e-5), list(body)


@pytest.mark.slow
def test_mlflow_scoring_server_refuses_a_bad_image_naming_its_column(mlflow_scoring_server):
    rows = json_rows(scoring_rows(3))
    undecodable = httpx.post(mlflow_scoring_server, timeout=60, json={"dataframe_split": {
        "columns": COLUMNS, "data": with_cell(rows, 1, "image", b64(GARBAGE))}})
    assert 400 <= undecodable.status_code < 500, undecodable.text
    assert "column 'image', row 1: not a decodable image" in undecodable.json()["message"]
    # MLflow decodes base64 itself for dataframe formats: its own 4xx, naming the column
    invalid = httpx.post(mlflow_scoring_server, timeout=60, json={"dataframe_split": {
        "columns": COLUMNS, "data": with_cell(rows, 1, "image", "@@ not base64 @@")}})
    assert 400 <= invalid.status_code < 500, invalid.text
    assert "image" in invalid.json()["message"]
    text = httpx.post(mlflow_scoring_server, timeout=60, json={"dataframe_split": {
        "columns": COLUMNS, "data": with_cell(rows, 2, "text", 5)}})
    assert 400 <= text.status_code < 500, text.text
    assert "column 'text', row 2: expected text (a string), got int 5" in text.json()["message"]


@pytest.mark.slow
def test_mlflow_scoring_server_takes_base64_images_as_inputs_records(mlflow_scoring_server,
                                                                     typed_model):
    table = scoring_rows()
    got = predictions(httpx.post(mlflow_scoring_server, json={"inputs": records(table)},
                                 timeout=60))
    assert got == pytest.approx(expected(typed_model, table).tolist(), rel=1e-5)


# --- batch scoring: dbspec predict and the local engine ---------------------------------------
# The image table's error cases are scored with the text-less twin (numeric, categorical,
# image): a model that needs no text column, as a table of images alone would be.

def read_output(path) -> pa.Table:
    return DeltaTable(str(path)).to_pyarrow_table().sort_by("id")


def _replaced(table: pa.Table, column: str, row: int, value, kind) -> pa.Table:
    values = table[column].to_pylist()
    values[row] = value
    return table.set_column(table.schema.get_field_index(column), column, pa.array(values, kind))


def test_predict_command_scores_a_delta_table_with_a_binary_image_column(image_registered,
                                                                         image_model,
                                                                         tmp_path):
    table = scoring_rows(40, seed=3)  # string columns (text, color) beside the images
    source = write_table(tmp_path / "in", table)
    result = run_in_process("predict", IMAGE_URI, "--input", str(source), "--output",
                            str(tmp_path / "out"), "--tracking-uri",
                            image_registered.tracking_uri, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "wrote 40 rows" in result.stdout
    written = read_output(tmp_path / "out")
    assert written.schema.field("image").type == pa.binary()
    for column in table.column_names:  # the input's columns pass through as they were
        assert written[column].to_pylist() == table[column].to_pylist(), column
    want = expected(image_model, table)
    assert np.ptp(want) > 0
    assert np.allclose(written["prediction"].to_numpy(), want, rtol=1e-5)
    assert set(written["model_name"].to_pylist()) == {IMAGE_NAME}
    assert set(written["model_version"].to_pylist()) == {"1"}


def test_local_batch_scoring_takes_a_model_with_text(typed_model, tmp_path):
    from dbspec.serving.batch import predict_local

    table = scoring_rows(20, seed=9)
    source = write_table(tmp_path / "in", table)
    result = predict_local(typed_model, str(source), str(tmp_path / "out"))
    assert result.rows == 20
    assert np.allclose(read_output(tmp_path / "out")["prediction"].to_numpy(),
                       expected(typed_model, table), rtol=1e-5)


def test_a_corrupt_image_in_row_k_is_a_data_error_naming_column_and_row(image_model,
                                                                        tmp_path):
    from dbspec.serving.batch import predict_local

    table = _replaced(scoring_rows(30, seed=4), "image", 17, GARBAGE, pa.binary())
    source = write_table(tmp_path / "in", table)
    with pytest.raises(DataError, match=r"^input .*in: column 'image', row 17: not a "
                                        r"decodable image"):
        predict_local(image_model, str(source), str(tmp_path / "out"))
    assert not (tmp_path / "out" / "_delta_log").exists()  # nothing was committed


def test_a_corrupt_image_is_named_by_its_row_in_the_table_whatever_the_batch(image_model,
                                                                             tmp_path):
    from dbspec.serving.batch import predict_local

    table = _replaced(scoring_rows(30, seed=4), "image", 17, GARBAGE, pa.binary())
    source = write_table(tmp_path / "in", table)
    with pytest.raises(DataError, match=r"column 'image'") as refused:
        predict_local(image_model, str(source), str(tmp_path / "out"), batch_rows=8)
    assert "row 17" in str(refused.value), str(refused.value)


def _as(column: str, values, kind):
    return lambda t: t.set_column(t.schema.get_field_index(column), column,
                                  pa.array([values] * len(t), kind))


@pytest.mark.parametrize("change, message", [
    (lambda t: t.drop(["color"]),
     r"lacks the model's feature column\(s\) color; it has id, x, text, image"),
    (lambda t: t.drop(["image", "color"]),
     r"lacks the model's feature column\(s\) color, image"),
    (_as("x", "1.5", pa.string()), r"feature column\(s\) x \(string\) are not numeric"),
    (_as("image", b"not an image", pa.binary()),
     r"column 'image', row 0: not a decodable image"),
    (_as("image", "@@ not base64 @@", pa.string()),
     r"column 'image', row 0: not base64-encoded image bytes"),
    (lambda t: _replaced(t, "image", 2, None, pa.binary()), r"column 'image', row 2: no image"),
], ids=["no color column", "two missing columns", "text for a number", "bytes not an image",
        "strings not base64", "a null image"])
def test_unscorable_tables_are_data_errors(image_model, tmp_path, change, message):
    from dbspec.serving.batch import predict_local

    source = write_table(tmp_path / "in", change(scoring_rows(10, seed=6)))
    with pytest.raises(DataError, match=message):
        predict_local(image_model, str(source), str(tmp_path / "out"))
    assert not (tmp_path / "out" / "_delta_log").exists()


# --- Spark ------------------------------------------------------------------------------------

@pytest.mark.slow
def test_spark_scores_the_binary_image_table_as_local_scoring_does(image_model, spark,
                                                                   tmp_path):
    from dbspec.serving.batch import predict_local, predict_spark

    table = scoring_rows(200, seed=7)
    source = write_table(tmp_path / "in", table)
    local = predict_local(image_model, str(source), str(tmp_path / "local"))
    on_spark = predict_spark(spark, image_model, str(source), str(tmp_path / "spark"),
                             batch_rows=64)  # several Arrow batches per task
    assert local.rows == on_spark.rows == 200
    written = read_output(tmp_path / "spark")
    assert written["id"].to_pylist() == list(range(200))
    assert written["image"].to_pylist() == table["image"].to_pylist()
    assert written["text"].to_pylist() == table["text"].to_pylist()
    assert np.allclose(written["prediction"].to_numpy(),
                       read_output(tmp_path / "local")["prediction"].to_numpy(), rtol=1e-5)
    assert np.allclose(written["prediction"].to_numpy(), expected(image_model, table),
                       rtol=1e-5)


@pytest.mark.slow
def test_spark_refuses_a_corrupt_image_or_a_missing_column(image_model, spark, tmp_path):
    from dbspec.serving.batch import predict_spark

    table = _replaced(scoring_rows(20, seed=8), "image", 11, GARBAGE, pa.binary())
    source = write_table(tmp_path / "in", table)
    with pytest.raises(DataError, match=r"^input .*in: column 'image', row \d+: not a "
                                        r"decodable image"):
        predict_spark(spark, image_model, str(source), str(tmp_path / "out"), fmt="parquet")
    assert not (tmp_path / "out").exists()
    missing = write_table(tmp_path / "no-color", scoring_rows(5).drop(["color"]))
    with pytest.raises(DataError, match=r"lacks the model's feature column\(s\) color"):
        predict_spark(spark, image_model, str(missing), str(tmp_path / "out"))


@pytest.mark.slow
def test_spark_tasks_scoring_parquet_name_the_row_of_the_whole_input(image_model, spark,
                                                                    tmp_path):
    from dbspec.serving.batch import predict_spark

    table = _replaced(scoring_rows(20, seed=8), "image", 13, GARBAGE, pa.binary())
    pq.write_table(table, tmp_path / "in.parquet", row_group_size=5)  # row 13: the 2nd task's
    with pytest.raises(DataError, match=r"^input .*in.parquet: column 'image', row 13: not a "
                                        r"decodable image"):
        predict_spark(spark, image_model, str(tmp_path / "in.parquet"), str(tmp_path / "out"),
                      fmt="parquet")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_spark_batch_scoring_takes_a_model_with_text(typed_model, spark, tmp_path):
    from dbspec.serving.batch import predict_spark

    table = scoring_rows(20, seed=9)
    source = write_table(tmp_path / "in", table)
    predict_spark(spark, typed_model, str(source), str(tmp_path / "out"))
    assert np.allclose(read_output(tmp_path / "out")["prediction"].to_numpy(),
                       expected(typed_model, table), rtol=1e-5)
