"""What the provider client costs per request: httpcore's own pool and streams, the product's
streams (which check an idle connection's socket more cheaply) in httpcore's pool, and the
product's pool and streams (`activities/providers/network.py`).

The fake provider runs in a process of its own, so only the client's CPU is counted: 1,500
requests through a pool of 10 (the bench's `PROVIDER_MAX_CONNECTIONS`), 10 at once and then 100
at once (a bulk worker's hundred activities out, waiting for the pool), each in six alternating
rounds. `python -m bench.provider_client`; docs/decisions/provider-connection-expiry.md
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx

from activities.providers.network import ExpiryCheckingBackend, provider_transport

REQUESTS = 1500
AT_ONCE = (10, 100)
POOL = 10
ROUNDS = 6
KINDS = ("httpcore's pool and streams", "the product's streams", "the product's pool and streams")


@contextlib.contextmanager
def _fake_provider() -> Iterator[str]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "devstack.fake_provider", "--port", str(port)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            with contextlib.suppress(httpx.HTTPError):
                httpx.get(f"{url}/_admin/stats").raise_for_status()
                break
            time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        process.wait()


def _client(kind: str) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=POOL, max_keepalive_connections=POOL)
    if kind == KINDS[0]:
        return httpx.AsyncClient(limits=limits)
    if kind == KINDS[1]:
        # The product's streams in httpcore's own pool (its client before the pool of its own).
        transport = httpx.AsyncHTTPTransport(limits=limits)
        transport._pool._network_backend = ExpiryCheckingBackend()  # noqa: SLF001
        return httpx.AsyncClient(transport=transport)
    return httpx.AsyncClient(transport=provider_transport(limits))


async def _cpu_ms_per_request(kind: str, url: str, at_once: int) -> float:
    async with _client(kind) as client:
        gate = asyncio.Semaphore(at_once)

        async def one() -> None:
            async with gate:
                (await client.get(f"{url}/_admin/stats")).raise_for_status()

        await asyncio.gather(*(one() for _ in range(100)))  # the pool filled
        started = time.process_time()
        await asyncio.gather(*(one() for _ in range(REQUESTS)))
        return (time.process_time() - started) / REQUESTS * 1000


def main() -> None:
    with _fake_provider() as url:
        for at_once in AT_ONCE:
            figures: dict[str, list[float]] = {kind: [] for kind in KINDS}
            for round_ in range(ROUNDS):
                for kind in KINDS if round_ % 2 == 0 else reversed(KINDS):
                    figures[kind].append(asyncio.run(_cpu_ms_per_request(kind, url, at_once)))
            print(f"{at_once} at once through a pool of {POOL}:")
            for kind, values in figures.items():
                shown = ", ".join(f"{value:.3f}" for value in values)
                median = sorted(values)[ROUNDS // 2]
                print(f"  {kind:>31}: client CPU ms per request {shown} (median {median:.3f})")


if __name__ == "__main__":
    main()
