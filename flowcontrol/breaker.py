"""Rule: a destination whose submits keep failing stops being sent to until it answers again.

Each worker process counts its own submits' outcomes per destination over a sliding window
(`BreakerGate`). A failure is a 5xx, a timeout or a connection error (a throttle is the throttle
rule's, a 4xx is the item's own fault). When a process sees at least `breaker_min_failures`
failures and they are at least `breaker_failure_ratio` of its submits in the window, it tells the
destination's flow workflow (`durable_outbox_temporal.contract.flow`), which **opens** the circuit:
it pauses the submit queue on the Temporal server (as a pause by hand would, with a reason saying
why), so no worker dispatches another submit. Items wait; none fails for it, and no attempt is
counted.

While the circuit is open, the flow sends **one probe** every `breaker_probe_interval_s` (an
activity on the destination's poll queue, which the circuit leaves running: the provider's
`probe`, a request that delivers nothing). When `breaker_close_after` probes in a row succeed it
**closes**: the submit queue resumes at the rate it had. The next failures open it again.

How exact: each process decides on its own counts (a fleet of N processes opens when any one of
them crosses the threshold on its share of the traffic), and the circuit is one per destination,
held by one workflow; from the moment the server applies the pause, no worker dispatches a
submit. Submits dispatched before then still go. A pause by hand is never undone by the circuit.
Why probes rather than letting one real item through: docs/decisions/circuit-breaker.md.

Its settings may change at run time (`readmodel.flow_overrides`): each process counts under the
ones it read last, and the API signals the flow workflow (`on_settings`): a circuit open now
probes at the new interval and closes after the new count, and one whose breaker is turned off
closes at once.

The state machine (`on_failing`, `due`, `on_probe`, `opened`, `closed`) is pure: the flow
workflow runs it beside the throttle's. Each report also says since when its process has seen
only failures, which endpoint disable counts (`flowcontrol.disable`).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from durable_outbox_temporal.contract.flow import (
    BreakerSettings,
    Failing,
    FlowEvent,
    FlowState,
    ProbeResult,
    RateApplied,
    RateChange,
)
from durable_outbox_temporal.contract.flow_policy import FlowPolicy

from flowcontrol import disable

if TYPE_CHECKING:
    from durable_outbox_temporal.destinations import Destination

CLOSED = "closed"
OPEN = "open"
# A process reports a failing destination at most this often (seconds) while it keeps failing.
REPORT_EVERY_S = 1.0


def on_failing(state: FlowState, seen: Failing, now: datetime) -> RateChange | None:
    """A process's submits are failing: the change that opens the circuit, or None when it is
    open already or the report counts failures from before the circuit last closed."""
    state.configured_rate = seen.configured_rate
    state.poll_task_queue = seen.poll_task_queue
    state.probe_interval_s = seen.probe_interval_s
    state.close_after = seen.close_after
    if state.closed_at is not None and seen.since < state.closed_at:
        return None
    disable.on_failing(state, seen)
    if state.circuit == OPEN:
        return None
    detail = (
        f"{seen.failures} of {seen.submits} submits to {seen.destination} failed within"
        f" {seen.window_s:g} s; last: {seen.last_error}"
    )
    return RateChange(
        task_queue=state.task_queue,
        kind="open",
        factor=1.0,
        configured_rate=state.configured_rate,
        # Mid-ramp after a throttle, a close returns to the rate from before the storms.
        base_rate=state.base_rate if state.rate is not None else None,
        from_ramp=state.rate is not None,
        detail=detail,
        since=now,
    )


def opened(state: FlowState, change: RateChange, result: RateApplied, now: datetime) -> None:
    """The circuit is open (the queue paused for it, or paused by hand already)."""
    state.circuit = OPEN
    state.opened_at = now
    state.next_probe_at = now + timedelta(seconds=state.probe_interval_s)
    state.probes_ok = 0
    state.probes_failed = 0
    state.last_error = change.detail
    # The circuit's pause stands in for a throttle's, and its close ends any ramp.
    state.paused_until = None
    state.factor, state.rate, state.base_rate, state.ramped_at = 1.0, None, None, None
    shown = change.detail if not result.released else f"{change.detail} (paused by hand already)"
    state.record(FlowEvent(at=now, kind="opened", detail=shown, rate=0.0))


def due(state: FlowState) -> datetime | None:
    """When the circuit's next probe is due (None: closed)."""
    return state.next_probe_at if state.circuit == OPEN else None


def on_probe(state: FlowState, result: ProbeResult, now: datetime) -> RateChange | None:
    """A probe answered: the change that closes the circuit, once enough succeeded in a row."""
    if result.ok:
        state.probes_ok += 1
        if state.probes_ok >= state.close_after:
            return RateChange(
                task_queue=state.task_queue,
                kind="close",
                factor=1.0,
                configured_rate=state.configured_rate,
            )
    else:
        state.probes_ok = 0
        state.probes_failed += 1
        state.last_error = result.detail
        state.record(FlowEvent(at=now, kind="probe_failed", detail=result.detail, rate=0.0))
    state.next_probe_at = now + timedelta(seconds=state.probe_interval_s)
    return None


def on_settings(state: FlowState, settings: BreakerSettings, now: datetime) -> RateChange | None:
    """The breaker's settings changed at run time: the change that closes an open circuit if
    the breaker is now off; else the new interval and count apply to the circuit open now."""
    state.probe_interval_s = settings.probe_interval_s
    state.close_after = settings.close_after
    state.disable_after_s = settings.disable_after_s
    if state.circuit != OPEN:
        return None
    if not settings.enabled:
        return RateChange(
            task_queue=state.task_queue,
            kind="close",
            factor=1.0,
            configured_rate=state.configured_rate,
        )
    sooner = now + timedelta(seconds=settings.probe_interval_s)
    if state.next_probe_at is None or sooner < state.next_probe_at:
        state.next_probe_at = sooner
    return None


def closed(
    state: FlowState, result: RateApplied, now: datetime, why: str = "probes succeeded"
) -> None:
    """The circuit is closed: the queue resumed (or was someone else's to resume)."""
    state.circuit = CLOSED
    state.closed_at = now
    state.next_probe_at = None
    if result.released:
        detail = f"{why}; the submit queue was paused or set by hand meanwhile"
    else:
        shown = "its configured rate" if result.rate is None else f"{result.rate:g}/s"
        detail = f"{why}: submits at {shown}"
    state.record(FlowEvent(at=now, kind="closed", detail=detail, rate=result.rate))


@dataclass(frozen=True)
class BreakerQueue:
    """What a worker process knows of a destination for this rule."""

    destination: str
    task_queue: str
    poll_task_queue: str
    configured_rate: float
    enabled: bool
    window_s: float
    min_failures: int
    failure_ratio: float
    probe_interval_s: float
    close_after: int
    # How long the destination fails before it is disabled (None: never).
    disable_after_s: float | None = None

    @classmethod
    def of(
        cls,
        destination: str,
        task_queue: str,
        poll_task_queue: str,
        configured_rate: float,
        policy: FlowPolicy,
    ) -> BreakerQueue:
        """A destination's queues under `policy`'s breaker settings."""
        return cls(
            destination=destination,
            task_queue=task_queue,
            poll_task_queue=poll_task_queue,
            configured_rate=configured_rate,
            enabled=policy.breaker,
            window_s=policy.breaker_window_s,
            min_failures=policy.breaker_min_failures,
            failure_ratio=policy.breaker_failure_ratio,
            probe_interval_s=policy.breaker_probe_interval_s,
            close_after=policy.breaker_close_after,
            disable_after_s=policy.disabling_after_s,
        )

    def under(self, policy: FlowPolicy) -> BreakerQueue:
        """This queue with `policy`'s breaker settings (changed at run time, say)."""
        return BreakerQueue.of(
            self.destination, self.task_queue, self.poll_task_queue, self.configured_rate, policy
        )


def breaker_queues(destinations: Sequence[Destination]) -> dict[str, BreakerQueue]:
    """Each destination's submit queue as its circuit breaker sees it, by destination name."""
    return {
        d.name: BreakerQueue.of(
            d.name, d.submit_task_queue, d.poll_task_queue, d.submit_queue_rate, d.flow
        )
        for d in destinations
    }


@dataclass
class _Window:
    # (epoch seconds, failed) of each submit outcome within the window, oldest first.
    outcomes: deque[tuple[float, bool]] = field(default_factory=deque)
    failures: int = 0
    reported_at: float | None = None
    # The first failure since the last successful submit (None: the last one succeeded).
    failing_since: float | None = None


class BreakerGate:
    """The submit activity's side of the rule, one per worker process: counts each
    destination's submit outcomes and says when to report the destination failing.

    With `policies` (each destination's flow policy in force, `readmodel.flow_overrides`), the
    settings changed at run time replace the configured ones from the next submit on."""

    def __init__(
        self,
        queues: Mapping[str, BreakerQueue],
        clock: Callable[[], float] = time.time,
        policies: Callable[[str], FlowPolicy | None] | None = None,
    ) -> None:
        self._queues = dict(queues)
        self._clock = clock
        self._policies = policies
        self._windows: dict[str, _Window] = {}

    def _queue(self, destination: str) -> BreakerQueue | None:
        """The destination's settings in force; None while its breaker is off."""
        queue = self._queues.get(destination)
        if queue is not None and self._policies is not None:
            policy = self._policies(destination)
            if policy is not None:
                queue = queue.under(policy)
        if queue is None or not queue.enabled:
            # Counted afresh once it is on again: failures from before do not open it.
            self._windows.pop(destination, None)
            return None
        return queue

    def succeeded(self, destination: str) -> None:
        self._count(destination, self._queue(destination), failed=False)

    def failed(self, destination: str, error: str) -> Failing | None:
        """A submit failed; the report to send the destination's flow, if this one crosses the
        threshold (at most one per `REPORT_EVERY_S` while failures go on)."""
        queue = self._queue(destination)
        window = self._count(destination, queue, failed=True)
        if window is None or queue is None:
            return None
        now = self._clock()
        submits = len(window.outcomes)
        if window.failures < queue.min_failures or window.failures < queue.failure_ratio * submits:
            return None
        if window.reported_at is not None and now - window.reported_at < REPORT_EVERY_S:
            return None
        window.reported_at = now
        since = next(at for at, failed in window.outcomes if failed)
        return Failing(
            destination=destination,
            task_queue=queue.task_queue,
            poll_task_queue=queue.poll_task_queue,
            failures=window.failures,
            submits=submits,
            window_s=queue.window_s,
            since=datetime.fromtimestamp(since, UTC),
            seen_at=datetime.fromtimestamp(now, UTC),
            last_error=error[:300],
            configured_rate=queue.configured_rate,
            probe_interval_s=queue.probe_interval_s,
            close_after=queue.close_after,
            failing_since=datetime.fromtimestamp(window.failing_since or since, UTC),
            disable_after_s=queue.disable_after_s,
        )

    def not_reported(self, destination: str) -> None:
        """The report could not be sent: the next failure tries again."""
        window = self._windows.get(destination)
        if window is not None:
            window.reported_at = None

    def unsupported(self, destination: str) -> None:
        """The Temporal server cannot pause queues (the time-skipping test server): this process
        stops counting for the destination."""
        self._queues.pop(destination, None)
        self._windows.pop(destination, None)

    def _count(
        self, destination: str, queue: BreakerQueue | None, *, failed: bool
    ) -> _Window | None:
        if queue is None:
            return None
        window = self._windows.setdefault(destination, _Window())
        now = self._clock()
        window.outcomes.append((now, failed))
        window.failures += failed
        if not failed:
            window.failing_since = None
        elif window.failing_since is None:
            window.failing_since = now
        horizon = now - queue.window_s
        while window.outcomes and window.outcomes[0][0] < horizon:
            _, old_failed = window.outcomes.popleft()
            window.failures -= old_failed
        return window


def is_failure(status_code: int | None, retry_after_s: float | None) -> bool:
    """Whether a transient provider error counts against the circuit: a 5xx (a 503 with a
    `Retry-After` is a throttle), a timeout or a connection error (no status)."""
    if status_code is None:
        return True
    if status_code == 503 and retry_after_s is not None:
        return False
    return status_code >= 500
