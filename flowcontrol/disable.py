"""Rule: a destination that has failed for `disable_after_s` (3 days) is disabled until an
operator re-enables it.

It builds on the circuit breaker (`flowcontrol.breaker`): each process's failing report says
since when that process has seen only failures (`Failing.failing_since`), and the destination's
flow workflow keeps since when the destination as a whole has (`FlowState.failing_since`). That
time survives the circuit closing and opening again (a receiver whose `HEAD` answers while its
`POST` fails closes the circuit on every probe, and its submits open it again), and moves on only
when a report shows a submit that succeeded since the circuit last closed. So "failing for 3
days" covers both a circuit open all along and submits that all failed between its probes.

Once the circuit is open past that time, the flow **disables** the destination: its submit queue
stays paused on the Temporal server with a reason of its own (`queue_rates.DISABLED_PREFIX`), as
a pause by hand does: no probe and no automatic rule lifts it. Items wait; none fails for it and
none is lost. The flow records a `disabled` event (sent to `events_destination`), the API shows
`disabled`, `/metrics` exports `outbox_destination_disabled` and an alert fires. `PATCH
/v1/destinations/{name}` with `{"enabled": true}` resumes the queue at the rate it had
(`service.destinations`), and the count starts again from the next failure.

How exact: as the breaker's counts (per process, reported at most once a second while failing);
a flow that ends (idle five minutes with its circuit closed) forgets the time, so a destination
that fails only now and then is never disabled. With `breaker = false` nothing is disabled.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from durable_outbox_temporal.contract.flow import (
    Failing,
    FlowEvent,
    FlowState,
    RateApplied,
    RateChange,
)

# Circuit states (`flowcontrol.breaker`, which imports this module).
_OPEN = "open"
_CLOSED = "closed"


def on_failing(state: FlowState, seen: Failing) -> None:
    """A process's (fresh) failing report: since when the destination has failed."""
    state.disable_after_s = seen.disable_after_s
    if state.failing_since is None:
        # A flow counts from the failures it is told of: a process's own count may be older
        # than an operator's re-enable, or the flow's last end.
        state.failing_since = seen.since
        return
    failing_since = seen.failing_since or seen.since
    if state.closed_at is not None and failing_since > state.closed_at:
        # This process has seen a submit succeed since the circuit last closed.
        state.failing_since = failing_since


def due(state: FlowState) -> datetime | None:
    """When the destination is to be disabled, while its circuit is open (None: not to be)."""
    if state.circuit != _OPEN or state.disable_after_s is None or state.failing_since is None:
        return None
    return state.failing_since + timedelta(seconds=state.disable_after_s)


def change(state: FlowState, now: datetime) -> RateChange:
    """The change that disables the destination's submit queue."""
    assert state.failing_since is not None
    failing_for = now - state.failing_since
    return RateChange(
        task_queue=state.task_queue,
        kind="disable",
        factor=1.0,
        configured_rate=state.configured_rate,
        detail=f"failing for {_days(failing_for)}; last: {state.last_error}",
        since=now,
    )


def disabled(state: FlowState, applied: RateChange, result: RateApplied, now: datetime) -> None:
    """The destination is disabled (or was paused by hand meanwhile: the operator has it).
    Either way the circuit stops probing, and a later failure counts afresh."""
    state.circuit = _CLOSED
    state.closed_at = now
    state.next_probe_at = None
    state.probes_ok = 0
    state.failing_since = None
    if result.released:
        detail = f"{applied.detail}; not disabled: the submit queue was paused by hand meanwhile"
        state.record(FlowEvent(at=now, kind="released", detail=detail, rate=0.0))
        return
    state.disabled_at = now
    state.record(FlowEvent(at=now, kind="disabled", detail=applied.detail, rate=0.0))


def _days(span: timedelta) -> str:
    """A span as people read it: `3.0 days`, `5.2 hours`, `90 s`."""
    seconds = span.total_seconds()
    if seconds >= 86_400:
        return f"{seconds / 86_400:.1f} days"
    if seconds >= 3_600:
        return f"{seconds / 3_600:.1f} hours"
    return f"{seconds:.0f} s"
