"""MLflow's scoring protocol: request bodies to a feature matrix, predictions to a response.

Accepted bodies (``Content-Type: application/json``, or no content type at all, as
``requests.post(url, data=json.dumps(...))`` sends them):

- ``{"inputs": [[...], ...]}`` or ``{"instances": [[...], ...]}``: rows in feature order; also
  a list of ``{column: value}`` records, or one ``{column: [values]}`` mapping;
- ``{"dataframe_split": {"columns": [...], "data": [[...], ...]}}``;
- ``{"dataframe_records": [{column: value}, ...]}``.

Every problem is a :class:`RequestError` with an HTTP status and a message for the client.
"""

from __future__ import annotations

import json
from typing import Any, Optional, Sequence

import numpy as np

try:
    import orjson

    _loads, dumps = orjson.loads, orjson.dumps  # compact JSON bytes
except ImportError:  # pragma: no cover - orjson comes with the serve extra
    orjson = None
    _loads = json.loads

    def dumps(value: Any) -> bytes:
        return json.dumps(value, separators=(",", ":")).encode()

FORMATS = ("inputs", "instances", "dataframe_split", "dataframe_records")


class RequestError(Exception):
    """A request the server refuses: ``status`` and a message for the client."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def check_content_type(content_type: Optional[str]) -> None:
    """JSON, or no content type at all; anything else is 415."""
    if content_type is None:
        return
    mime = content_type.split(";", 1)[0].strip().lower()
    if mime not in ("application/json", ""):
        raise RequestError(415, f"unsupported content type '{mime}': send application/json")


def parse_body(body: bytes, feature_names: Sequence[str]) -> np.ndarray:
    """A JSON request body -> a float32 matrix with one column per feature, in model order."""
    rows, key, strict = _rows_of(body, feature_names)
    return _matrix(rows, len(feature_names), key, strict=strict)


def parse_typed_body(body: bytes, card: Any) -> np.ndarray:
    """A JSON request body of raw values (strings, base64 image bytes, lists for sequences) ->
    the model's encoded feature matrix; a value a feature cannot encode is a 400 naming it."""
    from dbspec.models.encoding import encode_columns, raw_columns
    from dbspec.models.inputs import InputError

    names = raw_columns(card.inputs)
    rows, key, _ = _rows_of(body, names)
    if not isinstance(rows, (list, tuple)):
        raise RequestError(400, f"{key} must be a list of rows")
    if not rows:
        raise RequestError(400, f"{key} is empty: send at least one row")
    for i, row in enumerate(rows):
        if not isinstance(row, (list, tuple)) or len(row) != len(names):
            raise RequestError(400, f"{key}: row {i} must have {len(names)} values, one per "
                                    f"column ({', '.join(names)})")
    columns = {name: [row[j] for row in rows] for j, name in enumerate(names)}
    check_image_sizes(card.inputs, columns, key)
    try:
        return encode_columns(card.inputs, columns)
    except InputError as exc:
        raise RequestError(400, f"{key}: {exc}") from None


#: An image may hold this many times the pixels the model takes (a photo for a small input),
#: and never less than :data:`MIN_IMAGE_PIXELS` (2048 x 2048); a request, at most
#: :data:`IMAGES_AT_THE_LIMIT` such images' worth of pixels.
PIXELS_PER_INPUT_PIXEL, MIN_IMAGE_PIXELS, IMAGES_AT_THE_LIMIT = 256, 1 << 22, 16


def check_image_sizes(inputs: list[dict], columns: dict[str, list], key: str) -> None:
    """Refuse (413) images whose header says they are far larger than the model's input, before
    any is decoded (a 12000 x 12000 PNG is 4 MB of JSON and 432 MB of pixels); images that
    cannot be read are left to the decoder, which says why."""
    for entry in inputs:
        spec = entry["spec"]
        if entry["type"] != "image" or spec.get("format") != "bytes":
            continue  # arrays are bounded by the body's size; paths are not served
        limit = max(PIXELS_PER_INPUT_PIXEL * spec["height"] * spec["width"], MIN_IMAGE_PIXELS)
        total, budget = 0, IMAGES_AT_THE_LIMIT * limit
        for row, value in enumerate(columns[entry["name"]]):
            where = f"{key}: column '{entry['name']}', row {row}"
            width, height = _image_size(value, where) or (0, 0)
            if width * height > limit:
                raise RequestError(413, f"{where}: an image of {width} x {height} pixels is over "
                                        f"the {limit}-pixel limit of this model, which takes "
                                        f"{spec['width']} x {spec['height']}: send it smaller")
            total += width * height
            if total > budget:
                raise RequestError(413, f"{where}: the request's images hold over {budget} "
                                        f"pixels ({IMAGES_AT_THE_LIMIT} images of the "
                                        f"{limit}-pixel limit): send fewer or smaller images")


def _image_size(value: Any, where: str) -> Optional[tuple[int, int]]:
    """(width, height) from an image's header (base64 text or bytes) without decoding it;
    None when it is no readable image."""
    import base64
    import binascii
    import io

    if isinstance(value, str):
        text = value.split(",", 1)[1] if value.startswith("data:") and "," in value else value
        try:
            value = base64.b64decode("".join(text.split()), validate=True)
        except (binascii.Error, ValueError):
            return None
    if not isinstance(value, (bytes, bytearray)):
        return None
    from PIL import Image

    try:
        with Image.open(io.BytesIO(value)) as image:
            return image.size
    except Image.DecompressionBombError as exc:
        raise RequestError(413, f"{where}: {exc}") from None
    except Exception:  # noqa: BLE001 - unreadable: the decoder names the problem
        return None


def _rows_of(body: bytes, feature_names: Sequence[str]) -> tuple[Any, str, bool]:
    """The rows of a request body in ``feature_names`` order, its format key, and whether the
    body holds JSON booleans."""
    if not body:
        raise RequestError(400, "empty request body: send a JSON object with one of "
                                + ", ".join(FORMATS))
    try:
        payload = _loads(body)
    except ValueError as exc:
        raise RequestError(400, _json_problem(body, exc)) from None
    if not isinstance(payload, dict):
        raise RequestError(400, "the body must be a JSON object with one of " + ", ".join(FORMATS))
    present = [key for key in FORMATS if key in payload]
    if len(present) != 1:
        unknown = sorted(set(payload) - set(FORMATS) - {"params"})
        hint = f" (unknown key{'s' if len(unknown) > 1 else ''}: {', '.join(unknown)})" \
            if unknown else ""
        raise RequestError(400, "the body must hold exactly one of " + ", ".join(FORMATS)
                           + (f", not {len(present)}" if present else "") + hint)
    key = present[0]
    value = payload[key]
    if key == "dataframe_split":
        rows = _split(value, feature_names)
    elif key == "dataframe_records" or (isinstance(value, list) and value
                                        and isinstance(value[0], dict)):
        rows = _records(value, feature_names, key)
    elif isinstance(value, dict):
        rows = _columns(value, feature_names, key)
    else:
        rows = value
    return rows, key, b"true" in body or b"false" in body


def _json_problem(body: bytes, exc: ValueError) -> str:
    """orjson rejects NaN and Infinity as invalid JSON; say so plainly."""
    def refuse(token: str):
        raise RequestError(400, f"{token} is not a number the model can score: "
                                "send finite values only")
    try:
        json.loads(body, parse_constant=refuse)
    except RequestError as refused:
        return refused.message
    except (ValueError, UnicodeDecodeError) as strict:
        return f"malformed JSON: {strict}"
    except (RecursionError, MemoryError):
        return f"malformed JSON: nested too deeply ({exc})"
    return f"malformed JSON: {exc}"


def _split(value: Any, feature_names: Sequence[str]) -> Any:
    if not isinstance(value, dict) or "data" not in value:
        raise RequestError(400, "dataframe_split must be an object with 'columns' and 'data'")
    columns, data = value.get("columns"), value["data"]
    if columns is None:
        return data
    if not isinstance(columns, list) or not isinstance(data, list):
        raise RequestError(400, "dataframe_split: 'columns' and 'data' must be lists")
    seen: dict[str, int] = {}
    for index, name in enumerate(columns):
        if isinstance(name, str) and seen.setdefault(name, index) != index:
            raise RequestError(400, f"dataframe_split: column '{name}' appears twice in "
                                    f"'columns' (at {seen[name]} and {index}): send it once")
    missing = [name for name in feature_names if name not in columns]
    if missing:
        raise RequestError(400, f"dataframe_split: missing column(s) {', '.join(missing)}; "
                                f"the model needs {', '.join(feature_names)}")
    if list(columns) == list(feature_names):
        return data
    order = [columns.index(name) for name in feature_names]
    try:
        return [[row[i] for i in order] for row in data]
    except (TypeError, IndexError, KeyError):
        raise RequestError(400, f"dataframe_split: every row needs {len(columns)} values, one "
                                "per column") from None


def _records(value: Any, feature_names: Sequence[str], key: str) -> list:
    if not isinstance(value, list):
        raise RequestError(400, f"{key} must be a list of {{column: value}} records")
    rows = []
    for i, record in enumerate(value):
        if not isinstance(record, dict):
            raise RequestError(400, f"{key}[{i}] must be a {{column: value}} record")
        try:
            rows.append([record[name] for name in feature_names])
        except KeyError as missing:
            raise RequestError(400, f"{key}[{i}]: missing column {missing.args[0]}; the model "
                                    f"needs {', '.join(feature_names)}") from None
    return rows


def _columns(value: dict, feature_names: Sequence[str], key: str) -> Any:
    missing = [name for name in feature_names if name not in value]
    if missing:
        raise RequestError(400, f"{key}: missing column(s) {', '.join(missing)}; the model "
                                f"needs {', '.join(feature_names)}")
    columns = [value[name] for name in feature_names]
    if not all(isinstance(c, list) for c in columns) or len({len(c) for c in columns}) != 1:
        raise RequestError(400, f"{key}: every column must be a list of the same length")
    return list(zip(*columns))


def _matrix(rows: Any, width: int, key: str, *, strict: bool = False) -> np.ndarray:
    """Rows -> float32 matrix; ``strict`` also scans for booleans (numpy makes them numbers
    beside numbers), for bodies holding true/false only."""
    if not isinstance(rows, (list, tuple)):
        raise RequestError(400, f"{key} must be a list of rows")
    if not rows:
        raise RequestError(400, f"{key} is empty: send at least one row")
    try:
        array = np.asarray(rows)
    except ValueError:  # ragged nesting
        raise RequestError(400, f"{key}: every row must have {width} values") from None
    if array.ndim == 1 and width == 1 and array.dtype.kind in "iuf":
        array = array.reshape(-1, 1)
    if array.ndim != 2:
        raise RequestError(400, f"{key}: expected rows of {width} numbers, got an array of "
                                f"shape {list(array.shape)}")
    if array.shape[1] != width:
        raise RequestError(400, f"{key}: rows have {array.shape[1]} values; the model takes "
                                f"{width}")
    if array.dtype.kind not in "iuf" or strict and _first_bad(rows).startswith("boolean"):
        raise RequestError(400, f"{key}: every value must be a number "
                                f"(found {_first_bad(rows)})")
    with np.errstate(over="ignore"):
        array = array.astype(np.float32)
    if not np.isfinite(array).all():
        raise RequestError(400, f"{key}: values out of float32 range; send finite numbers")
    return array


def _first_bad(rows: Any) -> str:
    for row in rows:
        for value in row if isinstance(row, (list, tuple)) else [row]:
            if value is None:
                return "null"
            if isinstance(value, bool):
                return f"boolean {str(value).lower()}"
            if isinstance(value, str):
                return f"string {json.dumps(value)[:40]}"
            if not isinstance(value, (int, float)):
                return f"{type(value).__name__} {json.dumps(value, default=str)[:40]}"
    return "a value that is not a number"


def check_finite_predictions(out: np.ndarray, start: int, stop: int) -> None:
    """Refuse a request whose rows ``start:stop`` of the model's output are not all finite
    (finite inputs can overflow the network: ``null`` would look like a prediction).

    Raises:
        RequestError: 422, naming the request's rows (0-based) that have no finite prediction.
    """
    rows = out[start:stop].reshape(stop - start, -1)
    bad = np.flatnonzero(~np.isfinite(rows).all(axis=1))
    if len(bad):
        shown = ", ".join(str(i) for i in bad[:10]) + (f" and {len(bad) - 10} more"
                                                        if len(bad) > 10 else "")
        noun = "rows" if len(bad) > 1 else "row"
        raise RequestError(422, f"the model has no finite prediction for {noun} {shown} of "
                                f"{stop - start} (its output overflowed: values this far outside "
                                "the training data's range cannot be scored)")


def predictions_body(columns: dict[str, np.ndarray], start: int, stop: int,
                     warnings: Optional[list[str]] = None) -> bytes:
    """``{"predictions": [{column: value}, ...]}`` for rows ``start:stop``, as MLflow returns,
    with ``"warnings": [...]`` (lines about the request's rows) when there are any."""
    names = list(columns)
    if len(names) == 1:
        name = names[0]
        records = [{name: v} for v in columns[name][start:stop].tolist()]
    else:
        parts = [columns[n][start:stop].tolist() for n in names]
        records = [dict(zip(names, values)) for values in zip(*parts)]
    body: dict[str, Any] = {"predictions": records}
    if warnings:
        body["warnings"] = warnings
    return dumps(body)


def error_body(status: int, message: str) -> bytes:
    """The JSON body of a refused request, shaped as MLflow's (``error_code``, ``message``)."""
    code = {400: "BAD_REQUEST", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED",
            404: "ENDPOINT_NOT_FOUND",
            405: "BAD_REQUEST", 408: "DEADLINE_EXCEEDED", 413: "REQUEST_LIMIT_EXCEEDED",
            415: "BAD_REQUEST", 422: "INVALID_PARAMETER_VALUE", 431: "REQUEST_LIMIT_EXCEEDED",
            503: "TEMPORARILY_UNAVAILABLE"}.get(status, "INTERNAL_ERROR")
    return dumps({"error_code": code, "message": message})
