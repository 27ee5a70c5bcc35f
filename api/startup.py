"""A start-up refused on purpose says why in one line, never with a traceback.

Starlette turns an exception in the lifespan into `lifespan.startup.failed` carrying the formatted
traceback, which uvicorn logs before it exits. For a refusal the operator must act on (the read
model migrated by a newer release: `readmodel.db.SchemaNewerThanCode`; an open production
configuration: `configuration.production.InsecureConfiguration`) the message is the reason
and the way out, nothing else.
"""

from __future__ import annotations

import sys
from collections.abc import MutableMapping
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from configuration.production import InsecureConfiguration


class StartupRefused(RuntimeError):
    """The process must not start; the message says why and what to do."""


class PlainStartupRefusal:
    """ASGI middleware: a `StartupRefused` (or an open production configuration refused) in the
    lifespan fails the start-up with its message."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return

        async def plain(message: MutableMapping[str, Any]) -> None:
            # Starlette sends the failure from its `except` block: the exception is current.
            refusal = sys.exc_info()[1]
            if message["type"] == "lifespan.startup.failed" and isinstance(
                refusal, StartupRefused | InsecureConfiguration
            ):
                message = {**message, "message": str(refusal)}
            await send(message)

        await self.app(scope, receive, plain)
