"""What the provider client costs per request, with httpcore's own streams and with the ones that
check an idle connection's socket more cheaply (`activities/providers/network.py`).

The fake provider runs in a process of its own, so only the client's CPU is counted: 1,500
requests 10 at once through a pool of 10 (the bench's `PROVIDER_MAX_CONNECTIONS`), in six
alternating rounds. `python -m bench.provider_client`;
docs/decisions/provider-connection-expiry.md
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

from activities.providers.network import provider_transport

REQUESTS = 1500
AT_ONCE = 10
POOL = 10
ROUNDS = 6


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
    if kind == "httpcore's":
        return httpx.AsyncClient(limits=limits)
    return httpx.AsyncClient(limits=limits, transport=provider_transport(limits))


async def _cpu_ms_per_request(kind: str, url: str) -> float:
    async with _client(kind) as client:
        gate = asyncio.Semaphore(AT_ONCE)

        async def one() -> None:
            async with gate:
                (await client.get(f"{url}/_admin/stats")).raise_for_status()

        await asyncio.gather(*(one() for _ in range(100)))  # the pool filled
        started = time.process_time()
        await asyncio.gather(*(one() for _ in range(REQUESTS)))
        return (time.process_time() - started) / REQUESTS * 1000


def main() -> None:
    kinds = ["httpcore's", "the product's"]
    figures: dict[str, list[float]] = {kind: [] for kind in kinds}
    with _fake_provider() as url:
        for round_ in range(ROUNDS):
            for kind in kinds if round_ % 2 == 0 else reversed(kinds):
                figures[kind].append(asyncio.run(_cpu_ms_per_request(kind, url)))
    for kind, values in figures.items():
        shown = ", ".join(f"{value:.3f}" for value in values)
        median = sorted(values)[ROUNDS // 2]
        print(f"{kind:>13} streams: client CPU ms per request {shown} (median {median:.3f})")


if __name__ == "__main__":
    main()
