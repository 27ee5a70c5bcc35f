"""The adaptive rate's state machine (what the flow workflow runs), its per-process meter, and
the settings it refuses (`flowcontrol/adaptive.py`)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from durable_outbox_temporal.contract.flow import (
    FlowState,
    RateApplied,
    RateChange,
    SubmitOutcomes,
    Throttled,
)
from durable_outbox_temporal.contract.flow_policy import FlowPolicy
from durable_outbox_temporal.destinations import Destination
from pydantic import ValidationError

from flowcontrol import adaptive, throttle
from flowcontrol.adaptive import AdaptiveMeter, AdaptiveQueue
from flowcontrol.throttle import ThrottledQueue, ThrottleGate
from tests.conftest import WEBHOOK_SECRET, make_destination

T0 = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)


def state() -> FlowState:
    return FlowState(
        destination="hook",
        task_queue="outbox-submit-hook",
        configured_rate=50.0,
        ramp_step_s=2.0,
        storm_window_s=30.0,
    )


def outcomes(ok: int = 0, slow: int = 0, congested: int = 0) -> SubmitOutcomes:
    return SubmitOutcomes(
        destination="hook",
        task_queue="outbox-submit-hook",
        ok=ok,
        slow=slow,
        congested=congested,
        seen_at=T0,
        configured_rate=50.0,
        floor=5.0,
        ceiling=55.0,
        latency_target_s=1.0,
        interval_s=2.0,
    )


def move(flow: FlowState, now: datetime, applied: RateApplied | None = None) -> RateChange:
    """The move due at `now`, applied as the activity would (the rate set as asked)."""
    change = adaptive.next_change(flow, now)
    assert change is not None and change.kind == "adapt"
    adaptive.applied(flow, change, applied or RateApplied(rate=change.rate), now)
    return change


def adopted(rate: float = 50.0) -> FlowState:
    flow = state()
    adaptive.on_outcomes(flow, outcomes(ok=3), T0)
    change = move(flow, T0, RateApplied(rate=rate))
    assert change.rate is None  # the first move only reads the rate in force
    return flow


def test_a_first_report_starts_from_the_configured_rate_and_adopts_the_one_in_force() -> None:
    flow = state()
    assert adaptive.due(flow) is None
    adaptive.on_outcomes(flow, outcomes(ok=3), T0)
    assert flow.adaptive is not None and flow.adaptive.rate == 50.0
    assert adaptive.due(flow) == T0
    # An earlier run of the flow left 12/s on the queue: that is where it goes on from.
    move(flow, T0, RateApplied(rate=12.0))
    assert flow.adaptive.rate == 12.0 and flow.adaptive.adopted
    # The reports of that interval still count: the next move is an interval later.
    assert adaptive.due(flow) == T0 + timedelta(seconds=2)


def test_good_intervals_add_a_fiftieth_of_the_span_up_to_the_ceiling() -> None:
    flow = adopted(50.0)
    now = T0
    for expected in (51.0, 52.0, 53.0, 54.0, 55.0):
        now += timedelta(seconds=2)
        adaptive.on_outcomes(flow, outcomes(ok=10), now)
        assert move(flow, now).rate == pytest.approx(expected)
    # At the ceiling: no call at all.
    now += timedelta(seconds=2)
    adaptive.on_outcomes(flow, outcomes(ok=10), now)
    assert adaptive.next_change(flow, now) is None
    assert flow.adaptive is not None and flow.adaptive.rate == 55.0


def first_fall(ok: int, congested: int) -> tuple[FlowState, datetime, float | None]:
    """A flow adopted at 50/s whose first interval (2 s, with the adopting interval's 3 submits
    taken) met congestion: the flow, the time, and the rate it fell to."""
    flow = adopted(50.0)
    now = T0 + timedelta(seconds=2)
    adaptive.on_outcomes(flow, outcomes(ok=ok, congested=congested), now)
    return flow, now, move(flow, now).rate


def test_congestion_brings_the_rate_under_what_the_provider_took_once_an_episode() -> None:
    # The provider took 93 submits in 2 s, one refused: 0.9 of 46.5 a second.
    flow, now, fell_to = first_fall(ok=90, congested=1)
    assert fell_to == pytest.approx(41.85)
    # Congestion within two intervals of that fall is its lag: nothing moves.
    now += timedelta(seconds=2)
    adaptive.on_outcomes(flow, outcomes(ok=70, congested=12), now)
    assert adaptive.next_change(flow, now) is None
    # Taking few after it (little traffic, or a provider down): 30 % off, no more, per move.
    now += timedelta(seconds=2)
    adaptive.on_outcomes(flow, outcomes(ok=2, slow=1), now)
    assert move(flow, now).rate == pytest.approx(29.29)
    for _ in range(20):
        now += timedelta(seconds=2)
        adaptive.on_outcomes(flow, outcomes(congested=5), now)
        change = adaptive.next_change(flow, now)
        if change is None:
            break
        adaptive.applied(flow, change, RateApplied(rate=change.rate), now)
    # A provider that took nothing: each interval 30 % off, none held back, down to the floor.
    assert flow.adaptive is not None and flow.adaptive.rate == 5.0
    assert [p.rate for p in flow.adaptive.history][:3] == [
        pytest.approx(41.85),
        pytest.approx(29.29),
        pytest.approx(20.5),
    ]


def test_a_limit_far_below_the_rate_is_reached_in_one_move() -> None:
    # 96 sent in 2 s, 20 taken: the limit is 10 a second, and the rate goes under it at once.
    flow, _, fell_to = first_fall(ok=17, congested=76)
    assert fell_to == pytest.approx(9.0)
    assert flow.adaptive is not None and flow.adaptive.congested_at == pytest.approx(10.0)


def test_congestion_after_the_lag_of_a_fall_is_a_new_episode() -> None:
    flow, now, fell_to = first_fall(ok=78, congested=1)
    assert fell_to == pytest.approx(36.45)
    # A good interval in the lag steps up as any does.
    now += timedelta(seconds=2)
    adaptive.on_outcomes(flow, outcomes(ok=70), now)
    assert move(flow, now).rate == pytest.approx(36.65)
    # Two intervals after the fall: the provider's limit came down again.
    now += timedelta(seconds=2)
    adaptive.on_outcomes(flow, outcomes(ok=50, congested=20), now)
    assert move(flow, now).rate == pytest.approx(22.5)


def test_a_run_from_before_episodes_moves_as_it_did() -> None:
    flow = adopted(50.0)
    now = T0 + timedelta(seconds=2)
    adaptive.on_outcomes(flow, outcomes(ok=90, congested=1), now)
    change = adaptive.next_change(flow, now, episodes=False)
    assert change is not None and change.rate == pytest.approx(41.85)
    adaptive.applied(flow, change, RateApplied(rate=change.rate), now)
    assert flow.adaptive is not None and flow.adaptive.congested_at == 50.0
    assert flow.adaptive.decreased_at is None
    # No lag taken: the next congested interval moves again, busy by what was taken.
    now += timedelta(seconds=2)
    adaptive.on_outcomes(flow, outcomes(ok=17, congested=76), now)
    change = adaptive.next_change(flow, now, episodes=False)
    assert change is not None and change.rate == pytest.approx(29.29)


def test_steps_up_are_small_near_where_congestion_began_and_big_again_past_it() -> None:
    flow, now, fell_to = first_fall(ok=78, congested=1)
    assert fell_to == pytest.approx(36.45)  # 0.9 of 40.5 a second
    # Where congestion began: what the provider took.
    assert flow.adaptive is not None and flow.adaptive.congested_at == pytest.approx(40.5)
    flow.adaptive.rate = 30.0
    rates = []
    for _ in range(8):
        now += timedelta(seconds=2)
        adaptive.on_outcomes(flow, outcomes(ok=10), now)
        rates.append(move(flow, now).rate)
    # A fiftieth of the span (1/s) up to 85 % of 40.5, then a fifth of that.
    assert rates == pytest.approx([31.0, 32.0, 33.0, 34.0, 35.0, 35.2, 35.4, 35.6])
    # Past 125 % of where congestion began, with none since: the limit moved.
    flow.adaptive.congested_at, flow.adaptive.rate = 40.0, 50.2
    now += timedelta(seconds=2)
    adaptive.on_outcomes(flow, outcomes(ok=10), now)
    assert move(flow, now).rate == pytest.approx(51.2)
    assert flow.adaptive.congested_at is None


def test_nothing_reported_moves_nothing_and_a_report_before_the_interval_waits() -> None:
    flow = adopted(50.0)
    move(flow, T0 + timedelta(seconds=2))  # the adopting interval's reports
    assert adaptive.due(flow) is None  # no submits since: nothing learnt
    adaptive.on_outcomes(flow, outcomes(congested=2), T0 + timedelta(seconds=3))
    assert adaptive.next_change(flow, T0 + timedelta(seconds=3)) is None
    assert adaptive.next_change(flow, T0 + timedelta(seconds=4)) is not None


def test_only_a_move_of_a_third_is_an_event() -> None:
    flow = adopted(50.0)
    now = T0
    for _ in range(3):
        now += timedelta(seconds=2)
        adaptive.on_outcomes(flow, outcomes(congested=1), now)
        move(flow, now)
    # Nothing taken: 50 -> 35 -> 24.5 -> 17.15. 24.5 is the first a third below the 50 told;
    # 17.15 is not a third below 24.5.
    assert [event.kind for event in flow.events] == ["adapted"]
    assert flow.events[0].rate == pytest.approx(24.5)


def test_a_rate_set_by_hand_holds_until_it_is_lifted() -> None:
    flow = adopted(50.0)
    now = T0 + timedelta(seconds=2)
    adaptive.on_outcomes(flow, outcomes(ok=5), now)
    move(flow, now, RateApplied(released=True))
    assert flow.adaptive is not None and flow.adaptive.released
    assert [event.kind for event in flow.events] == ["released"]
    # Still released: asked again each interval with no rate of its own to expect.
    now += timedelta(seconds=2)
    adaptive.on_outcomes(flow, outcomes(ok=5), now)
    change = move(flow, now, RateApplied(released=True))
    assert change.expected is None
    assert [event.kind for event in flow.events] == ["released"]
    # The hand rate lifted: the adaptive rate goes on.
    now += timedelta(seconds=2)
    adaptive.on_outcomes(flow, outcomes(ok=5), now)
    move(flow, now)
    assert not flow.adaptive.released
    assert [event.kind for event in flow.events] == ["released", "adapted"]


def test_a_paused_queue_changes_nothing() -> None:
    flow = adopted(50.0)
    now = T0 + timedelta(seconds=2)
    adaptive.on_outcomes(flow, outcomes(congested=3), now)
    move(flow, now, RateApplied(held=True))
    assert flow.adaptive is not None and flow.adaptive.rate == 50.0
    assert flow.adaptive.history == []


def test_a_storm_that_comes_back_does_not_halve_an_adaptive_rate() -> None:
    flow = adopted(50.0)
    until = T0 + timedelta(seconds=1)
    seen = Throttled("hook", "outbox-submit-hook", until, T0, 429, 50.0)
    throttle.on_throttled(flow, seen, T0)
    flow.paused_until, flow.resumed_at = None, T0 + timedelta(seconds=1)
    later = T0 + timedelta(seconds=3)
    throttle.on_throttled(
        flow, Throttled("hook", "outbox-submit-hook", later, later, 429, 50), later
    )
    assert flow.factor == 1.0


def test_the_meter_counts_each_outcome_and_reports_once_an_interval() -> None:
    clock = [0.0]
    queue = AdaptiveQueue("hook", "outbox-submit-hook", 50.0, 5.0, 55.0, 1.0, 2.0)
    meter = AdaptiveMeter({"hook": queue}, clock=lambda: clock[0])
    assert meter.observe("other", 0.1, failed=False, status=None) is None
    assert meter.observe("hook", 0.1, failed=False, status=None) is None
    assert meter.observe("hook", 1.5, failed=False, status=None) is None
    assert meter.observe("hook", 0.1, failed=True, status=400) is None  # not load
    clock[0] = 1.0
    assert meter.observe("hook", 0.1, failed=True, status=500) is None  # the breaker's kind
    # The first congestion is told at once.
    told = meter.observe("hook", 0.1, failed=True, status=429)
    assert told is not None and (told.ok, told.slow, told.congested) == (1, 1, 1)
    assert (told.floor, told.ceiling, told.interval_s) == (5.0, 55.0, 2.0)
    # More within the interval wait for its end.
    clock[0] = 1.5
    assert meter.observe("hook", 0.1, failed=True, status=503) is None
    assert meter.observe("hook", 9.0, failed=True, status=None) is None  # a timeout
    assert meter.observe("hook", 0.1, failed=False, status=None) is None
    clock[0] = 3.5
    report = meter.observe("hook", 0.2, failed=False, status=None)
    assert report is not None and (report.ok, report.slow, report.congested) == (2, 0, 2)
    # A new interval starts with the next submit.
    assert meter.observe("hook", 0.1, failed=False, status=None) is None


def test_bad_adaptive_settings_are_refused_naming_the_fields() -> None:
    with pytest.raises(ValidationError, match="adaptive_floor .*adaptive_ceiling"):
        FlowPolicy(adaptive=True, adaptive_floor=20, adaptive_ceiling=10)
    with pytest.raises(ValidationError, match="adaptive_latency_target_s"):
        FlowPolicy(adaptive=True, adaptive_latency_target_s=0)
    with pytest.raises(ValidationError, match="adaptive_floor .*submit_rate"):
        webhook(submit_rate=5.0, flow={"adaptive": True, "adaptive_floor": 8})
    with pytest.raises(ValidationError, match="submit_batch or lane_run"):
        webhook(mode="bulk", submit_rate=10.0, submit_batch=2, flow={"adaptive": True})
    # Unset bounds: from a tenth of submit_rate up to it.
    destination = webhook(submit_rate=30.0, flow={"adaptive": True})
    assert destination.flow.adaptive_bounds(destination.submit_rate) == (3.0, 30.0)


def webhook(**overrides: object) -> Destination:
    settings = {"url": "http://127.0.0.1:9/webhook/hook", "secret": WEBHOOK_SECRET}
    return make_destination("webhook", settings, **overrides)


def test_a_short_retry_after_is_left_to_the_adaptive_rate_and_a_long_one_pauses() -> None:
    policy = FlowPolicy(adaptive=True, adaptive_interval_s=2.0)
    queue = ThrottledQueue.of("hook", "outbox-submit-hook", 50.0, policy)
    gate = ThrottleGate({"hook": queue}, clock=lambda: 1000.0)
    assert gate.throttled("hook", 429, 1.0) is None
    assert gate.throttled("hook", 429, 2.0) is None
    assert gate.throttled("hook", 429, 30.0) is not None
    plain = ThrottledQueue.of("hook", "outbox-submit-hook", 50.0, FlowPolicy())
    assert ThrottleGate({"hook": plain}).throttled("hook", 429, 1.0) is not None
