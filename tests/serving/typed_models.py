"""A registered model with typed features (numeric, text, categorical, image), trained once per
session for the typed serving tests.

Its data is a Delta table written here with ``deltalake``: ``x`` (double), ``text`` (string),
``color`` (string), ``image`` (binary: an 8 x 8 grayscale PNG) and a regression target ``y``
that every feature moves, so each column reaches the predictions. The spec is trained with
``dbspec run --smoke`` into a fresh SQLite store, as a user's first run would be; a smoke run
also ends with its serve stage, which posts raw test rows to the app in process. A twin
without the text feature (``typed_images``) is what the batch tests score.
"""

from __future__ import annotations

import base64
import io
from pathlib import Path

import numpy as np
import pyarrow as pa

from tests.conftest import run_in_process
from tests.serving.conftest import Registered

NAME = "typed_serving_smoke"  # the spec's registry.name, with the smoke suffix
URI = f"models:/{NAME}/1"
COLUMNS = ["x", "text", "color", "image"]  # the raw columns the model takes, in order
SIGNATURE = [("x", "double"), ("text", "string"), ("color", "string"), ("image", "binary")]
#: the same model without its text feature: the batch engines cannot score a text model
#: (see test_typed_serving.py), so their image tests run on this one
IMAGE_NAME = "typed_images_smoke"
IMAGE_URI = f"models:/{IMAGE_NAME}/1"

_SPEC = """\
name: {name}
data:
  source: {{kind: delta, path: table}}
  task: regression
  target: y
  features:
    - x
{text_feature}\
    - {{name: color, type: categorical}}
    - {{name: image, type: image, format: bytes, height: 8, width: 8, channels: 1}}
  split: {{validation: 0.2, test: 0.2, seed: 0}}
model:
  encoders:
{text_encoder}\
    color: {{kind: embedding, dim: 4}}
    image: {{kind: cnn, channels: [4]}}
  layers:
    - linear: {{out: 16}}
    - relu
    - linear: {{out: 1}}
training:
  optimizer: {{name: adam, lr: 0.01}}
  epochs: 2
  batch_size: 32
  seed: 0
registry:
  name: {registry}
serving:
  mode: realtime
"""


def spec_text(with_text: bool = True) -> str:
    """The spec of the typed model, or of its text-less twin."""
    if with_text:
        return _SPEC.format(
            name="typed-serving", registry="typed_serving",
            text_feature="    - {name: text, type: text, max_length: 6, vocabulary_size: 50}\n",
            text_encoder="    text: {kind: gru, dim: 8, hidden: 8}\n")
    return _SPEC.format(name="typed-images", registry="typed_images", text_feature="",
                        text_encoder="")


_COLORS = ["red", "green", "blue"]
_PHRASES = ["the cat sat", "a dog ran", "birds fly high", "fish swim deep", "the sun shines"]


def png(pixels: np.ndarray) -> bytes:
    """A grayscale image (h, w) of uint8 as PNG bytes."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def b64(data: bytes) -> str:
    """Bytes as the base64 text a JSON request carries."""
    return base64.b64encode(data).decode("ascii")


def rows_table(n: int, seed: int = 0) -> pa.Table:
    """``n`` rows: ``id`` and the model's raw columns, with the target ``y``.

    Unseen values come in too (a phrase and a colour the vocabularies may lack, images of
    other sizes): the served model must take whatever training would have taken.
    """
    rng = np.random.default_rng(seed)
    color = rng.integers(0, len(_COLORS), n)
    phrase = rng.integers(0, len(_PHRASES), n)
    brightness = rng.uniform(0, 1, n)
    x = rng.normal(size=n)
    images = [png(np.clip(rng.normal(b * 255, 30, (8, 8)), 0, 255).astype(np.uint8))
              for b in brightness]
    y = 2.0 * color + 1.5 * phrase + 3.0 * brightness + x + rng.normal(0, 0.1, n)
    return pa.table({"id": pa.array(np.arange(n), pa.int64()),
                     "x": pa.array(x, pa.float64()),
                     "text": pa.array([_PHRASES[i] for i in phrase], pa.string()),
                     "color": pa.array([_COLORS[i] for i in color], pa.string()),
                     "image": pa.array(images, pa.binary()),
                     "y": pa.array(y, pa.float64())})


def scoring_rows(n: int = 6, seed: int = 1) -> pa.Table:
    """Rows to score (no target), with values training never saw in the last rows: an unknown
    word and colour, and a 12 x 10 image the model resizes."""
    table = rows_table(n, seed).drop(["y"])
    text = table["text"].to_pylist()
    color = table["color"].to_pylist()
    image = table["image"].to_pylist()
    text[-1], color[-1] = "zebras dance", "purple"
    image[-2] = png(np.random.default_rng(seed).integers(0, 256, (12, 10), dtype=np.uint8))
    table = table.set_column(table.schema.get_field_index("text"), "text",
                             pa.array(text, pa.string()))
    table = table.set_column(table.schema.get_field_index("color"), "color",
                             pa.array(color, pa.string()))
    return table.set_column(table.schema.get_field_index("image"), "image",
                            pa.array(image, pa.binary()))


def write_table(path: Path, table: pa.Table) -> Path:
    from deltalake import write_deltalake

    write_deltalake(str(path), table)
    return path


def train_typed_model(workdir: Path, with_text: bool = True) -> Registered:
    """Write the table and the spec into ``workdir`` and run ``dbspec run --smoke`` there: the
    model is version 1 of ``typed_serving_smoke`` (``typed_images_smoke`` without text) in
    ``workdir``'s own SQLite store."""
    write_table(workdir / "table", rows_table(240))
    (workdir / "spec.yaml").write_text(spec_text(with_text), encoding="utf-8")
    result = run_in_process("run", "spec.yaml", "--smoke", "--quiet", cwd=workdir,
                            env={"MLFLOW_TRACKING_URI": ""}, timeout=600)
    assert result.returncode == 0, result.stderr
    return Registered(workdir, f"sqlite:///{workdir / '.dbspec' / 'mlflow.db'}",
                      NAME if with_text else IMAGE_NAME)


def load_typed_model(registered: Registered):
    """Version 1 of ``registered``, loaded in this process as ``dbspec`` loads it (a
    ``LoadedModel``)."""
    import mlflow

    from dbspec.serving.source import ModelTarget, load_version

    client = mlflow.MlflowClient(tracking_uri=registered.tracking_uri)
    return load_version(client, ModelTarget(registered.name, version="1"), "1")
