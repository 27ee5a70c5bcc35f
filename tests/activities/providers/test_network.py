"""The provider client's streams answer httpcore's "did the server close this idle connection?"
as httpcore's own do, from a socket found once (`activities/providers/network.py`)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

import httpx
import pytest

from activities.providers.network import ExpiryCheckingBackend, _Stream, provider_transport


def test_a_socket_reads_readable_once_its_peer_closes_or_it_is_closed() -> None:
    ours, theirs = socket.socketpair()
    stream = _Stream(inner=None, sock=ours)  # type: ignore[arg-type]  # only its socket is used
    assert stream.get_extra_info("is_readable") is False
    assert stream.get_extra_info("is_readable") is False
    theirs.close()
    assert stream.get_extra_info("is_readable") is True
    ours.close()
    assert stream.get_extra_info("is_readable") is True


def test_the_provider_transport_connects_through_the_cheaper_check() -> None:
    transport = provider_transport(httpx.Limits(max_connections=3))
    assert isinstance(transport._pool._network_backend, ExpiryCheckingBackend)  # noqa: SLF001


_RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok"


@contextlib.asynccontextmanager
async def closing_server() -> AsyncIterator[tuple[int, list[int]]]:
    """A server that answers each connection's first request, then closes it: its port and the
    connections it accepted (a list that grows)."""
    accepted: list[int] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(1)
        await reader.readuntil(b"\r\n\r\n")
        writer.write(_RESPONSE)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1], accepted
    finally:
        server.close()
        await server.wait_closed()


async def test_a_connection_the_server_closed_while_idle_is_not_used_again() -> None:
    """The pool must see each closed idle connection and open another, or the next request
    fails on a dead one."""
    limits = httpx.Limits(max_connections=2, max_keepalive_connections=2)
    async with (
        closing_server() as (port, accepted),
        httpx.AsyncClient(transport=provider_transport(limits)) as client,
    ):
        for _ in range(3):
            response = await client.get(f"http://127.0.0.1:{port}/")
            assert response.text == "ok"
            await asyncio.sleep(0.05)  # the server's close reaches the socket
    assert len(accepted) == 3


async def test_a_check_that_never_sees_the_close_fails_the_next_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The test above can fail: with the check answering "not readable", the pool reuses the
    closed connection and the request fails."""
    monkeypatch.setattr(_Stream, "_is_readable", lambda self: False)
    async with (
        closing_server() as (port, _),
        httpx.AsyncClient(transport=provider_transport(httpx.Limits())) as client,
    ):
        await client.get(f"http://127.0.0.1:{port}/")
        await asyncio.sleep(0.05)
        with pytest.raises(httpx.RemoteProtocolError):
            await client.get(f"http://127.0.0.1:{port}/")
