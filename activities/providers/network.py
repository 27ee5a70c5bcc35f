"""The provider client's connection pool and sockets, with cheaper checks of whether an idle
connection was closed.

httpcore's pool asks each of its connections whether it has expired every time a request comes
or goes, and for an idle one that means asking the stream whether its socket is readable (the
server closed it). Its anyio stream answers through anyio's typed attributes, which build their
attribute table on every call, then sets up a `poll` for the one check: with a pool of 10, about
a quarter of the client's CPU per request. These streams find their socket once and keep one
`poll` registered on it, and answer the same question the same way.

The pool (`ProviderConnectionPool`) asks only the connection it is about to hand out, and every
other one once a second. httpcore's also went through every connection for every request waiting
for one, on each request that came or went: with a full pool and a queue, as a bulk worker's
hundred activities make on a pool of ten, that was most of the client's CPU per request.
Why: docs/decisions/provider-connection-expiry.md
"""

# The `timeout` parameters are httpcore's interface, which these implement.
# ruff: noqa: ASYNC109

from __future__ import annotations

import select
import socket
import ssl
import time
import typing

import httpx
from httpcore import (
    AnyIOBackend,
    AsyncConnectionInterface,
    AsyncConnectionPool,
    AsyncNetworkBackend,
    AsyncNetworkStream,
    Origin,
)

__all__ = ["ExpiryCheckingBackend", "ProviderConnectionPool", "provider_transport"]

# How often the pool asks every connection whether it expired (closed by the server, or idle
# past its keep-alive); in between it asks only the one it hands out.
SWEEP_EVERY_S = 1.0


def provider_transport(limits: httpx.Limits) -> httpx.AsyncHTTPTransport:
    """httpx's transport with `limits`, its pool a `ProviderConnectionPool` connecting through
    `ExpiryCheckingBackend`. httpx takes no pool, so the one it built is replaced by one with
    its settings (pinned httpx and httpcore; `tests/activities/providers/test_network.py` fails
    if the pool changes shape)."""
    transport = httpx.AsyncHTTPTransport(limits=limits)
    built = transport._pool  # noqa: SLF001 - see the docstring
    if type(built) is not AsyncConnectionPool:
        raise TypeError(f"httpx's pool is a {type(built).__name__}: update provider_transport")
    transport._pool = ProviderConnectionPool(  # noqa: SLF001
        ssl_context=built._ssl_context,  # noqa: SLF001
        max_connections=built._max_connections,  # noqa: SLF001
        max_keepalive_connections=built._max_keepalive_connections,  # noqa: SLF001
        keepalive_expiry=built._keepalive_expiry,  # noqa: SLF001
        http1=built._http1,  # noqa: SLF001
        http2=built._http2,  # noqa: SLF001
        retries=built._retries,  # noqa: SLF001
        local_address=built._local_address,  # noqa: SLF001
        uds=built._uds,  # noqa: SLF001
        socket_options=built._socket_options,  # noqa: SLF001
        network_backend=ExpiryCheckingBackend(),
    )
    return transport


class ProviderConnectionPool(AsyncConnectionPool):
    """httpcore's pool, handing out connections in time linear in its size.

    The same rules as httpcore's own: closed connections leave the pool, idle ones beyond the
    keep-alive limit are closed, a queued request takes the first available connection for its
    origin, else a new one, else one in place of an idle one; and no connection the server
    closed, or idle past its keep-alive, is handed out. Only the expiry check differs: the
    connection about to be handed out is always checked, the others once every
    `SWEEP_EVERY_S` (an expired one left a moment longer only holds its socket)."""

    def __init__(self, *args: typing.Any, **kwargs: typing.Any) -> None:
        super().__init__(*args, **kwargs)
        self._swept_at = time.monotonic()

    def _assign_requests_to_connections(self) -> list[AsyncConnectionInterface]:
        closing: list[AsyncConnectionInterface] = []
        now = time.monotonic()
        sweep = now - self._swept_at >= SWEEP_EVERY_S
        if sweep:
            self._swept_at = now
        for connection in list(self._connections):
            if connection.is_closed():
                self._connections.remove(connection)
            elif (sweep and connection.has_expired()) or (
                connection.is_idle() and len(self._connections) > self._max_keepalive_connections
            ):
                self._connections.remove(connection)
                closing.append(connection)
        for pool_request in [request for request in self._requests if request.is_queued()]:
            origin = pool_request.request.url.origin
            reusable = self._reusable(origin, closing)
            if reusable is not None:
                pool_request.assign_to_connection(reusable)
                continue
            if len(self._connections) >= self._max_connections:
                idle = next((each for each in self._connections if each.is_idle()), None)
                if idle is None:
                    if not any(each.is_available() for each in self._connections):
                        break  # nothing comes free within this call: the rest wait too
                    continue  # it waits for a connection to come free
                self._connections.remove(idle)
                closing.append(idle)
            connection = self.create_connection(origin)
            self._connections.append(connection)
            pool_request.assign_to_connection(connection)
        return closing

    def _reusable(
        self, origin: Origin, closing: list[AsyncConnectionInterface]
    ) -> AsyncConnectionInterface | None:
        """The first available connection for `origin` that has not expired; expired ones met
        on the way are closed."""
        for connection in list(self._connections):
            if not (connection.can_handle_request(origin) and connection.is_available()):
                continue
            if connection.has_expired():
                self._connections.remove(connection)
                closing.append(connection)
                continue
            return connection
        return None


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
