"""Endpoint disable's state machine (what the flow workflow runs beside the breaker's) and the
gate's count of since when a process has seen only failures (`flowcontrol/disable.py`)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from durable_outbox_temporal.contract.flow import FlowState, ProbeResult, RateApplied

from flowcontrol import breaker, disable
from flowcontrol.breaker import BreakerGate
from tests.flowcontrol.test_breaker import Clock, failing, queue
from tests.flowcontrol.test_throttle import T0, state

DAY = timedelta(days=1)
THREE_DAYS = 3 * 86_400.0


def report(since: datetime, at: datetime, failing_since: datetime | None = None) -> object:
    return replace(
        failing(since, at), failing_since=failing_since or since, disable_after_s=THREE_DAYS
    )


def open_at(flow: FlowState, at: datetime, failing_since: datetime | None = None) -> None:
    change = breaker.on_failing(flow, report(at, at, failing_since), at)  # type: ignore[arg-type]
    assert change is not None and change.kind == "open"
    breaker.opened(flow, change, RateApplied(rate=0.0), at)


def close_at(flow: FlowState, at: datetime) -> None:
    breaker.on_probe(flow, ProbeResult(ok=True, detail="HTTP 200"), at)
    breaker.closed(flow, RateApplied(rate=None), at)


def test_a_circuit_open_for_the_whole_time_is_disabled_then() -> None:
    flow = state()
    open_at(flow, T0)
    assert disable.due(flow) == T0 + timedelta(seconds=THREE_DAYS)
    # The due time is the earliest of the flow's: probes come first.
    assert breaker.due(flow) is not None and breaker.due(flow) < disable.due(flow)  # type: ignore[operator]

    now = T0 + 3 * DAY
    change = disable.change(flow, now)
    assert change.kind == "disable" and change.since == now
    assert change.detail == "failing for 3.0 days; last: " + str(flow.last_error)
    disable.disabled(flow, change, RateApplied(rate=0.0), now)
    assert flow.circuit == "closed" and flow.disabled_at == now
    assert flow.failing_since is None and breaker.due(flow) is None and disable.due(flow) is None
    assert flow.events[-1].kind == "disabled" and flow.events[-1].rate == 0.0


def test_submits_failing_between_probes_keep_the_count_across_closes() -> None:
    """A receiver whose HEAD answers while its POST fails: the circuit closes on each probe and
    opens again at the next submits; the count goes on from the first failure."""
    flow = state()
    open_at(flow, T0)
    for day in (1, 2):
        close_at(flow, T0 + day * DAY)
        # This process saw no success since before the first open.
        open_at(flow, T0 + day * DAY + timedelta(seconds=5), failing_since=T0)
        assert flow.failing_since == T0
    assert disable.due(flow) == T0 + 3 * DAY


def test_a_submit_that_succeeded_since_the_close_starts_the_count_again() -> None:
    flow = state()
    open_at(flow, T0)
    close_at(flow, T0 + DAY)
    later = T0 + DAY + timedelta(minutes=1)
    open_at(flow, later + timedelta(seconds=30), failing_since=later)
    assert flow.failing_since == later
    assert disable.due(flow) == later + 3 * DAY


def test_a_closed_circuit_is_never_due_and_a_rule_turned_off_never_disables() -> None:
    flow = state()
    open_at(flow, T0)
    close_at(flow, T0 + timedelta(minutes=1))
    assert disable.due(flow) is None
    off = state()
    change = breaker.on_failing(off, failing(T0, T0), T0)  # disable_after_s None: the rule off
    assert change is not None
    breaker.opened(off, change, RateApplied(rate=0.0), T0)
    assert off.failing_since == T0 and disable.due(off) is None


def test_a_stale_report_moves_nothing() -> None:
    flow = state()
    open_at(flow, T0)
    close_at(flow, T0 + DAY)
    # Failures from before the close, counted late: neither opens nor restarts the count.
    stale = report(T0 + DAY - timedelta(seconds=5), T0 + DAY, T0 + DAY - timedelta(seconds=1))
    assert breaker.on_failing(flow, stale, T0 + DAY) is None  # type: ignore[arg-type]
    assert flow.failing_since == T0


def test_a_queue_paused_by_hand_meanwhile_is_left_to_the_operator() -> None:
    flow = state()
    open_at(flow, T0)
    now = T0 + 3 * DAY
    disable.disabled(flow, disable.change(flow, now), RateApplied(released=True), now)
    assert flow.disabled_at is None and flow.circuit == "closed"
    assert flow.events[-1].kind == "released" and "paused by hand" in flow.events[-1].detail


def test_the_count_after_a_disable_starts_from_the_next_report() -> None:
    flow = state()
    open_at(flow, T0)
    now = T0 + 3 * DAY
    disable.disabled(flow, disable.change(flow, now), RateApplied(rate=0.0), now)
    # Re-enabled, still failing: the process's own count goes back to T0, the flow's does not.
    again = now + DAY
    open_at(flow, again, failing_since=T0)
    assert flow.failing_since == again


def test_the_gate_says_since_when_a_process_has_seen_only_failures() -> None:
    clock = Clock()
    gate = BreakerGate({"hook": queue(min_failures=1, disable_after_s=THREE_DAYS)}, clock)
    first = gate.failed("hook", "HTTP 500")
    assert first is not None and first.failing_since == T0
    assert first.disable_after_s == THREE_DAYS
    clock.now += 3600  # past the window: the first failure is forgotten there, not here
    later = gate.failed("hook", "HTTP 500")
    assert later is not None and later.failing_since == T0
    assert later.since == datetime.fromtimestamp(clock.now, UTC)
    gate.succeeded("hook")
    clock.now += 10
    after = gate.failed("hook", "HTTP 500")
    assert after is not None and after.failing_since == datetime.fromtimestamp(clock.now, UTC)


def test_a_destination_with_the_rule_off_reports_no_disable_time() -> None:
    policy_off = BreakerGate({"hook": queue(min_failures=1)}, Clock())
    seen = policy_off.failed("hook", "HTTP 500")
    assert seen is not None and seen.disable_after_s is None
