"""Running many calls to Temporal at once, politely."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

# Concurrent calls per batch or sweep: enough to hide RPC latency, few enough to be polite to
# the cluster.
FAN_OUT = 10

T = TypeVar("T")


async def fan_out(calls: Sequence[Callable[[], Awaitable[T]]]) -> list[T | Exception]:
    """Run the calls at most FAN_OUT at a time; each result or exception in call order."""
    limit = asyncio.Semaphore(FAN_OUT)

    async def one(call: Callable[[], Awaitable[T]]) -> T | Exception:
        async with limit:
            try:
                return await call()
            except Exception as err:
                return err

    return list(await asyncio.gather(*(one(call) for call in calls)))
