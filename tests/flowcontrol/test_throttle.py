"""The throttle rule's state machine (what the flow workflow runs) and its per-process gate."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from durable_outbox_temporal.contract.flow import FlowState, RateApplied, Throttled

from flowcontrol import throttle
from flowcontrol.throttle import ThrottledQueue, ThrottleGate

T0 = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)


def state() -> FlowState:
    return FlowState(
        destination="hook",
        task_queue="outbox-submit-hook",
        configured_rate=8.0,
        ramp_step_s=10.0,
        storm_window_s=30.0,
    )


def seen(until: datetime, at: datetime) -> Throttled:
    return Throttled(
        destination="hook",
        task_queue="outbox-submit-hook",
        until=until,
        seen_at=at,
        status=429,
        configured_rate=8.0,
    )


def resume(flow: FlowState, now: datetime, rate: float | None) -> None:
    change = throttle.next_change(flow, now)
    assert change is not None and change.kind == "resume"
    throttle.applied(flow, change, RateApplied(rate=rate), now)


def test_a_throttle_pauses_until_its_retry_after_and_resumes_whole() -> None:
    flow = state()
    throttle.on_throttled(flow, seen(T0 + timedelta(seconds=4), T0), T0)
    # Later throttles of the same storm extend the pause, never shorten it.
    throttle.on_throttled(flow, seen(T0 + timedelta(seconds=2), T0), T0)
    throttle.on_throttled(flow, seen(T0 + timedelta(seconds=5), T0), T0)
    assert flow.storms == 1 and flow.paused_until == T0 + timedelta(seconds=5)
    assert throttle.due(flow) == T0 + timedelta(seconds=5)
    assert throttle.next_change(flow, T0 + timedelta(seconds=4)) is None

    change = throttle.next_change(flow, T0 + timedelta(seconds=5))
    assert change is not None and change.kind == "resume" and change.factor == 1.0
    throttle.applied(flow, change, RateApplied(rate=None), T0 + timedelta(seconds=5))
    assert flow.paused_until is None and flow.factor == 1.0
    assert throttle.due(flow) is None  # idle: nothing to do until another throttle
    assert [event.kind for event in flow.events] == ["throttled", "recovered"]


def test_a_storm_that_comes_back_halves_the_rate_then_it_recovers_stepwise() -> None:
    flow = state()
    now = T0
    for expected in (1.0, 0.5, 0.25):
        throttle.on_throttled(flow, seen(now + timedelta(seconds=4), now), now)
        assert flow.factor == expected
        now += timedelta(seconds=4)
        resume(flow, now, None if expected == 1 else 8.0 * expected)
        now += timedelta(seconds=1)  # the storm comes back a second after each resume
    assert flow.storms == 3 and flow.rate == 2.0
    # A step without a throttle doubles the rate, until it is whole again.
    factors = []
    while throttle.due(flow) is not None:
        now = throttle.due(flow) or now
        change = throttle.next_change(flow, now)
        assert change is not None and change.kind == "ramp" and change.expected == flow.rate
        rate = None if change.factor == 1 else 8.0 * change.factor
        throttle.applied(flow, change, RateApplied(rate=rate), now)
        factors.append(flow.factor)
    assert factors == [0.5, 1.0] and flow.rate is None
    assert flow.events[-1].kind == "recovered"


def test_a_storm_long_after_a_resume_is_a_new_one_at_the_whole_rate() -> None:
    flow = state()
    throttle.on_throttled(flow, seen(T0 + timedelta(seconds=4), T0), T0)
    resume(flow, T0 + timedelta(seconds=4), None)
    later = T0 + timedelta(minutes=5)
    throttle.on_throttled(flow, seen(later + timedelta(seconds=4), later), later)
    assert flow.factor == 1.0 and flow.storms == 2


def test_a_rate_set_by_hand_releases_the_flow() -> None:
    flow = state()
    throttle.on_throttled(flow, seen(T0 + timedelta(seconds=4), T0), T0)
    resume(flow, T0 + timedelta(seconds=4), None)
    throttle.on_throttled(flow, seen(T0 + timedelta(seconds=9), T0 + timedelta(seconds=5)), T0)
    change = throttle.next_change(flow, T0 + timedelta(seconds=9))
    assert change is not None
    throttle.applied(flow, change, RateApplied(released=True), T0 + timedelta(seconds=9))
    assert flow.factor == 1.0 and flow.paused_until is None and throttle.due(flow) is None
    assert flow.events[-1].kind == "released"


def test_a_resume_that_finds_a_longer_pause_waits_for_it() -> None:
    flow = state()
    throttle.on_throttled(flow, seen(T0 + timedelta(seconds=4), T0), T0)
    change = throttle.next_change(flow, T0 + timedelta(seconds=4))
    assert change is not None
    longer = T0 + timedelta(seconds=7)
    throttle.applied(flow, change, RateApplied(paused_until=longer), T0 + timedelta(seconds=4))
    assert flow.paused_until == longer and throttle.due(flow) == longer


def gate(pause: bool = True, clock: list[float] | None = None) -> ThrottleGate:
    ticks = clock if clock is not None else [1000.0]
    queue = ThrottledQueue("hook", "outbox-submit-hook", 8.0, pause, 300.0, 10.0, 30.0)
    return ThrottleGate({"hook": queue}, clock=lambda: ticks[0])


def test_the_gate_pauses_once_per_longer_throttle_and_only_for_throttles() -> None:
    ticks = [1000.0]
    g = gate(clock=ticks)
    found = g.throttled("hook", 429, 4.0)
    assert found is not None and found[1] == datetime.fromtimestamp(1004.0, UTC)
    # The same throttle seen by another submit of this process: already paused that long.
    assert g.throttled("hook", 429, 4.0) is None
    assert g.throttled("hook", 503, 6.0) is not None  # longer: paused again, longer
    assert g.throttled("hook", 500, 60.0) is None  # not a throttle
    assert g.throttled("hook", 429, None) is None  # no Retry-After: the item's own backoff
    assert g.throttled("elsewhere", 429, 4.0) is None
    assert gate(pause=False).throttled("hook", 429, 4.0) is None
    # An absurd Retry-After pauses for the destination's longest pause at most.
    capped = gate().throttled("hook", 429, 3e11)
    assert capped is not None and capped[1] == datetime.fromtimestamp(1300.0, UTC)
    # A pause the server refused is asked for again by the next throttle.
    g.not_paused("outbox-submit-hook")
    assert g.throttled("hook", 429, 4.0) is not None


async def test_the_gate_holds_this_process_until_the_pause_ends() -> None:
    ticks = [1000.0]
    g = gate(clock=ticks)
    found = g.throttled("hook", 429, 0.2)
    assert found is not None
    # Asked for, not yet paused by the server: nothing is held.
    began = datetime.now(UTC)
    await g.hold("outbox-submit-hook")
    assert datetime.now(UTC) - began < timedelta(seconds=0.1)
    g.paused(found[0].task_queue, found[1])
    loop_start = datetime.now(UTC)
    ticks[0] = 1000.0  # the hold sleeps for what is left of the pause
    await g.hold("outbox-submit-hook")
    assert datetime.now(UTC) - loop_start >= timedelta(seconds=0.19)
    await g.hold("another-queue")  # nothing held there
