"""The HTTP layer's limits: uvicorn's httptools protocol with header, time and connection caps.

uvicorn's httptools protocol has no limit on header size (httptools concatenates a header's
bytes as they come, so an 80 MB header took 12 s of the event loop), no timeout while a head is
read, and its keep-alive timer starts only after a first response, so a connection that never
sends a byte is held forever. :func:`limited_protocol` adds those limits and a connection cap,
and answers every refusal, malformed HTTP included, with a JSON body.
"""

from __future__ import annotations

import asyncio
from typing import Any, NamedTuple, Optional

from dbspec.errors import UsageError


class ConnectionLimits(NamedTuple):
    """The HTTP layer's limits; ``serving.realtime`` documents each."""

    max_header_bytes: int = 65_536
    header_timeout_s: float = 10.0
    keep_alive_timeout_s: float = 5.0
    max_connections: int = 1000


_LINGER_S = 1.0  # after a refusal, read (and drop) what the client still sends for this long...
_LINGER_BYTES = 1 << 20  # ...or this much, so it reads the answer instead of a reset


def limited_protocol(limits: ConnectionLimits, metrics) -> type:
    """uvicorn's httptools protocol with ``limits`` and JSON refusals (a class for ``http=``).

    - at ``max_connections`` open connections a new one first closes the oldest connection
      that has not sent a byte (nothing is lost: it asked nothing); when there is none, the
      new one is answered 503 and closed;
    - a connection with no request in progress is closed after ``keep_alive_timeout_s``, from
      the moment it opens (uvicorn starts that timer only after a first response);
    - a request's head (request line and headers) must arrive within ``header_timeout_s`` of its
      first byte (408) and stay within ``max_header_bytes`` (431): httptools only hands over
      whole headers, so an unfinished one is bounded by what was read (at most one read more);
    - malformed HTTP gets a JSON 400 instead of uvicorn's text/plain one; so do an upgrade
      request with a body and CONNECT (a bodiless ``Upgrade: h2c`` request is answered in
      HTTP/1.1, then the connection closes).

    After a refusal the connection answers, sends FIN, drops what the client still sends for a
    moment and closes; closing at once would reset the connection and lose the answer.
    """
    try:
        import httptools
        from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
    except ImportError:
        raise UsageError("dbspec serve needs httptools: pip install 'dbspec[serve]'") from None
    from collections import OrderedDict

    from dbspec.serving.protocol import error_body

    silent: OrderedDict = OrderedDict()  # accepted connections that have sent nothing, oldest first

    class LimitedHttpProtocol(HttpToolsProtocol):
        def __init__(self, *args: Any, **kwargs: Any):
            super().__init__(*args, **kwargs)
            self.accepted = False
            self.reading_head = True  # the next bytes belong to a request's head
            self.head_bytes = 0  # read since that head began (whole reads)
            self.head_size = 0  # of the head's completed request line and headers
            self.head_timer: Optional[asyncio.TimerHandle] = None
            self.refusal: Optional[tuple[int, str, str]] = None
            self.lingering: Optional[int] = None  # bytes dropped since the refusal

        def connection_made(self, transport) -> None:
            if len(self.connections) >= limits.max_connections and silent:
                oldest, _ = silent.popitem(last=False)
                self.connections.discard(oldest)
                metrics.idle_closed += 1
                oldest.transport.close()
            if len(self.connections) >= limits.max_connections:
                self.transport = transport
                self.refuse(503, "too_many_connections",
                            f"the server holds its limit of {limits.max_connections} open "
                            "connections (serving.realtime.max_connections): retry shortly")
                return
            self.accepted = True
            metrics.connections_open += 1
            super().connection_made(transport)
            silent[self] = None
            self.timeout_keep_alive_task = self.loop.call_later(
                limits.keep_alive_timeout_s, self.timeout_keep_alive_handler)

        def connection_lost(self, exc) -> None:
            self.cancel_head_timer()
            silent.pop(self, None)
            if not self.accepted:
                return
            self.accepted = False
            metrics.connections_open -= 1
            super().connection_lost(exc)

        def timeout_keep_alive_handler(self) -> None:
            if not self.transport.is_closing():
                metrics.idle_closed += 1
            super().timeout_keep_alive_handler()

        def eof_received(self) -> None:
            if self.lingering is not None:
                self.transport.close()

        def data_received(self, data: bytes) -> None:
            if self.lingering is not None:
                self.lingering += len(data)
                if self.lingering > _LINGER_BYTES:
                    self.transport.close()
                return
            self._unset_keepalive_if_required()
            silent.pop(self, None)
            if self.reading_head:
                self.head_bytes += len(data)
                if self.head_timer is None:
                    self.head_timer = self.loop.call_later(limits.header_timeout_s,
                                                           self.head_timed_out)
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserUpgrade:
                pass  # on_headers_complete refused it
            except httptools.HttpParserError as exc:
                if self.refusal is None:
                    self.refusal = (400, "malformed", f"malformed HTTP request ({exc}): send "
                                                      "HTTP/1.1, e.g. POST /invocations with a "
                                                      "JSON body")
            if self.refusal is None and self.reading_head and \
                    self.head_bytes > limits.max_header_bytes:
                self.refusal = self.too_large()
            if self.refusal is not None:
                self.refuse(self.refusal[0], self.refusal[1], self.refusal[2])

        def too_large(self) -> tuple[int, str, str]:
            return (431, "headers_too_large",
                    f"the request line and headers are over the {limits.max_header_bytes}-byte "
                    "limit (serving.realtime.max_header_bytes)")

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self.head_size = 0

        def on_url(self, url: bytes) -> None:
            super().on_url(url)
            self.head_size += len(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            super().on_header(name, value)
            self.head_size += len(name) + len(value) + 4

        def on_headers_complete(self) -> None:
            self.cancel_head_timer()
            self.reading_head, self.head_bytes = False, 0
            if self.refusal is not None:
                return
            if self.head_size > limits.max_header_bytes:
                self.refusal = self.too_large()
            elif self.parser.should_upgrade() and (self.parser.get_method() == b"CONNECT" or any(
                    name == b"transfer-encoding" or name == b"content-length"
                    and value.strip() != b"0" for name, value in self.headers)):
                # httptools stops parsing at an upgrade, so such a body would never be read
                self.refusal = (400, "upgrade", "protocol upgrades are not supported, and the "
                                                "body of an Upgrade or CONNECT request cannot "
                                                "be read: send plain HTTP/1.1 (curl: without "
                                                "--http2)")
            else:
                super().on_headers_complete()
                if self.parser.should_upgrade():  # answered as plain HTTP/1.1, then closed,
                    self.cycle.keep_alive = False  # as the parser reads no further

        def on_body(self, body: bytes) -> None:
            if self.refusal is None:
                super().on_body(body)

        def on_message_complete(self) -> None:
            if self.refusal is None:
                super().on_message_complete()
                self.reading_head = True

        def head_timed_out(self) -> None:
            self.head_timer = None
            if self.reading_head and self.refusal is None and not self.transport.is_closing():
                self.refusal = (408, "header_timeout",
                                f"the request's headers did not arrive within "
                                f"{limits.header_timeout_s:g} s "
                                "(serving.realtime.header_timeout_seconds)")
                self.refuse(*self.refusal)

        def cancel_head_timer(self) -> None:
            if self.head_timer is not None:
                self.head_timer.cancel()
                self.head_timer = None

        def send_400_response(self, msg: str) -> None:  # uvicorn's own, text/plain
            self.refuse(400, "malformed", f"malformed HTTP request: {msg}")

        def refuse(self, status: int, reason: str, message: str) -> None:
            """Answer ``status`` with a JSON body, then linger and close (see above)."""
            if self.lingering is not None:
                return
            self.lingering = 0
            metrics.refused[reason] += 1
            self.cancel_head_timer()
            self._unset_keepalive_if_required()
            transport = self.transport
            if transport.is_closing():
                return
            if self.cycle is not None and not self.cycle.response_complete:
                transport.close()  # a pipelined head went wrong while a response is being sent
                return
            body = error_body(status, message)
            retry = b"retry-after: 1\r\n" if status == 503 else b""
            transport.write(STATUS_LINE[status] + b"content-type: application/json\r\n"
                            b"content-length: %d\r\nconnection: close\r\n%s\r\n%s"
                            % (len(body), retry, body))
            if transport.can_write_eof():
                transport.write_eof()
            transport.resume_reading()
            self.loop.call_later(_LINGER_S, transport.close)

    return LimitedHttpProtocol
