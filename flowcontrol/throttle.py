"""Rule: a throttle felt by the whole destination, not by each item.

A 429 (or 503) with `Retry-After` from one submit pauses the destination's submit queue on the
Temporal server until that time (`queue_rates.throttle_queue`), so no worker process dispatches
another submit meanwhile; each process that saw it also holds its own submits already
dispatched (`ThrottleGate.hold`). The destination's flow workflow
(`durable_outbox_temporal.contract.flow`) owns the resume: a durable timer to the Retry-After time,
then the rate back. A storm that comes back within `storm_window_s` of a resume halves the rate the
queue resumes at (down to 1/16); every
`ramp_step_s` without one doubles it, until it is whole again.

How exact: the pause holds across every worker from the moment the server applies it (a moment
after the RPC); submits dispatched before then still go, and meet the throttle on their own
(each waits its own Retry-After, as before). Why a workflow owns the resume:
docs/decisions/throttle-pause.md.

The state machine (`on_throttled`, `next_change`, `applied`) is pure: the flow workflow runs it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from durable_outbox_temporal.contract.flow import (
    FlowEvent,
    FlowState,
    RateApplied,
    RateChange,
    Throttled,
)

from flowcontrol.queue_rates import ADAPTIVE_REASON

if TYPE_CHECKING:
    from durable_outbox_temporal.contract.flow_policy import FlowPolicy
    from durable_outbox_temporal.destinations import Destination

# The statuses a provider throttles with (503 counts only with a Retry-After).
THROTTLE_STATUSES = (429, 503)
# The least share of its rate a destination resumes at after storms that keep coming back.
MIN_FACTOR = 1 / 16


def on_throttled(state: FlowState, seen: Throttled, now: datetime) -> None:
    """A submit met a throttle: the queue is paused until `seen.until` (or later). While the
    destination's circuit is open (`flowcontrol.breaker`), its pause stands instead."""
    state.configured_rate = seen.configured_rate
    if state.circuit != "closed":
        return
    new_storm = state.paused_until is None
    if state.paused_until is None or seen.until > state.paused_until:
        state.paused_until = seen.until
    if not new_storm:
        return
    state.storms += 1
    detail = f"HTTP {seen.status} from {seen.destination}: paused until {seen.until.isoformat()}"
    came_back = state.resumed_at is not None and (
        now - state.resumed_at < timedelta(seconds=state.storm_window_s)
    )
    # An adaptive rate falls by itself on the throttle's 429s (`flowcontrol.adaptive`): the
    # storm's own halving stays out of its way.
    if came_back and state.factor > MIN_FACTOR and state.adaptive is None:
        state.factor = max(state.factor / 2, MIN_FACTOR)
        detail += f"; the storm came back: resuming at {state.factor:g} of the rate"
    state.record(FlowEvent(at=now, kind="throttled", detail=detail, rate=0.0))


def due(state: FlowState) -> datetime | None:
    """When the flow next has something to do for this rule (None: nothing until another
    throttle; nothing while the circuit is open)."""
    if state.circuit != "closed":
        return None
    if state.paused_until is not None:
        return state.paused_until
    if state.factor < 1 and state.ramped_at is not None:
        return state.ramped_at + timedelta(seconds=state.ramp_step_s)
    return None


def next_change(state: FlowState, now: datetime) -> RateChange | None:
    """The rate change due at `now`, if one is."""
    at = due(state)
    if at is None or now < at:
        return None
    if state.paused_until is not None:
        return RateChange(
            task_queue=state.task_queue,
            kind="resume",
            factor=state.factor,
            configured_rate=state.configured_rate,
            # Mid-ramp, the rate to return to is the one from before the storms.
            base_rate=state.base_rate if state.rate is not None else None,
            from_ramp=state.rate is not None,
            reason_prefix=ADAPTIVE_REASON if state.adaptive is not None else "",
        )
    factor = min(1.0, state.factor * 2)
    return RateChange(
        task_queue=state.task_queue,
        kind="ramp",
        factor=factor,
        configured_rate=state.configured_rate,
        expected=state.rate,
        base_rate=state.base_rate,
        from_ramp=True,
    )


def applied(state: FlowState, change: RateChange, result: RateApplied, now: datetime) -> None:
    """What `apply_rate` did with `change`."""
    if result.paused_until is not None:
        # Paused for longer meanwhile (another throttle): wait for that.
        state.paused_until = max(state.paused_until or result.paused_until, result.paused_until)
        return
    if change.kind == "resume" and state.paused_until is not None and state.paused_until <= now:
        state.paused_until = None
        state.resumed_at = now
    if result.released:
        # An operator paused, resumed or set a rate meanwhile: the queue is theirs now.
        state.factor, state.rate, state.base_rate, state.ramped_at = 1.0, None, None, None
        state.record(FlowEvent(at=now, kind="released", detail="the rate was set by hand"))
        return
    state.factor = change.factor
    state.rate = result.rate if change.factor < 1 else None
    state.base_rate = result.base_rate
    state.ramped_at = now if change.factor < 1 else None
    kind = change.kind + "d" if change.factor < 1 else "recovered"
    shown = "its configured rate" if result.rate is None else f"{result.rate:g}/s"
    state.record(FlowEvent(at=now, kind=kind, detail=f"submits at {shown}", rate=result.rate))


@dataclass(frozen=True)
class ThrottledQueue:
    """What a worker process knows of a destination for this rule."""

    destination: str
    task_queue: str
    configured_rate: float
    pause: bool
    max_pause_s: float
    ramp_step_s: float
    storm_window_s: float
    # Where the destination's flow sends operational events (`FlowPolicy.events_destination`).
    events_destination: str | None = None
    # An adaptive destination's interval (`flowcontrol.adaptive`): a `Retry-After` no longer
    # than it is a rate signal the adaptive rate answers, not a storm to pause for.
    adaptive_interval_s: float | None = None

    @classmethod
    def of(
        cls, destination: str, task_queue: str, configured_rate: float, policy: FlowPolicy
    ) -> ThrottledQueue:
        """A destination's submit queue under `policy`'s throttle settings."""
        return cls(
            destination=destination,
            task_queue=task_queue,
            configured_rate=configured_rate,
            pause=policy.throttle_pause,
            max_pause_s=policy.throttle_max_pause_s,
            ramp_step_s=policy.throttle_ramp_step_s,
            storm_window_s=policy.throttle_storm_window_s,
            events_destination=policy.events_destination,
            adaptive_interval_s=policy.adaptive_interval_s if policy.adaptive else None,
        )


def throttled_queues(destinations: Sequence[Destination]) -> dict[str, ThrottledQueue]:
    """Each destination's submit queue as this rule sees it, by destination name."""
    return {
        d.name: ThrottledQueue.of(d.name, d.submit_task_queue, d.submit_queue_rate, d.flow)
        for d in destinations
    }


class ThrottleGate:
    """The submit activity's side of the rule, one per worker process: pauses the queue and
    tells the flow when a throttle is met, and holds this process's submits until the pause
    it knows of ends."""

    def __init__(
        self,
        queues: Mapping[str, ThrottledQueue],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._queues = dict(queues)
        self._clock = clock
        # Task queue -> until when (epoch seconds) this process asked the server to pause it,
        # and until when the server did: only a pause that took holds this process's submits.
        self._asked: dict[str, float] = {}
        self._held: dict[str, float] = {}

    def queue(self, destination: str) -> ThrottledQueue | None:
        return self._queues.get(destination)

    async def hold(self, task_queue: str) -> None:
        """Wait until the pause this process put on `task_queue` ends."""
        until = self._held.get(task_queue)
        if until is not None:
            wait = until - self._clock()
            if wait > 0:
                await asyncio.sleep(wait)

    def throttled(
        self, destination: str, status: int | None, retry_after_s: float | None
    ) -> tuple[ThrottledQueue, datetime] | None:
        """The queue to pause and until when, for a submit's throttle; None when the rule does
        not apply (another status, no Retry-After, the rule off) or this process has asked for
        a pause at least as long already."""
        queue = self._queues.get(destination)
        if queue is None or not queue.pause or status not in THROTTLE_STATUSES:
            return None
        if retry_after_s is None or retry_after_s <= 0:
            return None
        if queue.adaptive_interval_s is not None and retry_after_s <= queue.adaptive_interval_s:
            return None  # the adaptive rate slows down for it; the item waits its own

        until = self._clock() + min(retry_after_s, queue.max_pause_s)
        asked = self._asked.get(queue.task_queue)
        if asked is not None and asked >= until - 0.05:
            return None
        self._asked[queue.task_queue] = until
        return queue, datetime.fromtimestamp(until, UTC)

    def paused(self, task_queue: str, until: datetime) -> None:
        """The server paused `task_queue` until `until`: this process holds its submits too."""
        self._held[task_queue] = max(self._held.get(task_queue, 0.0), until.timestamp())

    def not_paused(self, task_queue: str) -> None:
        """Asking the server failed: the next throttle asks again."""
        self._asked.pop(task_queue, None)
