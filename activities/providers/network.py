"""The provider client's sockets, with a cheaper check of whether an idle connection was closed.

httpcore's pool asks each of its connections whether it has expired every time it hands out a
connection, and for an idle one that means asking the stream whether its socket is readable
(the server closed it). Its anyio stream answers through anyio's typed attributes, which build
their attribute table on every call, then sets up a `poll` for the one check: with a pool of 10,
about a quarter of the client's CPU per request. These streams find their socket once and keep
one `poll` registered on it, and answer the same question the same way.
Why: docs/decisions/provider-connection-expiry.md
"""

# The `timeout` parameters are httpcore's interface, which these implement.
# ruff: noqa: ASYNC109

from __future__ import annotations

import select
import socket
import ssl
import typing

import httpx
from httpcore import AnyIOBackend, AsyncConnectionPool, AsyncNetworkBackend, AsyncNetworkStream

__all__ = ["ExpiryCheckingBackend", "provider_transport"]


def provider_transport(limits: httpx.Limits) -> httpx.AsyncHTTPTransport:
    """httpx's transport with `limits`, its pool connecting through `ExpiryCheckingBackend`.
    httpx takes no network backend, so it is set on the pool it built (pinned httpx and
    httpcore; `tests/activities/providers/test_network.py` fails if the pool changes shape)."""
    transport = httpx.AsyncHTTPTransport(limits=limits)
    pool = transport._pool  # noqa: SLF001 - see the docstring
    if not isinstance(pool, AsyncConnectionPool) or not hasattr(pool, "_network_backend"):
        raise TypeError(f"httpx's pool is a {type(pool).__name__}: update provider_transport")
    pool._network_backend = ExpiryCheckingBackend()  # noqa: SLF001
    return transport


class _Stream(AsyncNetworkStream):
    """An httpcore stream whose `is_readable` polls its socket through one kept `poll`."""

    def __init__(self, inner: AsyncNetworkStream, sock: socket.socket | None) -> None:
        self._inner = inner
        self._sock = sock
        self._poll: typing.Any = None
        self._polled_fd = -1

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return await self._inner.read(max_bytes, timeout)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        await self._inner.write(buffer, timeout)

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> AsyncNetworkStream:
        tls = await self._inner.start_tls(ssl_context, server_hostname, timeout)
        return _Stream(tls, self._sock)

    def get_extra_info(self, info: str) -> typing.Any:
        if info == "is_readable":
            return self._is_readable()
        return self._inner.get_extra_info(info)

    def _is_readable(self) -> bool:
        # As httpcore's own check: a socket gone, or readable while the connection is idle
        # (which can only be the server closing it), reads as readable.
        fd = -1 if self._sock is None else self._sock.fileno()
        if fd < 0:
            return True
        if fd != self._polled_fd:
            self._poll = select.poll()
            self._poll.register(fd, select.POLLIN)
            self._polled_fd = fd
        return bool(self._poll.poll(0))


class ExpiryCheckingBackend(AsyncNetworkBackend):
    """httpcore's anyio backend (httpx's default under asyncio), its streams `_Stream`s."""

    def __init__(self) -> None:
        self._backend = AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: typing.Iterable[typing.Any] | None = None,
    ) -> AsyncNetworkStream:
        stream = await self._backend.connect_tcp(host, port, timeout, local_address, socket_options)
        return _Stream(stream, stream.get_extra_info("socket"))

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: typing.Iterable[typing.Any] | None = None,
    ) -> AsyncNetworkStream:
        stream = await self._backend.connect_unix_socket(path, timeout, socket_options)
        return _Stream(stream, stream.get_extra_info("socket"))

    async def sleep(self, seconds: float) -> None:
        await self._backend.sleep(seconds)
