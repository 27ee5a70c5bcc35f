"""Rules: concurrency caps and multi-window quotas, per destination and per `concurrency_key`.

- **Caps** (`max_in_flight`, `key_max_in_flight`): at most N submits and polls out at the
  provider at once, for the destination and for each key (a tenant, a customer).
- **Quotas** (`quotas`, `key_quotas`): at most `max` submits in any sliding window of `per`
  (providers publish limits per second and per minute, hour or day), for the destination and
  for each key: a rate per key is a quota of `{per = "1s", max = …}` in `key_quotas`.

Where they hold: each submit and poll activity takes its permits (and records its submit)
in the read model's database just before the request (`readmodel.permits`), the same in item
mode, in bulk shards and in lanes. So they are exact across every worker process that shares
the database, whichever host the item is in. A request that cannot go within its activity's
time is handed back to its item as held
(`durable_outbox_temporal.contract.item.ItemErrorType.HELD`), which waits and asks again without
spending an attempt. A worker killed mid-request holds its permits until their lease (the request's
timeout and a margin) ends.

Caps and quotas changed at run time (`readmodel.flow_overrides`) apply to each request that
starts once its worker has read them again (every couple of seconds); requests already out
keep the permits they took.

`FlowLimits` is pure: which scopes a request needs, and their limits. `CapsGate` is the submit
and poll activities' side (through `flowcontrol.guard`): it takes the request's permits, and
records a submit in its quota windows, just before the request, and gives the permits back
after it. Waiting happens there, within the activity, for as long as its timeout leaves room
for the request itself; past that the request is held (`Held`): its item waits and asks again
without spending an attempt, and the activity's slot and the queue's rate token go to others.
A process without the database gets `NoCapsGate`, which serves only destinations with neither.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Protocol

from durable_outbox_temporal.contract.flow_policy import FlowPolicy
from sqlalchemy import Engine

from readmodel.permits import return_permits, settle_requests, take_permits, take_requests

if TYPE_CHECKING:
    from durable_outbox_temporal.destinations import Destination

    from readmodel.flow_overrides import FlowPolicies

# A permit outlives its request's timeout by this much before it counts as lost.
LEASE_MARGIN = timedelta(seconds=5)
# A key longer than this is named in a scope by a hash (scopes are at most 255 characters).
_KEY_IN_SCOPE = 100
# How soon to ask again when a permit was out (its return cannot be seen coming).
_PERMIT_POLL = (0.02, 0.5)

Windows = tuple[tuple[timedelta, int], ...]


def _key(key: str) -> str:
    if len(key) <= _KEY_IN_SCOPE:
        return key
    return f"{key[:40]}~{hashlib.sha256(key.encode()).hexdigest()[:32]}"


@dataclass(frozen=True)
class FlowLimits:
    """One destination's caps and quotas, as a worker process applies them."""

    destination: str
    max_in_flight: int | None = None
    key_max_in_flight: int | None = None
    quotas: Windows = ()
    key_quotas: Windows = ()
    # How long a permit is held at most (a process killed mid-request never returns it): the
    # longest activity of the destination and `LEASE_MARGIN`.
    lease: timedelta = timedelta(seconds=35)
    # The time a request needs: an activity waits for its permits only while it has this left.
    request: timedelta = timedelta(seconds=10)

    @classmethod
    def of(
        cls, destination: str, policy: FlowPolicy, activity_timeout_s: float, request_s: float
    ) -> FlowLimits:
        return cls(
            destination=destination,
            lease=timedelta(seconds=activity_timeout_s) + LEASE_MARGIN,
            request=timedelta(seconds=request_s),
        ).under(policy)

    def under(self, policy: FlowPolicy) -> FlowLimits:
        """These limits with `policy`'s caps and quotas (one changed at run time, say)."""
        return dataclasses.replace(
            self,
            max_in_flight=policy.max_in_flight,
            key_max_in_flight=policy.key_max_in_flight,
            quotas=tuple((quota.window, quota.max) for quota in policy.quotas),
            key_quotas=tuple((quota.window, quota.max) for quota in policy.key_quotas),
        )

    @property
    def active(self) -> bool:
        return bool(self.max_in_flight or self.key_max_in_flight or self.quotas or self.key_quotas)

    def permits(self, key: str | None) -> list[tuple[str, int]]:
        """The permit scopes a request of `key` needs, with their limits."""
        found = []
        if self.max_in_flight:
            found.append((f"inflight/{self.destination}", self.max_in_flight))
        if self.key_max_in_flight and key is not None:
            found.append((f"inflight/{self.destination}/{_key(key)}", self.key_max_in_flight))
        return found

    def submits(self, key: str | None) -> list[tuple[str, Windows]]:
        """The quota scopes a submit of `key` counts in, with their windows."""
        found = []
        if self.quotas:
            found.append((f"quota/{self.destination}", self.quotas))
        if self.key_quotas and key is not None:
            found.append((f"quota/{self.destination}/{_key(key)}", self.key_quotas))
        return found

    def holding(self, scope: str, key: str | None) -> str:
        """What a full `scope` of a request of `key` is, in words (`waiting_on`, held items)."""
        of_key = key is not None and scope.count("/") > 1
        if scope.startswith("inflight/"):
            limit = self.key_max_in_flight if of_key else self.max_in_flight
            whose = f"key {key!r}" if of_key else f"destination {self.destination}"
            return f"the concurrency cap of {whose} ({limit} out at once)"
        windows = self.key_quotas if of_key else self.quotas
        shown = ", ".join(f"{most} per {per.total_seconds():g} s" for per, most in windows)
        whose = f"key {key!r}" if of_key else f"destination {self.destination}"
        return f"the quota of {whose} ({shown})"

    def key_permits(self) -> tuple[str, int] | None:
        """The scope every key's permits sit under (`scope/<key>`), with each key's limit."""
        if not self.key_max_in_flight:
            return None
        return f"inflight/{self.destination}", self.key_max_in_flight

    def key_submits(self) -> tuple[str, Windows] | None:
        """The scope every key's quota windows sit under, with each key's windows."""
        if not self.key_quotas:
            return None
        return f"quota/{self.destination}", self.key_quotas

    def holding_scope(self, scope: str) -> str:
        """`holding` of a scope found full, its key (if any) read from its name."""
        parts = scope.split("/", 2)
        return self.holding(scope, parts[2] if len(parts) == 3 else None)


def flow_limits(
    destinations: Sequence[Destination], default_request_s: float
) -> dict[str, FlowLimits]:
    """Each destination's caps and quotas; a request takes its provider's `timeout_s`, or
    `default_request_s` where its settings name none."""
    return {
        d.name: FlowLimits.of(
            d.name,
            d.flow,
            max(d.delivery.submit_timeout_s, d.delivery.poll_timeout_s),
            float(d.settings.get("timeout_s", default_request_s)),
        )
        for d in destinations
    }


class Held(Exception):
    """The request could not get its permits or quota in time: asked again `retry_after_s`."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class RequestGate(Protocol):
    """What the guard asks of the caps and quotas around a request (`CapsGate`, `NoCapsGate`)."""

    def applies(self, destination: str) -> bool: ...

    def request_time(self, destination: str) -> timedelta: ...

    def slot(
        self,
        destination: str,
        key: str | None,
        *,
        submit: bool,
        deadline: float,
        heartbeat: Callable[[], None] = ...,
    ) -> AbstractAsyncContextManager[None]: ...


class NoCapsGate:
    """The gate of a process without the read model's database, where nothing can be counted: it
    serves only destinations with no caps or quotas, and lets their requests straight through."""

    def __init__(self, limits: Mapping[str, FlowLimits]) -> None:
        active = sorted(name for name, found in limits.items() if found.active)
        if active:
            raise ValueError(
                f"destinations {', '.join(active)} have caps or quotas, which count in the read"
                " model's database: this worker needs DATABASE_URL"
            )

    def applies(self, destination: str) -> bool:
        return False

    def request_time(self, destination: str) -> timedelta:
        return timedelta(0)

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
        yield


class CapsGate:
    """One per worker process: the caps and quotas of every destination it delivers to, counted
    in the read model's database (`readmodel.permits`)."""

    def __init__(
        self,
        engine: Engine,
        limits: Mapping[str, FlowLimits],
        policies: FlowPolicies,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`limits` are each destination's as configured; the caps and quotas changed at run
        time (`policies`) replace them."""
        self._limits = dict(limits)
        self._engine = engine
        self._clock = clock
        self._policies = policies

    def applies(self, destination: str) -> bool:
        """Whether a request of `destination` goes through `slot`: every destination of this
        process does, as it may get a cap at run time (`slot` lets it straight through while it
        has none)."""
        return destination in self._limits

    async def _in_force(self, destination: str) -> FlowLimits | None:
        found = self._limits.get(destination)
        if found is None:
            return None
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
        if limits is None or not limits.active:
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
