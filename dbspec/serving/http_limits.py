"""The HTTP layer's limits: uvicorn's public settings, and a guard around each connection.

uvicorn (``httptools``) closes a connection idle after a response, bounds the drain at exit and
answers malformed HTTP 400. The rest wraps, through public interfaces only, the
``asyncio.Protocol`` uvicorn builds per connection (:func:`guard_protocol`) and the ASGI app
(:func:`guard_app`):

- at ``max_connections`` a new connection closes the oldest one that has sent nothing, else it
  gets a JSON 503 (uvicorn's ``limit_concurrency`` would answer text);
- a connection that sends nothing is closed after ``keep_alive_timeout_s`` (uvicorn's timer
  starts at a first response);
- a head must arrive within ``header_timeout_s`` (JSON 408) and stay within
  ``max_header_bytes`` (JSON 431), counted before the parser sees the bytes, so an unfinished
  20 MB header costs one read (httptools has no limit of its own);
- an Upgrade or CONNECT request with a body gets a JSON 400 and a close (httptools stops
  parsing at an upgrade); a bodiless one (curl ``--http2``) is answered in HTTP/1.1, then closed.

A refused connection is answered, half-closed, and drained for a moment before it closes:
closing at once would reset it and lose the answer.
"""

from __future__ import annotations

import asyncio
import contextvars
import http
from collections import OrderedDict
from typing import Any, Callable, NamedTuple, Optional

from dbspec.serving.protocol import error_body


class ConnectionLimits(NamedTuple):
    """The HTTP layer's limits; ``serving.realtime`` documents each."""

    max_header_bytes: int = 65_536
    header_timeout_s: float = 10.0
    keep_alive_timeout_s: float = 5.0
    max_connections: int = 1000


_LINGER_S = 1.0  # after a refusal, read (and drop) what the client still sends for this long...
_LINGER_BYTES = 1 << 20  # ...or this much, so it reads the answer instead of a reset
_HEAD_END = b"\r\n\r\n"
#: The connection whose bytes are being handed to uvicorn: the task uvicorn starts for a
#: request copies it, so :func:`guard_app` knows whose request ended.
_CONNECTION: contextvars.ContextVar[Optional["GuardedConnection"]] = \
    contextvars.ContextVar("dbspec_connection", default=None)


def uvicorn_settings(limits: ConnectionLimits) -> dict[str, Any]:
    """The limits uvicorn's own settings carry (``uvicorn.Config`` keyword arguments)."""
    return {"http": "httptools", "timeout_keep_alive": limits.keep_alive_timeout_s,
            "timeout_graceful_shutdown": 30}


class Guard:
    """What the connections share: the limits, the metrics, and who has sent nothing yet."""

    def __init__(self, limits: ConnectionLimits, metrics: Any):
        self.limits, self.metrics = limits, metrics  # metrics.connections_open: those open
        self.silent: OrderedDict[GuardedConnection, bool] = OrderedDict()  # oldest first


def guard_protocol(protocol_class: Callable[..., asyncio.Protocol], guard: Guard) -> Callable:
    """A protocol factory for uvicorn: ``protocol_class`` behind a :class:`GuardedConnection`."""

    def build(*args: Any, **kwargs: Any) -> GuardedConnection:
        return GuardedConnection(protocol_class(*args, **kwargs), guard)

    return build


def guard_app(app: Callable) -> Callable:
    """The ASGI app, refusing upgrades it cannot serve, and telling the connection when a
    request is done (its next head starts then)."""

    async def guarded(scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        connection = _CONNECTION.get()
        if connection is not None:
            connection.dispatched = True
        try:
            problem, upgrade = _unsupported(scope)
            if problem is None:
                await app(scope, receive, _closing(send) if upgrade else send)
                return
            if connection is not None:
                connection.guard.metrics.refused["upgrade"] += 1
            body = error_body(400, problem)
            await send({"type": "http.response.start", "status": 400, "headers": [
                (b"content-type", b"application/json"), (b"connection", b"close"),
                (b"content-length", b"%d" % len(body))]})
            await send({"type": "http.response.body", "body": body})
        finally:
            if connection is not None:
                connection.request_done()

    return guarded


def _unsupported(scope: dict) -> tuple[Optional[str], bool]:
    """(why the request is refused, or None; whether it asks for a protocol upgrade)."""
    asks, named, body = False, False, False  # Connection: upgrade; an Upgrade header; a body
    for name, value in scope["headers"]:
        if name == b"connection" and b"upgrade" in value.lower():
            asks = True
        elif name == b"upgrade":
            named = True
        elif name == b"transfer-encoding" or name == b"content-length" and value.strip() != b"0":
            body = True
    upgrade = scope["method"] == "CONNECT" or asks and named  # as httptools tells an upgrade
    if upgrade and body:  # httptools stops parsing at an upgrade: such a body is never read
        return ("protocol upgrades are not supported, and the body of an Upgrade or CONNECT "
                "request cannot be read: send plain HTTP/1.1 (curl: without --http2)"), True
    return None, upgrade


def _closing(send: Callable) -> Callable:
    """``send`` adding ``connection: close``: httptools reads no more after an upgrade request."""

    async def closing(message: dict) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", ()),
                                              (b"connection", b"close")]}
        await send(message)

    return closing


class GuardedConnection(asyncio.Protocol):
    """One connection: the limits of the module docstring around uvicorn's protocol."""

    def __init__(self, inner: asyncio.Protocol, guard: Guard):
        self.inner, self.guard = inner, guard
        self.transport: Any = None
        self.accepted = False
        self.reading_head = True  # the next bytes belong to a request's head
        self.head_bytes = 0  # of that head so far
        self.tail = b""  # its last 3 bytes, to find its end across reads
        self.timer: Optional[asyncio.TimerHandle] = None  # idle before a first byte, or head
        self.lingering: Optional[int] = None  # bytes dropped since a refusal
        self.answered_at: Optional[float] = None  # when its last request was answered
        self.peer_closed = False  # the client sent FIN
        self.dispatched = False  # the app was called for the last complete head

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        guard, limits = self.guard, self.guard.limits
        if guard.metrics.connections_open >= limits.max_connections and guard.silent:
            oldest, _ = guard.silent.popitem(last=False)
            guard.metrics.idle_closed += 1
            oldest.transport.close()
            oldest.release(None)  # now: its connection_lost comes after this one is counted
        if guard.metrics.connections_open >= limits.max_connections:
            self.refuse(503, "too_many_connections",
                        f"the server holds its limit of {limits.max_connections} open "
                        "connections (serving.realtime.max_connections): retry shortly")
            return
        self.accepted = True
        guard.metrics.connections_open += 1
        guard.silent[self] = True
        self.timer = asyncio.get_running_loop().call_later(limits.keep_alive_timeout_s,
                                                           self.idle_timed_out)
        self.inner.connection_made(transport)

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self.release(exc)

    def release(self, exc: Optional[Exception]) -> None:
        """Stop counting this connection, and tell uvicorn's protocol it is gone (once)."""
        self.cancel_timer()
        self.guard.silent.pop(self, None)
        if not self.accepted:
            return
        if exc is None and not self.peer_closed and self.lingering is None:  # closed by uvicorn
            if self._idle_since_answer():  # for its keep-alive timeout
                self.guard.metrics.idle_closed += 1
            elif self.head_bytes or not (self.reading_head or self.dispatched):
                self.guard.metrics.refused["malformed"] += 1  # its 400 to what httptools refused
        self.accepted = False
        self.guard.metrics.connections_open -= 1
        self.inner.connection_lost(exc)

    def eof_received(self) -> Optional[bool]:
        self.peer_closed = True
        if self.lingering is not None or not self.accepted:
            self.transport.close()
            return None
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        if self.accepted:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.accepted:
            self.inner.resume_writing()

    def data_received(self, data: bytes) -> None:
        if self.lingering is not None:
            self.lingering += len(data)
            if self.lingering > _LINGER_BYTES:
                self.transport.close()
            return
        if self.guard.silent.pop(self, None) is not None:
            self.cancel_timer()  # the idle timer: it has spoken
        if self.reading_head and not self.read_head(data):
            return
        token = _CONNECTION.set(self)
        try:
            self.inner.data_received(data)
        finally:
            _CONNECTION.reset(token)

    def read_head(self, data: bytes) -> bool:
        """Count ``data`` into the head; False when the head is refused."""
        limits = self.guard.limits
        seen = self.tail + data
        end = seen.find(_HEAD_END)
        size = self.head_bytes + (len(data) if end < 0 else end + len(_HEAD_END) - len(self.tail))
        if size > limits.max_header_bytes:
            self.refuse(431, "headers_too_large",
                        f"the request line and headers are over the {limits.max_header_bytes}"
                        "-byte limit (serving.realtime.max_header_bytes)")
            return False
        if end >= 0:  # the rest is the body, or requests pipelined behind this one
            self.cancel_timer()
            self.reading_head, self.head_bytes, self.tail, self.dispatched = False, 0, b"", False
            return True
        if self.timer is None:  # its first bytes: the head's deadline starts now
            self.timer = asyncio.get_running_loop().call_later(limits.header_timeout_s,
                                                               self.head_timed_out)
        self.head_bytes, self.tail = size, seen[-3:]
        return True

    def request_done(self) -> None:
        """The app answered: the next bytes begin a new head."""
        self.reading_head, self.head_bytes, self.tail = True, 0, b""
        self.answered_at = asyncio.get_running_loop().time()

    def _idle_since_answer(self) -> bool:
        """Whether nothing came since the last answer, for the keep-alive timeout."""
        if self.answered_at is None or not self.reading_head or self.head_bytes:
            return False
        idle = asyncio.get_running_loop().time() - self.answered_at
        return idle >= self.guard.limits.keep_alive_timeout_s * 0.99

    def idle_timed_out(self) -> None:
        self.timer = None
        if self.guard.silent.pop(self, None) is not None and not self.transport.is_closing():
            self.guard.metrics.idle_closed += 1
            self.transport.close()

    def head_timed_out(self) -> None:
        self.timer = None
        if self.reading_head and not self.transport.is_closing():
            self.refuse(408, "header_timeout",
                        f"the request's headers did not arrive within "
                        f"{self.guard.limits.header_timeout_s:g} s "
                        "(serving.realtime.header_timeout_seconds)")

    def cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def refuse(self, status: int, reason: str, message: str) -> None:
        """Answer ``status`` with a JSON body, then linger and close (see the module)."""
        if self.lingering is not None:
            return
        self.lingering = 0
        self.guard.metrics.refused[reason] += 1
        self.cancel_timer()
        transport = self.transport
        if transport.is_closing():
            return
        body = error_body(status, message)
        retry = b"retry-after: 1\r\n" if status == 503 else b""
        transport.write(b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\n"
                        b"content-length: %d\r\nconnection: close\r\n%s\r\n%s"
                        % (status, http.HTTPStatus(status).phrase.encode(), len(body), retry,
                           body))
        if transport.can_write_eof():
            transport.write_eof()
        transport.resume_reading()
        asyncio.get_running_loop().call_later(_LINGER_S, transport.close)
