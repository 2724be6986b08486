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
    replies: list[dict] = []

    async def lifespan_send(message: dict) -> None:
        replies.append(message)

    running = asyncio.create_task(app({"type": "lifespan"}, lifespan.get, lifespan_send))
    await lifespan.put({"type": "lifespan.startup"})
    while not replies:
        await asyncio.sleep(0)
    if replies[0]["type"] != "lifespan.startup.complete":
        raise RuntimeError(f"the app did not start: {replies[0].get('message')}")
    body = json.dumps(payload).encode()
    sent = {"done": False}
    response: dict[str, Any] = {"body": b""}

    async def receive() -> dict:
        if sent["done"]:
            return {"type": "http.disconnect"}
        sent["done"] = True
        return {"type": "http.request", "body": body, "more_body": False}

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
