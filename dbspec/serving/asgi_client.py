"""Drive the scoring app in process, through its ASGI interface (lifespan included): the
``serve`` stage's check, with no socket."""

from __future__ import annotations

import json
from typing import Any


async def post_json(app, path: str, payload: Any, *, headers: dict[str, str] | None = None
                    ) -> tuple[int, Any]:
    """Start the app, POST ``payload`` as JSON to ``path``, stop the app; (status, JSON body)."""
    import asyncio

    lifespan: asyncio.Queue = asyncio.Queue()
    replies: asyncio.Queue = asyncio.Queue()
    running = asyncio.create_task(app({"type": "lifespan"}, lifespan.get, replies.put))
    await lifespan.put({"type": "lifespan.startup"})
    started = await replies.get()
    if started["type"] != "lifespan.startup.complete":
        raise RuntimeError(f"the app did not start: {started.get('message')}")
    request = iter([{"type": "http.request", "body": json.dumps(payload).encode(),
                     "more_body": False}])
    response: dict[str, Any] = {"body": b""}

    async def receive() -> dict:
        return next(request, {"type": "http.disconnect"})

    async def send(message: dict) -> None:
        if message["type"] == "http.response.start":
            response["status"] = message["status"]
        else:
            response["body"] += message.get("body", b"")

    scope = {"type": "http", "method": "POST", "path": path,
             "headers": [(b"content-type", b"application/json")] + [
                 (k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]}
    try:
        await app(scope, receive, send)
    finally:
        await lifespan.put({"type": "lifespan.shutdown"})
        await running
    return response["status"], json.loads(response["body"])
