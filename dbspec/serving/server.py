"""``dbspec serve``: the scoring app on uvicorn, with auth checks, alias watching and a lean heap.

The socket is bound before uvicorn starts: a busy port is a clear error, ``--port 0`` picks a
free one. ``gc.freeze()`` after the model is loaded keeps the import graph out of the collector's
reach (a full collection would stall requests for hundreds of milliseconds).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import ipaddress
import os
import signal
import socket
import threading
from typing import Any, Callable, Iterator, Optional

from dbspec.errors import DbspecError, UsageError
from dbspec.models.card import probability_meaning
from dbspec.serving.app import LoadedModel, ScoringApp, ServeOptions
from dbspec.serving.http_limits import (ConnectionLimits, Guard, guard_app, guard_protocol,
                                        uvicorn_settings)

__all__ = ["ConnectionLimits", "ServeOptions", "serve"]
from dbspec.serving.inference_table import InferenceTable
from dbspec.serving.source import ModelTarget, load_version, resolve_version


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def resolve_tokens(options: ServeOptions) -> tuple[tuple[str, str], ...]:
    """The tokens by role, ``(role, token)``: ``admin`` from ``token_env`` when it is set, then
    those ``serving.realtime.auth.tokens`` names; none with ``--no-auth``.

    Raises:
        UsageError: a role's variable is not set (its clients would all be refused), or no
            token for a non-loopback address without ``--no-auth``.
    """
    if options.no_auth:
        return ()
    token = os.environ.get(options.token_env) if options.token_env else None
    found = [("admin", token)] if token else []
    for role, name in options.tokens:
        value = os.environ.get(name)
        if not value:
            raise UsageError(f"serving.realtime.auth.tokens.{role} names ${name}, which is not "
                             "set: set it to the token, or remove the entry")
        found.append((role, value))
    if not found and not is_loopback(options.host):
        where = f"${options.token_env}" if options.token_env else "a token environment variable"
        raise UsageError(f"refusing to serve on {options.host} without authentication: set "
                         f"{where}, or pass --no-auth to serve anyone who can reach it")
    return tuple(found)


def describe_auth(options: ServeOptions, tokens: tuple[tuple[str, str], ...]) -> str:
    """``bearer token from $DBSPEC_TOKEN, scoring token from $SCORE_TOKEN`` (or ``off``)."""
    parts = [f"{role} token from ${name}" for role, name in options.tokens] if tokens else []
    if len(tokens) > len(parts):  # the token_env token, which comes first
        parts.insert(0, f"bearer token from ${options.token_env}")
    return ", ".join(parts) or "off"


def bind(host: str, port: int) -> socket.socket:
    """A listening socket, or a clear error."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    if not 0 <= port <= 65535:
        raise UsageError(f"port {port} is out of range: use 0 to 65535 (0 picks a free one)")
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def alias_watcher(client, target: ModelTarget, interval_s: float,
                  say: Callable[[str], None]):
    """A background job for :class:`ScoringApp`: follow ``target``'s alias and swap versions."""

    async def watch(app: ScoringApp) -> None:
        last_problem = None
        while True:
            await asyncio.sleep(interval_s)
            try:
                version = await in_daemon_thread(lambda: resolve_version(client, target))
                if version == app.model.version:
                    continue
                loaded = await in_daemon_thread(
                    lambda: load_version(client, target, version, without_torch=True))
            except Exception as exc:  # registry down, alias deleted: keep serving what we have
                problem = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                if problem != last_problem:
                    say(f"watch {target.uri}: {problem} (still serving v{app.model.version})")
                    last_problem = problem
                continue
            last_problem = None
            previous = app.model.version
            app.swap(loaded)
            say(f"{target.uri} moved: now serving v{version} (was v{previous})")

    return watch


async def in_daemon_thread(function: Callable[[], Any]) -> Any:
    """``function()`` on a daemon thread: a registry call stuck in its retries must not hold up
    the server's shutdown (the default executor's threads are joined at exit)."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(outcome, failed: bool) -> None:
        if not future.done():
            (future.set_exception if failed else future.set_result)(outcome)

    def work() -> None:
        try:
            result, failed = function(), False
        except BaseException as exc:  # handed to the awaiting coroutine
            result, failed = exc, True
        try:
            loop.call_soon_threadsafe(settle, result, failed)
        except RuntimeError:  # the loop closed while we waited: nobody is listening
            pass

    threading.Thread(target=work, name="dbspec-watch", daemon=True).start()
    return await future


def serve(loaded: LoadedModel, options: ServeOptions, *, client=None,
          target: Optional[ModelTarget] = None, say: Callable[[str], None] = print) -> None:
    """Serve ``loaded`` until SIGINT/SIGTERM, then drain in-flight requests and stop."""
    import uvicorn

    tokens = resolve_tokens(options)
    background = ()
    if options.watch_alias:
        if target is None or not target.alias or client is None:
            raise UsageError("--watch-alias needs a model chosen by alias (models:/NAME@ALIAS, "
                             "or a spec whose registry has a promotion alias)")
        background = (alias_watcher(client, target, options.watch_interval_s, say),)
    table = None
    if options.inference_table is not None:
        table = InferenceTable(options.inference_table, queue_size=options.queue_size)
        table.check()
        replayed, cut = table.recover()
        if replayed or cut:
            say(f"inference table {options.inference_table}: committed {replayed} answered "
                "request(s) that a stopped server had logged but not written"
                + (f" ({cut} bytes of an unanswered, cut-off record skipped)" if cut else ""))
    app = ScoringApp(loaded, options, tokens=tokens, table=table, background=background)
    sock = bind(options.host, options.port)
    host, port = sock.getsockname()[:2]
    config = uvicorn.Config(
        guard_app(app), ws="none", lifespan="on",
        access_log=False, log_level="warning", server_header=False, date_header=False,
        **uvicorn_settings(options.limits))
    config.load()  # then its HTTP protocol goes behind the guard of http_limits
    config.http_protocol_class = guard_protocol(config.http_protocol_class,
                                                Guard(options.limits, app.metrics))
    server = uvicorn.Server(config)
    auth = describe_auth(options, tokens)
    say(f"serving {loaded.name} v{loaded.version} ({loaded.source}) on "
        f"http://{f'[{host}]' if ':' in host else host}:{port}  auth: {auth}  batching: up to "
        f"{options.max_batch_size} rows / {options.max_wait_ms:g} ms"
        + (f"  inference table: {options.inference_table}" if table else "")
        + (f"  out-of-range rows: {options.out_of_range}" if options.out_of_range != "warn"
           else "")
        + ("  watching the alias" if background else "")
        + (f"  {meaning}" if (meaning := probability_meaning(loaded.model.card)) else ""))
    gc.collect()
    gc.freeze()
    try:
        with _stop_signals_end_cleanly():
            server.run(sockets=[sock])
    except SystemExit:  # uvicorn exits when its start-up fails; say it our way
        pass
    finally:
        sock.close()
    if not server.started:
        raise DbspecError("the server did not start (see the messages above)")
    say("stopped")


@contextlib.contextmanager
def _stop_signals_end_cleanly() -> Iterator[None]:
    """uvicorn re-raises the SIGINT/SIGTERM that stopped it, after its graceful drain, to the
    handlers it found; the process would die by the signal. Handlers that ignore them, around
    ``server.run``, let a drained, clean stop exit normally (a signal only in the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    stops = (signal.SIGINT, signal.SIGTERM)
    # a handler that does nothing, not SIG_IGN: a process started meanwhile must not inherit it
    previous = {stop: signal.signal(stop, _ignore) for stop in stops}
    try:
        yield
    finally:
        for stop, handler in previous.items():
            signal.signal(stop, handler)


def _ignore(signum: int, frame: object) -> None:
    """A stop signal that uvicorn already acted on."""
