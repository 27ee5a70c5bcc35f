"""What a plain `def` FastAPI dependency costs per request: the thread pool hand-off FastAPI makes
for each one, against the same dependencies as `async def`.

A route with five dependencies (one more than `POST /v1/outboxes/{outbox}/items` ran as plain
`def`: the token and content-type checks, the item service, the metrics), each an attribute
read, called through the ASGI app in-process, 10 requests at once, in alternating rounds.
Prints the CPU per request of each kind. `python -m bench.api_dependencies`;
docs/decisions/async-dependencies.md
"""

import asyncio
import time
from collections.abc import Callable
from typing import Annotated, Any

import httpx
from fastapi import Depends, FastAPI, Request

REQUESTS = 2000
AT_ONCE = 10
ROUNDS = 6


def _app(run_on_loop: bool) -> FastAPI:
    app = FastAPI()
    app.state.resource = object()

    def dependency() -> Callable[..., Any]:
        def read(request: Request) -> object:
            return request.app.state.resource

        async def read_async(request: Request) -> object:
            return request.app.state.resource

        return read_async if run_on_loop else read

    first, second, third = dependency(), dependency(), dependency()

    @app.post("/v1/items", dependencies=[Depends(dependency()), Depends(dependency())])
    async def enqueue(
        a: Annotated[object, Depends(first)],
        b: Annotated[object, Depends(second)],
        c: Annotated[object, Depends(third)],
    ) -> dict[str, bool]:
        return {"ok": True}

    return app


async def _cpu_ms_per_request(app: FastAPI, requests: int) -> float:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
        gate = asyncio.Semaphore(AT_ONCE)

        async def one() -> None:
            async with gate:
                response = await client.post("/v1/items", json={})
                response.raise_for_status()

        await asyncio.gather(*(one() for _ in range(100)))  # warm up
        started = time.process_time()
        await asyncio.gather(*(one() for _ in range(requests)))
        return (time.process_time() - started) / requests * 1000


def main() -> None:
    apps = {"def": _app(run_on_loop=False), "async def": _app(run_on_loop=True)}
    figures: dict[str, list[float]] = {kind: [] for kind in apps}
    for round_ in range(ROUNDS):
        order = list(apps) if round_ % 2 == 0 else list(reversed(apps))
        for kind in order:
            figures[kind].append(asyncio.run(_cpu_ms_per_request(apps[kind], REQUESTS)))
    for kind, values in figures.items():
        shown = ", ".join(f"{value:.3f}" for value in values)
        print(f"{kind:>9}: CPU ms per request {shown} (median {sorted(values)[ROUNDS // 2]:.3f})")


if __name__ == "__main__":
    main()
