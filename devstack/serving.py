"""Serve an ASGI app on a free loopback port inside the running event loop (tests, benchmarks)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from typing import Any, Literal

import uvicorn


@contextlib.asynccontextmanager
async def serve_in_background(
    app: Any, *, lifespan: Literal["auto", "on", "off"] = "off"
) -> AsyncIterator[str]:
    """Yield the base URL of `app` served by uvicorn until the block ends."""
    # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY only on sockets whose proto says TCP, and
    # without it every small response waits on Nagle's algorithm and the peer's delayed ACK.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    # A browser a test leaves open keeps its live WebSocket: without a bound, stopping the
    # server waits for that connection for ever (seen once in CI as a 180 s teardown timeout).
    config = uvicorn.Config(
        app, log_level="warning", lifespan=lifespan, timeout_graceful_shutdown=5
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                task.result()
            await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task
        sock.close()
