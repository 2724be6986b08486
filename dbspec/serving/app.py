"""The scoring endpoint: a plain ASGI app with dynamic micro-batching.

Routes: ``POST /invocations`` (MLflow's scoring protocol), ``GET /ping`` and ``/health``
(unauthenticated, for load balancers), ``GET /version`` and ``/metrics`` (Prometheus text).

Concurrent requests are merged into one forward pass by :class:`~dbspec.serving.batcher.Batcher`.
"""

from __future__ import annotations

import asyncio
import hmac
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any, NamedTuple, Optional

import numpy as np

from dbspec.models.inputs import RAW_FEATURES, FeatureRanges
from dbspec.models.card import takes_raw_columns
from dbspec.serving.batcher import Batcher, model_runtime
from dbspec.serving.http_limits import ConnectionLimits
from dbspec.serving.inference_table import InferenceTable, Record
from dbspec.serving.metrics import ServerMetrics
from dbspec.serving.protocol import (RequestError, check_content_type, dumps, error_body,
                                     parse_body, parse_typed_body, predictions_body)

_JSON = [(b"content-type", b"application/json")]


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


class ServeOptions(NamedTuple):
    """``dbspec serve``'s settings; ``serving.realtime`` documents each."""

    host: str = "127.0.0.1"
    port: int = 8080
    token_env: Optional[str] = "DBSPEC_TOKEN"
    no_auth: bool = False
    max_batch_size: int = 64
    max_wait_ms: float = 2.0
    max_body_bytes: int = 5_000_000
    inference_table: Optional[Path] = None
    queue_size: int = 10_000
    watch_alias: bool = False
    watch_interval_s: float = 10.0
    limits: ConnectionLimits = ConnectionLimits()
    out_of_range: str = "warn"
    out_of_range_tolerance: float = 0.5
    tokens: tuple[tuple[str, str], ...] = ()  # (role, environment variable), see AuthSpec


class ScoringApp:
    """The ASGI application; ``swap`` replaces the model between batches.

    ``tokens``: ``(role, token)`` pairs, role ``scoring`` (``/invocations`` only) or ``admin``
    (every route); none: no authentication.
    """

    def __init__(self, model: LoadedModel, config: ServeOptions = ServeOptions(), *,
                 tokens: tuple[tuple[str, str], ...] = (),
                 table: Optional[InferenceTable] = None, background: tuple = ()):
        self.model = model
        self.config = config
        self.table = table
        self.background = background  # coroutine functions run for the app's lifetime
        self.metrics = ServerMetrics()
        self.batcher = Batcher(self, config.max_batch_size, config.max_wait_ms / 1000)
        self.arriving = 0  # /invocations requests read but not yet submitted
        self._tokens = [(token.encode(), role) for role, token in tokens if token]
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
        for task in self._tasks[1:]:  # the background jobs; the batcher finishes its queue
            task.cancel()
        if self._tasks:
            await self._tasks[0]
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
            elif key == b"content-encoding" and value.strip().lower() not in (b"", b"identity"):
                raise RequestError(415, "unsupported Content-Encoding "
                                        f"'{value.decode('latin-1')[:40]}': send the body "
                                        "uncompressed")
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
            # decoding images takes long: off the event loop, so /ping and others answer
            x = await asyncio.to_thread(parse_typed_body, body, model.model.card) \
                if model.typed else parse_body(body, model.feature_names)
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
        if model.version not in self._ranges:
            self._ranges[model.version] = FeatureRanges.of_card(
                model.model.card, self.config.out_of_range_tolerance)
        ranges = self._ranges[model.version]
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

        runtime = model_runtime(self.model.model)
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
