"""The submit and poll activities' side of the caps and quotas (`flowcontrol/caps.py`): take the
request's permits, and record a submit in its quota windows, in the read model's database just
before the request; give the permits back after it.

Waiting happens here, within the activity, for as long as its timeout leaves room for the
request itself; past that the request is held (`Held`): its item waits and asks again without
spending an attempt, and the activity's slot and the queue's rate token go to others.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from datetime import UTC, datetime, timedelta

from sqlalchemy import Engine

from flowcontrol.caps import FlowLimits
from readmodel.permits import return_permits, settle_requests, take_permits, take_requests

# How soon to ask again when a permit was out (its return cannot be seen coming).
_PERMIT_POLL = (0.02, 0.5)


class Held(Exception):
    """The request could not get its permits or quota in time: asked again `retry_after_s`."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class FlowGate:
    """One per worker process: the caps and quotas of every destination it delivers to."""

    def __init__(
        self,
        engine: Engine | None,
        limits: Mapping[str, FlowLimits],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._limits = {name: found for name, found in limits.items() if found.active}
        if self._limits and engine is None:
            names = ", ".join(sorted(self._limits))
            raise ValueError(
                f"destinations {names} have caps or quotas, which count in the read model's"
                " database: this worker needs DATABASE_URL"
            )
        self._engine = engine
        self._clock = clock

    def applies(self, destination: str) -> bool:
        return destination in self._limits

    def request_time(self, destination: str) -> timedelta:
        """The time a request of `destination` needs once it has its permits."""
        found = self._limits.get(destination)
        return found.request if found is not None else timedelta(0)

    @contextlib.asynccontextmanager
    async def slot(
        self,
        destination: str,
        key: str | None,
        *,
        submit: bool,
        deadline: float,
        heartbeat: Callable[[], None] = lambda: None,
    ) -> AsyncIterator[None]:
        """Hold a request's permits (and record a submit in its quotas) while it runs; waits
        until `deadline` (epoch seconds) at most, then raises `Held`."""
        limits = self._limits.get(destination)
        if limits is None or self._engine is None:
            yield
            return
        engine = self._engine
        permits = limits.permits(key)
        quotas = limits.submits(key) if submit else []
        holder = uuid.uuid4().hex
        pause = _PERMIT_POLL[0]
        recorded: list[int] = []
        while True:
            now = datetime.fromtimestamp(self._clock(), UTC)
            full = await asyncio.to_thread(take_permits, engine, permits, holder, now, limits.lease)
            if full is None:
                # Recorded at its latest until answered: see `readmodel.permits.take_requests`.
                wait, recorded = await asyncio.to_thread(
                    take_requests, engine, quotas, now, now + limits.lease
                )
                if wait <= timedelta(0):
                    break
                await asyncio.to_thread(return_permits, engine, [s for s, _ in permits], holder)
                seconds, why = wait.total_seconds(), f"quota of {destination} full"
            else:
                seconds, why = pause, f"{full} at its cap"
                pause = min(pause * 2, _PERMIT_POLL[1])
            if self._clock() + seconds > deadline:
                raise Held(f"held: {why}", max(seconds, _PERMIT_POLL[0]))
            heartbeat()
            await asyncio.sleep(seconds)
        try:
            yield
        finally:
            answered = datetime.fromtimestamp(self._clock(), UTC)
            if recorded:
                await asyncio.to_thread(settle_requests, engine, recorded, answered)
            if permits:
                await asyncio.to_thread(return_permits, engine, [s for s, _ in permits], holder)
