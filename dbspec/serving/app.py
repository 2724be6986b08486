"""The scoring endpoint: a plain ASGI app with dynamic micro-batching.

Routes: ``POST /invocations`` (MLflow's scoring protocol), ``GET /ping`` and ``/health``
(unauthenticated, for load balancers), ``GET /version`` and ``/metrics`` (Prometheus text).

Concurrent requests are merged into one forward pass: a request that arrives while others are
still being read waits for them — up to ``max_wait_ms`` and ``max_batch_size`` rows — so a lone
request is scored at once and a busy server runs few, large batches. Forward passes run on the
event loop while they are quick (a small MLP takes tens of microseconds, less than a thread
hand-off); once they average over 2 ms they move to a worker thread so the loop keeps reading.
"""

from __future__ import annotations

import asyncio
import hmac
import os
import sys
import time
import traceback
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple, Optional

import numpy as np

from dbspec.models.inputs import RAW_FEATURES, FeatureRanges
from dbspec.models.card import prediction_columns, takes_raw_columns
from dbspec.serving.inference_table import InferenceTable, Record
from dbspec.serving.metrics import ServerMetrics
from dbspec.serving.protocol import (RequestError, check_content_type, check_finite_predictions,
                                     dumps, error_body, parse_body, parse_typed_body,
                                     predictions_body)

_JSON = [(b"content-type", b"application/json")]
_SLOW_FORWARD_S = 0.002


class LoadedModel(NamedTuple):
    """A served model with the registry coordinates it was loaded from."""

    model: Any  # a ServedModel in eval mode, or a NumpyServedModel (no torch needed)
    name: str
    version: str
    source: str  # the URI it was resolved from, e.g. models:/name@production

    @property
    def feature_names(self) -> tuple:
        return tuple(self.model.card.feature_names)

    @property
    def typed(self) -> bool:
        """Whether the model takes typed features (raw strings, images...), not a matrix."""
        return takes_raw_columns(self.model.card)


class ServingConfig(NamedTuple):
    """The app's settings. ``token``: full access (every route); ``tokens``: ``(role, token)``
    pairs, role ``scoring`` (``/invocations`` only) or ``admin`` (every route). No token at all:
    no authentication."""

    token: Optional[str] = None
    max_batch_size: int = 64
    max_wait_ms: float = 2.0
    max_body_bytes: int = 5_000_000
    out_of_range: str = "warn"  # serving.out_of_range.action: warn, reject or off
    out_of_range_tolerance: float = 0.5
    tokens: tuple[tuple[str, str], ...] = ()


class _Pending(NamedTuple):
    x: np.ndarray
    future: asyncio.Future
    model: LoadedModel


class Batcher:
    """Merges submitted feature matrices into forward passes (see the module docstring)."""

    def __init__(self, app: "ScoringApp", max_rows: int, max_wait_s: float):
        self.app = app
        self.max_rows = max_rows
        self.max_wait_s = max_wait_s
        self.pending: deque[_Pending] = deque()
        self.rows = 0
        self.closing = False
        self._wake: Optional[asyncio.Future] = None
        self._filling = False
        self._forward_s = 0.0
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="dbspec-forward")

    def submit(self, x: np.ndarray, model: LoadedModel) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        self.pending.append(_Pending(x, future, model))
        self.rows += len(x)
        self.poke()
        return future

    def poke(self) -> None:
        """Wake the runner when what it waits for has happened."""
        wake = self._wake
        if wake is None or wake.done():
            return
        if self.closing or self.pending and (not self._filling or self.rows >= self.max_rows
                                             or self.app.arriving == 0):
            wake.set_result(None)

    async def _wait(self, timeout: Optional[float]) -> None:
        loop = asyncio.get_running_loop()
        self._wake = loop.create_future()
        timer = loop.call_later(timeout, _settle, self._wake) if timeout else None
        try:
            await self._wake
        finally:
            self._wake = None
            if timer is not None:
                timer.cancel()

    async def run(self) -> None:
        while True:
            if not self.pending:
                if self.closing:
                    return
                self._filling = False
                await self._wait(None)
                continue
            if self.rows < self.max_rows and self.app.arriving > 0 and self.max_wait_s > 0:
                self._filling = True
                await self._wait(self.max_wait_s)
                self._filling = False
            await self._score(self._take())

    def close(self) -> None:
        self.closing = True
        self.poke()

    def _take(self) -> list[_Pending]:
        first = self.pending.popleft()
        batch, rows = [first], len(first.x)
        while self.pending and self.pending[0].model is first.model and \
                rows + len(self.pending[0].x) <= self.max_rows:
            item = self.pending.popleft()
            batch.append(item)
            rows += len(item.x)
        self.rows -= rows
        return batch

    async def _score(self, batch: list[_Pending]) -> None:
        loaded = batch[0].model
        x = batch[0].x if len(batch) == 1 else np.concatenate([p.x for p in batch])
        started = time.perf_counter()
        try:
            if self._forward_s > _SLOW_FORWARD_S:
                out = await asyncio.get_running_loop().run_in_executor(
                    self._executor, _forward, loaded.model, x)
            else:
                out = _forward(loaded.model, x)
            columns = prediction_columns(loaded.model.card, out)
        except Exception as exc:  # a model that fails on valid input: report, keep serving
            traceback.print_exc(file=sys.stderr)
            for item in batch:
                if not item.future.done():
                    item.future.set_exception(RequestError(500, f"the model failed: {exc}"))
            return
        self._forward_s = 0.8 * self._forward_s + 0.2 * (time.perf_counter() - started)
        finite = bool(np.isfinite(out).all())
        offset = 0
        for item in batch:
            stop = offset + len(item.x)
            if not item.future.done():
                try:
                    if not finite:  # only the requests holding the overflowing rows fail
                        check_finite_predictions(out, offset, stop)
                    item.future.set_result((columns, offset, stop))
                except RequestError as refused:
                    item.future.set_exception(refused)
            offset = stop
        self.app.metrics.batch(len(batch), len(x))


def _forward(model, x: np.ndarray) -> np.ndarray:
    if _runtime(model) != "torch":  # scores numpy rows itself
        return model(x)
    import torch  # loaded with the model already

    with torch.inference_mode():
        return model(torch.from_numpy(x)).numpy()


def _runtime(model) -> str:
    """``onnxruntime <version>`` (:mod:`dbspec.serving.onnx_model`), else ``torch``."""
    return getattr(model, "runtime", "torch")


def _settle(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


class ScoringApp:
    """The ASGI application; ``swap`` replaces the model between batches."""

    def __init__(self, model: LoadedModel, config: ServingConfig = ServingConfig(), *,
                 table: Optional[InferenceTable] = None, background: tuple = ()):
        self.model = model
        self.config = config
        self.table = table
        self.background = background  # coroutine functions run for the app's lifetime
        self.metrics = ServerMetrics()
        self.batcher = Batcher(self, config.max_batch_size, config.max_wait_ms / 1000)
        self.arriving = 0  # /invocations requests read but not yet submitted
        self._tokens = [(token.encode(), role) for role, token in
                        ((("admin", config.token),) if config.token else ()) + config.tokens
                        if token]
        self._ids = (os.urandom(4).hex(), iter(range(1, sys.maxsize)))
        self._tasks: list[asyncio.Task] = []
        self._ranges: dict[str, Optional[FeatureRanges]] = {}  # by model version

    def swap(self, model: LoadedModel) -> None:
        """Serve ``model`` from the next batch on; batches in flight finish on the old one."""
        self.model = model
        self.metrics.model_swaps += 1

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            await self._http(scope, receive, send)
        elif scope["type"] == "lifespan":
            await self._lifespan(receive, send)

    async def _lifespan(self, receive, send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.startup()
                except Exception as exc:
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def startup(self) -> None:
        if self.table is not None:
            self.table.start()
        self._tasks = [asyncio.create_task(self.batcher.run(), name="dbspec-batcher")]
        self._tasks += [asyncio.create_task(job(self)) for job in self.background]

    async def shutdown(self) -> None:
        """Finish queued batches, stop background work, write the inference table's tail."""
        self.batcher.close()
        batcher, *others = self._tasks or [None]
        for task in others:
            task.cancel()
        if batcher is not None:
            await batcher
        if self.table is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.table.close)

    async def _http(self, scope, receive, send) -> None:
        started = time.perf_counter()
        path = scope["path"]
        headers: list = _JSON
        try:
            if path == "/invocations":
                status, body, headers = await self._invocations(scope, receive, started)
            elif path in ("/ping", "/health"):
                _method(scope, "GET")
                status, body = 200, (b"\n" if path == "/ping" else dumps(
                    {"status": "ok", "model_name": self.model.name,
                     "model_version": self.model.version}))
            elif path == "/version":
                _method(scope, "GET")
                self._authorize(scope, "admin")
                status, body = 200, dumps(self._version())
            elif path == "/metrics":
                _method(scope, "GET")
                self._authorize(scope, "admin")
                status, headers = 200, [(b"content-type", b"text/plain; version=0.0.4")]
                body = self.metrics.render(
                    {"model_name": self.model.name, "model_version": self.model.version},
                    self.table.counters if self.table else dict).encode()
            else:
                path = "other"
                raise RequestError(404, f"no route {scope['path']}: use POST /invocations, "
                                        "GET /ping, /health, /version or /metrics")
        except RequestError as refused:
            status, body, headers = refused.status, error_body(refused.status, refused.message), \
                _JSON
            if status == 401:
                headers = _JSON + [(b"www-authenticate", b'Bearer realm="dbspec"')]
        except Exception as exc:  # a bug of ours: answer 500, log it, keep serving
            traceback.print_exc(file=sys.stderr)
            status, body, headers = 500, error_body(500, f"internal error: {exc}"), _JSON
        await send({"type": "http.response.start", "status": status,
                    "headers": headers + [(b"content-length", b"%d" % len(body))]})
        await send({"type": "http.response.body", "body": body})
        self.metrics.request(path, status, time.perf_counter() - started)

    async def _invocations(self, scope, receive, started: float):
        _method(scope, "POST")
        self._authorize(scope, "scoring")
        content_type = length = request_id = None
        for key, value in scope["headers"]:
            if key == b"content-type":
                content_type = value.decode("latin-1")
            elif key == b"content-length":
                length = value
            elif key == b"x-request-id" and len(value) <= 128:
                request_id = value.decode("latin-1")
        check_content_type(content_type)
        limit = self.config.max_body_bytes
        if length is not None and length.isdigit() and int(length) > limit:
            raise RequestError(413, f"request body of {int(length)} bytes is over the "
                                    f"{limit}-byte limit")
        model = self.model
        self.arriving += 1
        try:
            body = await _read_body(receive, limit)
            x = parse_typed_body(body, model.model.card) if model.typed \
                else parse_body(body, model.feature_names)
        finally:
            self.arriving -= 1
            self.batcher.poke()
        warnings = self._check_range(model, x)
        columns, start, stop = await self.batcher.submit(x, model)
        response = predictions_body(columns, start, stop, warnings)
        request_id = request_id or f"{self._ids[0]}-{next(self._ids[1])}"
        if self.table is not None:
            self.table.offer(Record(
                request_id, time.time(), model.name, model.version,
                (time.perf_counter() - started) * 1000, model.feature_names, x,
                {name: values[start:stop] for name, values in columns.items()}))
        return 200, response, _JSON + [(b"x-request-id", request_id.encode("latin-1"))]

    def _check_range(self, model: LoadedModel, x: np.ndarray) -> Optional[list[str]]:
        """Count rows far outside the training range; refuse them, or return the warnings."""
        if self.config.out_of_range == "off":
            return None
        ranges = self._ranges.get(model.version, False)
        if ranges is False:
            ranges = self._ranges[model.version] = FeatureRanges.of_card(
                model.model.card, self.config.out_of_range_tolerance)
        if ranges is None:  # logged before ranges were recorded
            return None
        outside = ranges.outside(x)
        if not outside:
            return None
        self.metrics.out_of_range(len(outside.rows), outside.counts())
        lines = outside.messages(x)
        if self.config.out_of_range == "reject":
            raise RequestError(422, f"{len(outside.rows)} of {len(x)} row(s) lie far outside "
                                    "the model's training range (serving.out_of_range: reject): "
                                    + "; ".join(lines) + f". {RAW_FEATURES}")
        return [f"{line}: far outside the training range, the prediction is unreliable"
                for line in lines]

    def _authorize(self, scope, needed: str) -> None:
        """Refuse a request without a token (401), with an unknown one (401), or with one whose
        role may not call the route (403: a scoring token on /metrics or /version)."""
        if not self._tokens:
            return
        for key, value in scope["headers"]:
            if key == b"authorization":
                scheme, _, given = value.partition(b" ")
                given = given.strip()
                roles = {role for token, role in self._tokens  # compare with every token
                         if hmac.compare_digest(given, token)}
                if scheme.lower() != b"bearer" or not roles:
                    raise RequestError(401, "invalid bearer token")
                if "admin" in roles or needed in roles:
                    return
                raise RequestError(403, f"this token's role ({', '.join(sorted(roles))}) may "
                                        f"only call POST /invocations; {scope['path']} needs "
                                        "the admin token")
        raise RequestError(401, "missing bearer token: send 'Authorization: Bearer <token>'")

    def _version(self) -> dict[str, str]:
        import dbspec

        runtime = _runtime(self.model.model)
        if runtime == "torch":
            import torch

            runtime = f"torch {torch.__version__}"
        return {"model_name": self.model.name, "model_version": self.model.version,
                "model_uri": self.model.source, "dbspec": dbspec.__version__,
                "runtime": runtime}


def _method(scope, expected: str) -> None:
    if scope["method"] != expected and not (expected == "GET" and scope["method"] == "HEAD"):
        raise RequestError(405, f"{scope['path']} takes {expected}, not {scope['method']}")


async def _read_body(receive, limit: int) -> bytes:
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise RequestError(400, "client disconnected before sending the body")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise RequestError(413, f"request body is over the {limit}-byte limit")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)
