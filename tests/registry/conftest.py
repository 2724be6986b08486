"""Registry fixtures: a SQLite MLflow registry per test, built without training."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

NAME = "integrity_model"


@pytest.fixture(scope="module")
def empty_database(tmp_path_factory) -> Path:
    """A migrated, empty MLflow database, copied by each test (migrating takes seconds)."""
    import mlflow

    path = tmp_path_factory.mktemp("empty") / "mlflow.db"
    mlflow.MlflowClient(f"sqlite:///{path}").search_registered_models()
    return path


@pytest.fixture
def store(tmp_path, monkeypatch, empty_database):
    """A SQLite registry with NAME and no versions: (tracking URI, client, registry)."""
    import mlflow

    from dbspec.registry import Registry

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    shutil.copy(empty_database, tmp_path / "mlflow.db")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    client.create_registered_model(NAME)
    (tmp_path / "model").mkdir()
    return uri, client, Registry(client)


class ErroringProxy:
    """An HTTP server on 127.0.0.1 in front of ``upstream`` (a real tracking server, or None):
    requests matching ``failing`` (method, path prefix) are answered 503, the others are
    forwarded (503 too without an upstream)."""

    def __init__(self, upstream=None):
        import http.server
        import threading

        self.upstream = upstream
        self.failing: list[tuple[str, str]] = []
        self.failed: list[str] = []
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if proxy.upstream is None or any(
                        self.command == method and self.path.startswith(prefix)
                        for method, prefix in proxy.failing):
                    proxy.failed.append(f"{self.command} {self.path}")
                    self._send(503, b"Service Unavailable", "text/plain")
                    return
                status, payload, kind = proxy.forward(self.command, self.path, body,
                                                      self.headers.get("Content-Type"))
                self._send(status, payload, kind)

            def _send(self, status: int, payload: bytes, kind: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = do_PATCH = do_DELETE = _answer

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.uri = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def forward(self, method: str, path: str, body: bytes, kind):
        import urllib.error
        import urllib.request

        request = urllib.request.Request(self.upstream + path, data=body or None, method=method,
                                         headers={"Content-Type": kind} if kind else {})
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return response.status, response.read(), \
                    response.headers.get("Content-Type", "application/json")
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read(), exc.headers.get("Content-Type", "application/json")

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def no_http_retries(monkeypatch):
    """MLflow retries a 503 with backoff for minutes by default; one try is enough here."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")


@pytest.fixture
def erroring_registry(no_http_retries):
    """A tracking server URI that answers 503 to everything."""
    proxy = ErroringProxy()
    yield proxy.uri
    proxy.close()


@pytest.fixture
def flaky_proxy(no_http_retries, mlflow_server):
    """An :class:`ErroringProxy` in front of the session's real ``mlflow server``."""
    proxy = ErroringProxy(mlflow_server.uri)
    yield proxy
    proxy.close()
