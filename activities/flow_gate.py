"""The submit and poll activities' side of the caps and quotas (`flowcontrol/caps.py`): take the
request's permits, and record a submit in its quota windows, in the read model's database just
before the request; give the permits back after it.

Waiting happens here, within the activity, for as long as its timeout leaves room for the
request itself; past that the request is held (`Held`): its item waits and asks again without
spending an attempt, and the activity's slot and the queue's rate token go to others.

The caps and quotas in force are the destinations file's with the run-time overrides
(`readmodel.flow_overrides.FlowPolicies`), read again every couple of seconds.
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
from readmodel.flow_overrides import FlowPolicies
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
        policies: FlowPolicies | None = None,
    ) -> None:
        """`limits` are each destination's as configured; with `policies`, the caps and quotas
        changed at run time replace them."""
        active = sorted(name for name, found in limits.items() if found.active)
        if active and engine is None:
            raise ValueError(
                f"destinations {', '.join(active)} have caps or quotas, which count in the read"
                " model's database: this worker needs DATABASE_URL"
            )
        self._limits = dict(limits)
        self._engine = engine
        self._clock = clock
        self._policies = policies if engine is not None else None

    def applies(self, destination: str) -> bool:
        """Whether a request of `destination` goes through `slot` (one that may get a cap at
        run time does: `slot` lets it straight through while it has none)."""
        found = self._limits.get(destination)
        if found is None or self._engine is None:
            return False
        return found.active or self._policies is not None

    async def _in_force(self, destination: str) -> FlowLimits | None:
        found = self._limits.get(destination)
        if found is None or self._policies is None:
            return found
        policy = await self._policies.fresh(destination)
        return found if policy is None else found.under(policy)

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
        limits = await self._in_force(destination)
        if limits is None or not limits.active or self._engine is None:
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
                seconds = wait.total_seconds()
                why = " or ".join(limits.holding(scope, key) for scope, _ in quotas)
            else:
                seconds, why = pause, limits.holding(full, key)
                pause = min(pause * 2, _PERMIT_POLL[1])
            if self._clock() + seconds > deadline:
                raise Held(f"held by {why}", max(seconds, _PERMIT_POLL[0]))
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
