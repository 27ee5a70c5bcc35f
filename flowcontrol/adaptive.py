"""Rule: a submit rate that learns its provider's limit (`[destinations.<name>.flow] adaptive`).

Additive increase, multiplicative decrease, as TCP finds a link's capacity: each worker process
counts its submits' outcomes to the destination over `adaptive_interval_s` (`AdaptiveMeter`) and
reports them to the destination's flow workflow (signal `submit_outcomes`). At each interval the
flow moves the rate (`next_change`):

- any congestion (a 429 or 503, a timeout or connection error) or an answer slower than
  `adaptive_latency_target_s`: the rate falls to `DECREASE` of what the provider took over the
  interval (the submits answered, a second) when the submits kept it busy and it took some,
  else to `MAX_DECREASE` of itself (little traffic, or a provider that took nothing, says
  nothing of the limit); never below the floor. What it took is remembered as where congestion
  begins. A fall to what it took is one per episode: congestion reported within `HOLD_OFF`
  intervals after it is the fall's lag (the submits already on their way, the server's burst
  at the old rate), not a new episode, and moves nothing;
- otherwise, with submits answered: it rises by `1/STEPS` of the span from floor to ceiling, and
  by `1/NEAR_STEP` of that near where congestion began last (`NEAR`), so the rate lingers around
  the provider's limit instead of overrunning it every few seconds; well past that point, the
  limit has moved and the big steps come back. Never above the ceiling;
- no submits: it stays (nothing was learnt).

The flow sets the rate on the submit queue on the Temporal server (`activities/flow.py`, kind
"adapt"), so every worker is held to it, and it outlives the flow: a later run of the flow
adopts the rate it finds. Beside it, a throttle still pauses the queue until its `Retry-After`
and resumes at the adaptive rate, which goes on moving meanwhile (this rule takes the place of the
throttle's own storm halving, `flowcontrol.throttle`); an open circuit or an operator's pause holds
it (no change while paused); a rate an operator sets by hand wins until it is lifted. Rates are
kept to two decimals (the server holds them as 32-bit floats: they are compared within
`math.isclose`).

Why these moves, and what they measured: docs/decisions/adaptive-rate.md.

The state machine (`on_outcomes`, `due`, `next_change`, `applied`) is pure: the flow runs it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from durable_outbox_temporal.contract.flow import (
    AdaptiveRate,
    FlowEvent,
    FlowState,
    RateApplied,
    RateChange,
    RatePoint,
    SubmitOutcomes,
)

if TYPE_CHECKING:
    from durable_outbox_temporal.destinations import Destination

# A congested interval takes the rate to this share of what the provider took, when the
# submits kept it busy (at least BUSY of the rate); otherwise to MAX_DECREASE of the rate.
DECREASE = 0.9
BUSY = 0.5
MAX_DECREASE = 0.7
# A good interval adds this share of the span from floor to ceiling; near where congestion
# began last (from NEAR[0] to NEAR[1] of that rate), 1/NEAR_STEP of it.
STEPS = 50
NEAR = (0.85, 1.25)
NEAR_STEP = 5
# Intervals after a fall to what the provider took in which congestion moves nothing: the
# fall takes that long to show at the provider (measured: docs/decisions/adaptive-rate.md).
HOLD_OFF = 2
# The statuses that say the provider is overloaded; a failure with no status (a timeout, a
# connection error) says so too.
CONGESTED_STATUSES = (429, 503)
# A move this large (relative) since the last one told is an "adapted" event.
TOLD_CHANGE = 1 / 3


def on_outcomes(state: FlowState, seen: SubmitOutcomes, now: datetime) -> None:
    """A worker process's outcomes over its last interval: counted towards the next move. The
    bounds are the report's (the destinations file as deployed)."""
    adaptive = state.adaptive
    if adaptive is None:
        adaptive = state.adaptive = AdaptiveRate(
            floor=seen.floor,
            ceiling=seen.ceiling,
            latency_target_s=seen.latency_target_s,
            interval_s=seen.interval_s,
            rate=min(max(seen.configured_rate, seen.floor), seen.ceiling),
            adjusted_at=now,
        )
    adaptive.floor, adaptive.ceiling = seen.floor, seen.ceiling
    adaptive.latency_target_s, adaptive.interval_s = seen.latency_target_s, seen.interval_s
    adaptive.ok += seen.ok
    adaptive.slow += seen.slow
    adaptive.congested += seen.congested


def due(state: FlowState) -> datetime | None:
    """When the flow next moves the rate (None: nothing reported since the last move)."""
    adaptive = state.adaptive
    if adaptive is None or adaptive.ok + adaptive.slow + adaptive.congested == 0:
        return None
    if not adaptive.adopted or adaptive.adjusted_at is None:
        return adaptive.adjusted_at
    return adaptive.adjusted_at + timedelta(seconds=adaptive.interval_s)


def next_change(state: FlowState, now: datetime, *, episodes: bool = True) -> RateChange | None:
    """The move due at `now`, if one is; the outcomes it weighs are taken (reports arriving
    while it is applied count towards the next one). `episodes=False`: the moves of a flow run
    from before congestion was taken as episodes (`HOLD_OFF`), as its history recorded them."""
    adaptive = state.adaptive
    at = due(state)
    if adaptive is None or at is None or now < at:
        return None
    change = RateChange(
        task_queue=state.task_queue,
        kind="adapt",
        factor=1.0,
        configured_rate=state.configured_rate,
        expected=None if adaptive.released else adaptive.rate,
    )
    if not adaptive.adopted:
        return change  # read the rate in force first
    congested = adaptive.congested + adaptive.slow > 0
    if congested and episodes and _lag_of_the_last_fall(adaptive, now):
        adaptive.ok = adaptive.slow = adaptive.congested = 0
        adaptive.adjusted_at = now
        return None
    if congested:
        elapsed = (now - adaptive.adjusted_at).total_seconds() if adaptive.adjusted_at else 0
        span = max(elapsed, adaptive.interval_s)
        taken = (adaptive.ok + adaptive.slow) / span
        if episodes:
            # Busy by what was sent, refused submits included: a limit that fell far below the
            # rate refuses most of them, and what was taken is then the limit, not little
            # traffic. A provider that took nothing says nothing of its limit.
            sent = (adaptive.ok + adaptive.slow + adaptive.congested) / span
            measured = sent >= adaptive.rate * BUSY and taken >= adaptive.floor
        else:
            measured = taken >= adaptive.rate * BUSY
        target = min(adaptive.rate, taken) * DECREASE if measured else adaptive.rate * MAX_DECREASE
        rate = max(adaptive.floor, round(target, 2))
        if episodes:
            adaptive.congested_at = min(adaptive.rate, taken) if measured else adaptive.rate
            adaptive.decreased_at = now if measured else None
        else:
            adaptive.congested_at = adaptive.rate
        change.detail = (
            f"{adaptive.congested} congested and {adaptive.slow} slow of"
            f" {adaptive.ok + adaptive.slow + adaptive.congested} submits"
        )
    else:
        step = (adaptive.ceiling - adaptive.floor) / STEPS
        near = adaptive.congested_at
        if near is not None and near * NEAR[0] <= adaptive.rate <= near * NEAR[1]:
            step /= NEAR_STEP
        elif near is not None and adaptive.rate > near * NEAR[1]:
            adaptive.congested_at = None  # past it without congestion: the limit moved
        rate = min(adaptive.ceiling, round(adaptive.rate + step, 2))
        change.detail = f"{adaptive.ok} submits answered within the target"
    adaptive.ok = adaptive.slow = adaptive.congested = 0
    adaptive.adjusted_at = now
    if rate == adaptive.rate and not adaptive.released:
        return None  # at its bound already: no call
    change.rate = rate
    return change


def _lag_of_the_last_fall(adaptive: AdaptiveRate, now: datetime) -> bool:
    """Whether congestion reported now is the lag of the last fall to what the provider took."""
    fell = adaptive.decreased_at
    return fell is not None and now - fell < timedelta(seconds=HOLD_OFF * adaptive.interval_s)


def applied(state: FlowState, change: RateChange, result: RateApplied, now: datetime) -> None:
    """What `apply_flow_rate` did with an "adapt" change."""
    adaptive = state.adaptive
    if adaptive is None:
        return
    if result.released:
        if not adaptive.released:
            adaptive.released = True
            detail = "the rate was set by hand: the adaptive rate waits until it is lifted"
            state.record(FlowEvent(at=now, kind="released", detail=detail))
        adaptive.adopted = True
        return
    if adaptive.released:
        adaptive.released = False
        state.record(
            FlowEvent(at=now, kind="adapted", detail="the hand rate was lifted", rate=result.rate)
        )
    if result.held or result.rate is None:
        adaptive.adopted = True
        return  # paused meanwhile: nothing changed, the next interval tries again
    if not adaptive.adopted:
        adaptive.adopted = True
        adaptive.rate = min(max(result.rate, adaptive.floor), adaptive.ceiling)
        adaptive.told = adaptive.rate
        adaptive.adjusted_at = now
        return
    adaptive.changed(RatePoint(at=now, rate=result.rate, reason=change.detail))
    told = adaptive.told
    if told is None or abs(result.rate - told) >= told * TOLD_CHANGE:
        adaptive.told = result.rate
        state.record(
            FlowEvent(
                at=now,
                kind="adapted",
                detail=f"submits at {result.rate:g}/s: {change.detail}",
                rate=result.rate,
            )
        )


@dataclass(frozen=True)
class AdaptiveQueue:
    """What a worker process knows of an adaptive destination."""

    destination: str
    task_queue: str
    configured_rate: float
    floor: float
    ceiling: float
    latency_target_s: float
    interval_s: float


def adaptive_queues(destinations: Sequence[Destination]) -> dict[str, AdaptiveQueue]:
    """Each adaptive destination's submit queue as this rule sees it, by destination name."""
    queues = {}
    for d in destinations:
        if not d.flow.adaptive:
            continue
        floor, ceiling = d.flow.adaptive_bounds(d.submit_rate)
        queues[d.name] = AdaptiveQueue(
            destination=d.name,
            task_queue=d.submit_task_queue,
            configured_rate=d.submit_queue_rate,
            floor=floor,
            ceiling=ceiling,
            latency_target_s=d.flow.adaptive_latency_target_s,
            interval_s=d.flow.adaptive_interval_s,
        )
    return queues


@dataclass
class _Window:
    started: float
    ok: int = 0
    slow: int = 0
    congested: int = 0


class AdaptiveMeter:
    """The submit activity's side of the rule, one per worker process: counts each submit's
    outcome and, once an interval has passed, hands over the report for the flow."""

    def __init__(
        self, queues: Mapping[str, AdaptiveQueue], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._queues = dict(queues)
        self._clock = clock
        self._windows: dict[str, _Window] = {}
        # When each destination's last report was handed over (the clock's time).
        self._told: dict[str, float] = {}

    def queue(self, destination: str) -> AdaptiveQueue | None:
        return self._queues.get(destination)

    def observe(
        self, destination: str, latency_s: float, *, failed: bool, status: int | None
    ) -> SubmitOutcomes | None:
        """Count one submit (`failed`: it failed transiently, with the provider's `status` if it
        answered; a permanent failure is not counted); returns the interval's report when the
        interval is over."""
        queue = self._queues.get(destination)
        if queue is None:
            return None
        now = self._clock()
        window = self._windows.setdefault(destination, _Window(started=now))
        if failed and (status is None or status in CONGESTED_STATUSES):
            window.congested += 1
        elif failed:
            pass  # the request's own fault (a 4xx) or the breaker's kind (a 500): not load
        elif latency_s > queue.latency_target_s:
            window.slow += 1
        else:
            window.ok += 1
        # Congestion is told at once (at most once an interval): the submits that met it
        # may be the last for a while (a throttle's pause).
        over = now - window.started >= queue.interval_s
        urgent = (
            window.congested > 0 and now - self._told.get(destination, -1e18) >= queue.interval_s
        )
        if not (over or urgent):
            return None
        self._told[destination] = now
        del self._windows[destination]
        if window.ok + window.slow + window.congested == 0:
            return None
        return SubmitOutcomes(
            destination=destination,
            task_queue=queue.task_queue,
            ok=window.ok,
            slow=window.slow,
            congested=window.congested,
            seen_at=datetime.now(UTC),
            configured_rate=queue.configured_rate,
            floor=queue.floor,
            ceiling=queue.ceiling,
            latency_target_s=queue.latency_target_s,
            interval_s=queue.interval_s,
        )
