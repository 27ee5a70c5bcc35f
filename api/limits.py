"""Request body size limit (`MAX_REQUEST_BYTES`, and a lower one of its own for some paths such
as `/codec/`'s `CODEC_MAX_REQUEST_BYTES`), enforced before parsing.

A declared `Content-Length` over the limit is refused without reading the body; a body without
one (chunked) is counted as it streams in and refused as soon as it passes the limit.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.errors import PROBLEM_JSON, problem_body


class BodySizeLimit:
    """413 problem+json for bodies over `max_bytes`: by Content-Length, or counted as streamed."""

    def __init__(
        self,
        app: ASGIApp,
        max_bytes: int,
        path_limits: Mapping[str, tuple[int, str]] | None = None,
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        # Path prefix -> (its limit, the setting that sets it).
        self.path_limits = dict(path_limits or {})

    def _limit(self, scope: Scope) -> tuple[int, str]:
        path = str(scope.get("path", ""))
        for prefix, limit in self.path_limits.items():
            if path.startswith(prefix):
                return limit
        return self.max_bytes, "MAX_REQUEST_BYTES"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        max_bytes, setting = self._limit(scope)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > max_bytes:
            await self._reject(scope, send, max_bytes, setting)
            return
        received = 0
        too_large = False
        response_started = False

        async def counting_receive() -> Message:
            nonlocal received, too_large
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > max_bytes:
                    too_large = True
                    raise _TooLarge
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal response_started
            # The app may catch `_TooLarge` and answer on its own (FastAPI turns any body-read
            # error into a 400); that answer is dropped so the client gets the 413.
            if too_large:
                return
            response_started = response_started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counting_receive, guarded_send)
        except Exception:
            # `_TooLarge` itself, or whatever the app made of it.
            if not too_large:
                raise
        if too_large and not response_started:
            await self._reject(scope, send, max_bytes, setting)

    async def _reject(self, scope: Scope, send: Send, max_bytes: int, setting: str) -> None:
        body = json.dumps(
            problem_body(
                Request(scope),  # for the `type` URI's base
                413,
                "about:blank",
                "Request body too large",
                f"the body exceeds the limit of {max_bytes} bytes ({setting})",
                instance=scope.get("path", ""),
            )
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", PROBLEM_JSON.encode()),
                    (b"content-length", str(len(body)).encode()),
                    # The rest of the body was never read, so the connection cannot be reused.
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


class _TooLarge(Exception):
    """Raised into the app from `receive` once the body passes the limit."""
