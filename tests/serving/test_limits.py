"""The server's limits, against one real ``dbspec serve`` on 127.0.0.1 driven with raw sockets.

The server serves the diabetes spec with its limits lowered in ``serving.realtime`` (through
``--set``, so the spec's settings are what is tested): 8 KiB of head, 3 s to send it, 3 s idle,
24 connections. Every refusal must be a JSON body, and an authorised request must still be
answered promptly while the limits are being hit.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Optional

import pytest

from tests.conftest import ROOT, run_in_process
from tests.serving.conftest import NAME, TOKEN, start_server

HEAD_LIMIT, TIMEOUT_S, MAX_CONNECTIONS = 8192, 3.0, 24
BODY = json.dumps({"inputs": [[0.03, 0.05, 0.06, 0.02, -0.04, -0.03, -0.04, -0.002, 0.02,
                               -0.017]]}).encode()


def invocation(body: bytes = BODY, path: bytes = b"/invocations") -> bytes:
    return (b"POST " + path + b" HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer " + TOKEN.encode()
            + b"\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
            + body)


@pytest.fixture(scope="module")
def server(registered, tmp_path_factory):
    assert run_in_process("promote", NAME, "1", "--alias", "limits", "--force", "--tracking-uri",
                          registered.tracking_uri, cwd=registered.workdir).returncode == 0
    limits = {"max_header_bytes": HEAD_LIMIT, "header_timeout_seconds": TIMEOUT_S,
              "keep_alive_timeout_seconds": TIMEOUT_S, "max_connections": MAX_CONNECTIONS}
    args = [str(ROOT / "specs" / "diabetes.yaml"), "--set", f"registry.name={NAME}", "--alias",
            "limits"]
    for key, value in limits.items():
        args += ["--set", f"serving.realtime.{key}={value}"]
    started = start_server(registered, *args, log=tmp_path_factory.mktemp("limits") / "serve.log")
    host, port = started.url.rsplit("/", 1)[1].split(":")
    yield started._replace(url=(host, int(port)))
    started.stop()


class Answer:
    """One HTTP response read from a raw socket (or what came instead)."""

    def __init__(self, raw: bytes, seconds: float, closed: bool):
        self.raw, self.seconds, self.closed = raw, seconds, closed
        head, _, self.body = raw.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        self.status = int(lines[0].split()[1]) if lines[0].startswith(b"HTTP/1.1 ") else None
        self.headers = dict(line.lower().split(b": ", 1) for line in lines[1:] if b": " in line)

    def json(self) -> dict:
        assert self.headers.get(b"content-type") == b"application/json", self.raw[:300]
        return json.loads(self.body)


def read_answer(sock: socket.socket, timeout: float = 10.0, *, to_close: bool = False) -> Answer:
    """A whole response (by content-length), or, with ``to_close``, everything until EOF."""
    started, raw, closed = time.monotonic(), b"", False
    sock.settimeout(timeout)
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                closed = True
                break
            raw += chunk
            head, sep, body = raw.partition(b"\r\n\r\n")
            length = [int(line.split(b":")[1]) for line in head.lower().split(b"\r\n")
                      if line.startswith(b"content-length:")]
            if sep and length and len(body) >= length[0] and not to_close:
                break
    except socket.timeout:
        pass
    except ConnectionResetError:
        closed = True
    return Answer(raw, time.monotonic() - started, closed)


def connect(server) -> socket.socket:
    return socket.create_connection(server.url, timeout=10)


def ask(server, request: bytes, sock: Optional[socket.socket] = None) -> Answer:
    own = sock is None
    sock = sock or connect(server)
    try:
        sock.sendall(request)
        return read_answer(sock)
    finally:
        if own:
            sock.close()


def open_connections(server, sock: socket.socket) -> int:
    return metric(server, "dbspec_http_connections_open", sock)


def metric(server, name: str, sock: Optional[socket.socket] = None) -> int:
    request = (b"GET /metrics HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer " + TOKEN.encode()
               + b"\r\n\r\n")
    text = ask(server, request, sock).body.decode()
    return int(text.split(f"\n{name} ")[1].split()[0])


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS")) / 1024


def test_oversized_heads_are_refused_at_once_with_bounded_memory(server):
    before = rss_mb(server.process.pid)
    answers: list[Answer] = []

    def bomb() -> None:  # an unfinished 20 MB header, as fast as loopback takes it
        with connect(server) as sock:
            sender = threading.Thread(target=_send_quietly, args=(
                sock, b"GET /ping HTTP/1.1\r\nHost: t\r\nX-Big: " + b"a" * (20 << 20)))
            sender.start()
            answers.append(read_answer(sock, 20))
            sender.join(20)

    bombs = [threading.Thread(target=bomb) for _ in range(16)]
    for thread in bombs:
        thread.start()
    time.sleep(0.2)
    authorised = ask(server, invocation())
    for thread in bombs:
        thread.join(60)
    grown = rss_mb(server.process.pid) - before
    assert authorised.status == 200 and authorised.seconds < 1.0, authorised.raw[:300]
    assert len(answers) == 16
    for answer in answers:
        assert answer.status == 431 and answer.seconds < 3.0, answer.raw[:300]
        assert "max_header_bytes" in answer.json()["message"]
    assert grown < 64, f"the server grew by {grown:.0f} MB"
    # a finished head just over the limit, and a long URL, are refused as precisely
    for request in (invocation().replace(b"Host: t", b"Host: t\r\nX-Pad: " + b"p" * HEAD_LIMIT),
                    invocation(path=b"/invocations?" + b"q" * HEAD_LIMIT)):
        assert ask(server, request).status == 431
    assert ask(server, invocation().replace(b"Host: t", b"X-Pad: " + b"p" * 4000)).status == 200


def test_slow_heads_and_idle_connections_are_closed_after_their_timeouts(server):
    idle_closed = metric(server, "dbspec_http_idle_closed_total")
    unfinished, trickled, silent, kept = (connect(server) for _ in range(4))
    opened = time.monotonic()
    unfinished.sendall(b"POST /invocations HTTP/1.1\r\nHost: t\r\n")
    assert ask(server, invocation(), kept).status == 200  # then idle on a kept-alive connection
    stop = threading.Event()

    def trickle() -> None:  # a byte every 0.25 s: each read is quick, the head never ends
        for byte in b"GET /ping HTTP/1.1\r\nX-Slow: " + b"s" * 100:
            if stop.wait(0.25) or not _send_quietly(trickled, bytes([byte])):
                return

    thread = threading.Thread(target=trickle)
    thread.start()
    try:
        for sock, status in ((unfinished, 408), (trickled, 408), (silent, None), (kept, None)):
            answer = read_answer(sock, 3 * TIMEOUT_S, to_close=True)
            waited = time.monotonic() - opened
            assert answer.closed and TIMEOUT_S - 0.5 < waited < 2 * TIMEOUT_S + 1, \
                (waited, answer.raw[:200])
            assert answer.status == status, answer.raw[:300]
            if status:
                assert "header_timeout_seconds" in answer.json()["message"]
        # the silent one and the kept-alive one
        assert metric(server, "dbspec_http_idle_closed_total") == idle_closed + 2
    finally:
        stop.set()
        thread.join()
        for sock in (unfinished, trickled, silent, kept):
            sock.close()


def test_over_max_connections_a_new_one_gets_a_json_503_and_others_are_answered(server):
    kept = connect(server)
    deadline = time.monotonic() + 10
    while open_connections(server, kept) > 1:  # the earlier tests' connections are gone
        assert time.monotonic() < deadline
        time.sleep(0.1)
    fillers = []
    try:
        for _ in range(MAX_CONNECTIONS - 1):  # busy: each has begun a request
            fillers.append(connect(server))
            fillers[-1].sendall(b"GET /ping HTTP/1.1\r\n")
        while open_connections(server, kept) < MAX_CONNECTIONS:
            assert time.monotonic() < deadline
        refused = ask(server, invocation())
        assert refused.status == 503 and refused.headers[b"retry-after"] == b"1"
        assert "max_connections" in refused.json()["message"]
        started = time.monotonic()
        assert ask(server, invocation(), kept).status == 200
        assert time.monotonic() - started < 1.0
        # a connection that has sent nothing gives way to a new one instead
        fillers.pop().close()
        while open_connections(server, kept) == MAX_CONNECTIONS:
            assert time.monotonic() < deadline
        silent = connect(server)
        fillers.append(silent)
        while open_connections(server, kept) < MAX_CONNECTIONS:
            assert time.monotonic() < deadline
        assert ask(server, invocation()).status == 200
        assert read_answer(silent, 5, to_close=True).closed
    finally:
        kept.close()
        for sock in fillers:
            sock.close()


@pytest.mark.parametrize("raw", [
    b"GARBAGE\r\n\r\n",
    b"GET /ping HTTP/1.1\r\nHost: t\r\nContent-Length: abc\r\n\r\n",
    b"GET /ping HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
    b"GET /ping HTTP/1.1\r\nBad Header: x\r\n\r\n",
    b"GET /ping HTTP/7.0\r\n\r\n",
    b"GET /pi\x00ng HTTP/1.1\r\n\r\n",
    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
], ids=["garbage", "length", "length+chunked", "header", "version", "nul", "http2"])
def test_malformed_http_is_refused_at_once_and_closed(server, raw):
    """The parser's refusals, answered by uvicorn: a 400 that says so (text/plain since
    uvicorn answers them itself, not a JSON body), then a close."""
    refused = metric(server, 'dbspec_http_refused_total{reason="malformed"}')
    with _sent(server, raw) as sock:
        answer = read_answer(sock, to_close=True)
    assert answer.status == 400 and answer.closed and answer.seconds < 2, answer.raw[:300]
    assert b"Invalid HTTP request" in answer.body
    assert metric(server, 'dbspec_http_refused_total{reason="malformed"}') == refused + 1


def test_an_upgrade_request_with_a_body_gets_a_json_400(server):
    raw = (b"POST /invocations HTTP/1.1\r\nHost: t\r\nConnection: Upgrade\r\n"
           b"Upgrade: websocket\r\nContent-Length: 2\r\n\r\n{}")
    with _sent(server, raw) as sock:
        answer = read_answer(sock, to_close=True)
    assert answer.status == 400 and answer.closed, answer.raw[:300]
    assert answer.json()["error_code"] == "BAD_REQUEST"
    assert "upgrades are not supported" in answer.json()["message"]


def test_a_bodiless_upgrade_request_is_answered_in_http_1_1_then_closed(server):
    with connect(server) as sock:  # what curl --http2 sends to an http:// URL
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: t\r\nConnection: Upgrade, HTTP2-Settings"
                     b"\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAoAAAAAIAAAAA\r\n\r\n")
        answer = read_answer(sock, to_close=True)
    assert answer.status == 200 and answer.json()["status"] == "ok"
    # httptools reads nothing after an upgrade: a next request on this connection would hang
    assert answer.headers.get(b"connection") == b"close" and answer.closed
    assert answer.seconds < 2


def _sent(server, raw: bytes) -> socket.socket:
    sock = connect(server)
    sock.sendall(raw)
    return sock


def test_an_input_whose_prediction_overflows_is_refused_naming_its_rows(server):
    rows = [json.loads(BODY)["inputs"][0], [3e38] * 10, [-3e38] * 10]
    answer = ask(server, invocation(json.dumps({"inputs": rows}).encode()))
    assert answer.status == 422, answer.raw[:300]
    assert "no finite prediction for rows 1, 2 of 3" in answer.json()["message"]


def _send_quietly(sock: socket.socket, data: bytes) -> bool:
    """Send, ignoring the server's close (it may refuse before reading everything)."""
    try:
        sock.sendall(data)
        return True
    except OSError:
        return False


@pytest.mark.parametrize("args, message", [
    (["--max-header-bytes", "100"], "--max-header-bytes must be at least 1024, not 100"),
    (["--max-connections", "0"], "--max-connections must be at least 1, not 0"),
    (["--header-timeout", "0"], "--header-timeout must be over 0 and at most 3600 seconds"),
    (["--keep-alive-timeout", "nan"], "--keep-alive-timeout must be over 0"),
])
def test_bad_limits_are_clear_errors(registered, args, message):
    result = run_in_process("serve", f"models:/{NAME}/1", *args, cwd=registered.workdir,
                            env={"MLFLOW_TRACKING_URI": registered.tracking_uri})
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
