"""Upload size enforcement while the body streams in, before the whole request is read.

An ASGI middleware (not a route check) because FastAPI parses multipart bodies before a route runs:
a declared `Content-Length` over the limit is refused at once, and a body that grows past it while
streaming (chunked, or a lying header) is cut off at the first chunk over — the 413 goes out then,
and anything the app would answer afterwards is dropped.
"""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .problems import PROBLEM_MEDIA_TYPE, problem_body

#: Room for the multipart framing and the `config`/`target` fields around the model part.
FORM_OVERHEAD = 256 * 1024


class _TooLarge(Exception):
    pass


class UploadLimitMiddleware:
    def __init__(self, app: ASGIApp, max_bytes: int, paths: frozenset[str] = frozenset({"/fuse"})) -> None:
        self.app, self.max_bytes, self.paths = app, max_bytes, paths

    async def _reject(self, scope: Scope, send: Send) -> None:
        mb = self.max_bytes / (1024 * 1024)
        body = problem_body(
            "payload_too_large",
            413,
            f"the upload exceeds the limit of {mb:g} MiB (AUTOFUSION_MAX_UPLOAD_MB)",
            instance=scope["path"],
            limit_bytes=self.max_bytes,
        )
        data = json.dumps(body).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", PROBLEM_MEDIA_TYPE.encode()),
                    (b"content-length", str(len(data)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": data})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in self.paths:
            await self.app(scope, receive, send)
            return
        limit = self.max_bytes + FORM_OVERHEAD
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await self._reject(scope, send)
            return
        received = 0
        state = {"rejected": False, "started": False}

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    if not state["started"]:
                        state["rejected"] = True
                        await self._reject(scope, send)
                    raise _TooLarge
            return message

        async def guarded_send(message: Message) -> None:
            if state["rejected"]:
                return
            state["started"] = True
            await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except _TooLarge:
            pass
        except Exception:
            if not state["rejected"]:
                raise
