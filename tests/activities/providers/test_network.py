"""The provider client's streams answer httpcore's "did the server close this idle connection?"
as httpcore's own do, from a socket found once, and its pool asks it of the connection it hands
out rather than of every one, every time (`activities/providers/network.py`)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

import httpx
import pytest
from httpcore import AsyncConnectionPool

from activities.providers import network
from activities.providers.network import (
    ExpiryCheckingBackend,
    ProviderConnectionPool,
    _Stream,
    provider_transport,
)


def test_a_socket_reads_readable_once_its_peer_closes_or_it_is_closed() -> None:
    ours, theirs = socket.socketpair()
    stream = _Stream(inner=None, sock=ours)  # type: ignore[arg-type]  # only its socket is used
    assert stream.get_extra_info("is_readable") is False
    assert stream.get_extra_info("is_readable") is False
    theirs.close()
    assert stream.get_extra_info("is_readable") is True
    ours.close()
    assert stream.get_extra_info("is_readable") is True


def test_the_provider_transport_connects_through_the_cheaper_checks() -> None:
    transport = provider_transport(httpx.Limits(max_connections=3, max_keepalive_connections=2))
    pool = transport._pool  # noqa: SLF001
    assert isinstance(pool, ProviderConnectionPool)
    assert isinstance(pool._network_backend, ExpiryCheckingBackend)  # noqa: SLF001
    assert (pool._max_connections, pool._max_keepalive_connections) == (3, 2)  # noqa: SLF001


_RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok"


@contextlib.asynccontextmanager
async def http_server(*, keep_alive: bool) -> AsyncIterator[tuple[int, list[asyncio.StreamWriter]]]:
    """A server that answers "ok": only each connection's first request, then it closes the
    connection, or (`keep_alive`) every request, keeping it open. Its port and its connections'
    writers (a list that grows; closing one closes that connection from the server's side)."""
    writers: list[asyncio.StreamWriter] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                await reader.readuntil(b"\r\n\r\n")
                if keep_alive:
                    await asyncio.sleep(0.01)  # long enough for the requests to overlap
                writer.write(_RESPONSE)
                await writer.drain()
                if not keep_alive:
                    break
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1], writers
    finally:
        server.close()
        for writer in writers:
            writer.close()
        await server.wait_closed()


async def test_a_connection_the_server_closed_while_idle_is_not_used_again() -> None:
    """The pool must see each closed idle connection and open another, or the next request
    fails on a dead one."""
    limits = httpx.Limits(max_connections=2, max_keepalive_connections=2)
    async with (
        http_server(keep_alive=False) as (port, accepted),
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
        http_server(keep_alive=False) as (port, _),
        httpx.AsyncClient(transport=provider_transport(httpx.Limits())) as client,
    ):
        await client.get(f"http://127.0.0.1:{port}/")
        await asyncio.sleep(0.05)
        with pytest.raises(httpx.RemoteProtocolError):
            await client.get(f"http://127.0.0.1:{port}/")


async def _checks_per_request(monkeypatch: pytest.MonkeyPatch, idle: int) -> int:
    """How many sockets one request checks with `idle` idle connections in the pool."""
    checks = 0
    readable = _Stream._is_readable

    def counted(stream: _Stream) -> bool:
        nonlocal checks
        checks += 1
        return readable(stream)

    monkeypatch.setattr(_Stream, "_is_readable", counted)
    limits = httpx.Limits(max_connections=idle, max_keepalive_connections=idle)
    async with (
        http_server(keep_alive=True) as (port, _),
        httpx.AsyncClient(transport=provider_transport(limits)) as client,
    ):
        url = f"http://127.0.0.1:{port}/"
        await asyncio.gather(*(client.get(url) for _ in range(idle)))
        assert len(client._transport._pool.connections) == idle  # noqa: SLF001
        checks = 0
        assert (await client.get(url)).text == "ok"
        return checks


async def test_a_request_checks_the_connection_it_is_handed_not_every_idle_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(network, "SWEEP_EVERY_S", 3600.0)
    assert await _checks_per_request(monkeypatch, idle=20) == 1
    # httpcore's own pool checks each idle connection when the request comes and when it goes.
    monkeypatch.setattr(
        ProviderConnectionPool,
        "_assign_requests_to_connections",
        AsyncConnectionPool._assign_requests_to_connections,
    )
    assert await _checks_per_request(monkeypatch, idle=20) >= 20


async def test_idle_connections_the_server_closed_leave_the_pool_at_the_next_sweep(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(network, "SWEEP_EVERY_S", 0.2)
    limits = httpx.Limits(max_connections=5, max_keepalive_connections=5)
    async with (
        http_server(keep_alive=True) as (port, writers),
        httpx.AsyncClient(transport=provider_transport(limits)) as client,
    ):
        url = f"http://127.0.0.1:{port}/"
        await asyncio.gather(*(client.get(url) for _ in range(5)))
        pool = client._transport._pool  # noqa: SLF001
        assert len(pool.connections) == 5
        for writer in writers[1:]:
            writer.close()
        await asyncio.sleep(0.3)
        assert (await client.get(url)).text == "ok"
        assert len(pool.connections) == 1


async def test_idle_connections_beyond_the_keep_alive_limit_are_closed() -> None:
    limits = httpx.Limits(max_connections=6, max_keepalive_connections=2)
    async with (
        http_server(keep_alive=True) as (port, _),
        httpx.AsyncClient(transport=provider_transport(limits)) as client,
    ):
        url = f"http://127.0.0.1:{port}/"
        answers = await asyncio.gather(*(client.get(url) for _ in range(6)))
        assert [answer.text for answer in answers] == ["ok"] * 6
        pool = client._transport._pool  # noqa: SLF001
        assert len(pool.connections) <= 2
        assert all(connection.is_idle() for connection in pool.connections)
