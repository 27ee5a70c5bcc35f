"""The circuit breaker's state machine (what the flow workflow runs) and its per-process gate."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from durable_outbox_temporal.contract.flow import (
    BreakerSettings,
    Failing,
    FlowState,
    ProbeResult,
    RateApplied,
    Throttled,
)

from flowcontrol import breaker, throttle
from flowcontrol.breaker import BreakerGate, BreakerQueue, is_failure
from tests.flowcontrol.test_throttle import T0, state


def failing(since: datetime, at: datetime, close_after: int = 2) -> Failing:
    return Failing(
        destination="hook",
        task_queue="outbox-submit-hook",
        poll_task_queue="outbox-poll-hook",
        failures=10,
        submits=12,
        window_s=30.0,
        since=since,
        seen_at=at,
        last_error="HTTP 502",
        configured_rate=8.0,
        probe_interval_s=15.0,
        close_after=close_after,
    )


def open_circuit(flow: FlowState, now: datetime) -> None:
    change = breaker.on_failing(flow, failing(now - timedelta(seconds=5), now), now)
    assert change is not None and change.kind == "open"
    assert "10 of 12 submits to hook failed within 30 s; last: HTTP 502" in change.detail
    breaker.opened(flow, change, RateApplied(rate=0.0), now)


def test_failing_opens_the_circuit_probes_at_intervals_and_closes_after_probes_succeed() -> None:
    flow = state()
    open_circuit(flow, T0)
    assert flow.circuit == "open" and flow.opened_at == T0
    assert breaker.due(flow) == T0 + timedelta(seconds=15)
    # Open already: more reports change nothing.
    assert breaker.on_failing(flow, failing(T0, T0), T0) is None

    now = T0 + timedelta(seconds=15)
    assert breaker.on_probe(flow, ProbeResult(ok=False, detail="HTTP 503"), now) is None
    assert flow.probes_failed == 1 and flow.last_error == "HTTP 503"
    assert breaker.due(flow) == now + timedelta(seconds=15)

    now += timedelta(seconds=15)
    assert breaker.on_probe(flow, ProbeResult(ok=True, detail="HTTP 200"), now) is None
    now += timedelta(seconds=15)
    # A failure between successes starts the count again.
    assert breaker.on_probe(flow, ProbeResult(ok=False, detail="timed out"), now) is None
    now += timedelta(seconds=15)
    assert breaker.on_probe(flow, ProbeResult(ok=True, detail="HTTP 200"), now) is None
    now += timedelta(seconds=15)
    close = breaker.on_probe(flow, ProbeResult(ok=True, detail="HTTP 200"), now)
    assert close is not None and close.kind == "close"
    breaker.closed(flow, RateApplied(rate=None), now)
    assert flow.circuit == "closed" and breaker.due(flow) is None and flow.closed_at == now
    assert [e.kind for e in flow.events] == [
        "opened",
        "probe_failed",
        "probe_failed",
        "closed",
    ]
    assert flow.events[-1].detail == "probes succeeded: submits at its configured rate"


def test_settings_changed_at_run_time_apply_to_the_open_circuit() -> None:
    flow = state()
    closed_now = BreakerSettings(enabled=True, probe_interval_s=2.0, close_after=3)
    # Closed: the settings are kept for the next opening, nothing else happens.
    assert breaker.on_settings(flow, closed_now, T0) is None
    assert (flow.probe_interval_s, flow.close_after) == (2.0, 3)
    open_circuit(flow, T0)
    assert breaker.due(flow) == T0 + timedelta(seconds=15)  # the report's interval
    # A shorter interval brings the next probe forward; a longer one leaves it.
    now = T0 + timedelta(seconds=1)
    sooner = BreakerSettings(enabled=True, probe_interval_s=3.0, close_after=1)
    assert breaker.on_settings(flow, sooner, now) is None
    assert breaker.due(flow) == now + timedelta(seconds=3) and flow.close_after == 1
    later = BreakerSettings(enabled=True, probe_interval_s=60.0, close_after=1)
    assert breaker.on_settings(flow, later, now) is None
    assert breaker.due(flow) == now + timedelta(seconds=3)
    # Off: the change that closes it, recorded as the operator's.
    off = BreakerSettings(enabled=False, probe_interval_s=60.0, close_after=1)
    close = breaker.on_settings(flow, off, now)
    assert close is not None and close.kind == "close"
    breaker.closed(flow, RateApplied(rate=None), now, "breaker turned off")
    assert flow.circuit == "closed" and breaker.due(flow) is None
    assert flow.events[-1].detail == "breaker turned off: submits at its configured rate"


def test_a_report_counting_failures_from_before_the_close_is_stale() -> None:
    flow = state()
    open_circuit(flow, T0)
    closed_at = T0 + timedelta(seconds=40)
    breaker.closed(flow, RateApplied(rate=None), closed_at)
    stale = failing(closed_at - timedelta(seconds=1), closed_at + timedelta(seconds=1))
    assert breaker.on_failing(flow, stale, closed_at + timedelta(seconds=1)) is None
    fresh = failing(closed_at + timedelta(seconds=1), closed_at + timedelta(seconds=9))
    assert breaker.on_failing(flow, fresh, closed_at + timedelta(seconds=9)) is not None


def test_an_open_circuit_stands_in_for_a_throttle_and_ends_its_ramp() -> None:
    flow = state()
    throttle.on_throttled(
        flow,
        Throttled("hook", "outbox-submit-hook", T0 + timedelta(seconds=4), T0, 429, 8.0),
        T0,
    )
    assert throttle.due(flow) == T0 + timedelta(seconds=4)
    open_circuit(flow, T0 + timedelta(seconds=1))
    assert flow.paused_until is None and throttle.due(flow) is None
    # A throttle met while the circuit is open (a submit dispatched before it) is its pause's.
    later = T0 + timedelta(seconds=2)
    throttle.on_throttled(
        flow,
        Throttled("hook", "outbox-submit-hook", later + timedelta(seconds=60), later, 429, 8.0),
        later,
    )
    assert flow.paused_until is None and flow.storms == 1


def test_a_pause_by_hand_is_kept_when_the_circuit_opens_and_closes() -> None:
    flow = state()
    change = breaker.on_failing(flow, failing(T0, T0), T0)
    assert change is not None
    breaker.opened(flow, change, RateApplied(released=True), T0)
    assert flow.circuit == "open"
    assert flow.events[-1].detail.endswith("(paused by hand already)")
    breaker.closed(flow, RateApplied(released=True), T0 + timedelta(seconds=30))
    assert "paused or set by hand" in flow.events[-1].detail


def queue(**overrides: object) -> BreakerQueue:
    fields: dict[str, object] = {
        "destination": "hook",
        "task_queue": "outbox-submit-hook",
        "poll_task_queue": "outbox-poll-hook",
        "configured_rate": 8.0,
        "enabled": True,
        "window_s": 10.0,
        "min_failures": 3,
        "failure_ratio": 0.5,
        "probe_interval_s": 15.0,
        "close_after": 1,
    }
    fields.update(overrides)
    return BreakerQueue(**fields)  # type: ignore[arg-type]


class Clock:
    def __init__(self) -> None:
        self.now = T0.timestamp()

    def __call__(self) -> float:
        return self.now


def test_the_gate_reports_once_failures_cross_both_the_count_and_the_ratio() -> None:
    clock = Clock()
    gate = BreakerGate({"hook": queue()}, clock)
    for _ in range(4):
        gate.succeeded("hook")
    assert gate.failed("hook", "HTTP 500") is None
    assert gate.failed("hook", "HTTP 500") is None
    # Three failures of seven: the count is met, the ratio (0.5) is not.
    assert gate.failed("hook", "HTTP 500") is None
    report = gate.failed("hook", "HTTP 502")
    assert report is not None
    assert (report.failures, report.submits, report.last_error) == (4, 8, "HTTP 502")
    assert report.since == T0 and report.poll_task_queue == "outbox-poll-hook"
    # Failures go on: at most one report a second.
    assert gate.failed("hook", "HTTP 500") is None
    clock.now += breaker.REPORT_EVERY_S
    assert gate.failed("hook", "HTTP 500") is not None


def test_the_gate_forgets_outcomes_older_than_its_window() -> None:
    clock = Clock()
    gate = BreakerGate({"hook": queue()}, clock)
    gate.failed("hook", "HTTP 500")
    gate.failed("hook", "HTTP 500")
    clock.now += 11  # the window is 10 s: those two are gone
    assert gate.failed("hook", "HTTP 500") is None
    assert gate.failed("hook", "HTTP 500") is None
    report = gate.failed("hook", "HTTP 500")
    assert report is not None and report.failures == 3
    assert report.since == datetime.fromtimestamp(clock.now, UTC)


def test_a_report_not_sent_is_tried_again_at_the_next_failure() -> None:
    gate = BreakerGate({"hook": queue(min_failures=1)}, Clock())
    assert gate.failed("hook", "HTTP 500") is not None
    gate.not_reported("hook")
    assert gate.failed("hook", "HTTP 500") is not None


def test_a_server_that_cannot_pause_queues_stops_the_counting() -> None:
    gate = BreakerGate({"hook": queue(min_failures=1)}, Clock())
    gate.unsupported("hook")
    assert all(gate.failed("hook", "HTTP 500") is None for _ in range(5))


def test_a_destination_with_the_breaker_off_is_never_reported() -> None:
    gate = BreakerGate({"hook": queue(enabled=False, min_failures=1)}, Clock())
    assert all(gate.failed("hook", "HTTP 500") is None for _ in range(20))


@pytest.mark.parametrize(
    ("status", "retry_after", "counts"),
    [
        (500, None, True),
        (502, None, True),
        (503, None, True),
        (503, 4.0, False),  # a throttle: the throttle rule's
        (429, None, False),
        (408, None, False),
        (None, None, True),  # a timeout or a connection error
    ],
)
def test_what_counts_as_a_failure(
    status: int | None, retry_after: float | None, counts: bool
) -> None:
    assert is_failure(status, retry_after) is counts
