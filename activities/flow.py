"""The destination flow workflow's activities: set the submit queue's rate as its throttle ramp,
its circuit or its adaptive rate says, unless the queue is no longer the flow's to change
(`flowcontrol.throttle`, `flowcontrol.breaker`, `flowcontrol.adaptive`); and the circuit's probe,
which runs where the destination's provider is.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

from durable_outbox_temporal.contract.flow import APPLY_RATE_ACTIVITY, RateApplied, RateChange
from temporalio import activity

from flowcontrol.queue_rates import (
    ADAPTIVE_REASON,
    QueueRate,
    circuit_reason,
    disabled_reason,
    pause_queue,
    read_queue_rate,
    set_queue_rate,
)

_IDENTITY = "durable-outbox-flow"
# A resume due now may find the queue's pause ending a moment later (clocks, rounding).
_EARLY = timedelta(seconds=0.05)


@activity.defn(name=APPLY_RATE_ACTIVITY)
async def apply_flow_rate(change: RateChange) -> RateApplied:
    """Resume a throttled queue, step its rate up, open or close its circuit, or disable it, as
    `change` says."""
    client = activity.client()
    now = await read_queue_rate(client, change.task_queue)
    if change.kind == "open":
        return await _open(change, now)
    if change.kind == "disable":
        return await _disable(change, now)
    if change.kind == "adapt":
        return await _adapt(change, now)
    if change.kind == "close":
        if not now.paused or now.circuit_open_since is None:
            return RateApplied(released=True)  # resumed or paused by hand meanwhile
        # The rate the circuit's pause remembered: what ran before it (`_open`).
        rate = now.resume_rate
        await set_queue_rate(
            client, change.task_queue, rate, "circuit closed: probes succeeded", identity=_IDENTITY
        )
        return RateApplied(rate=rate)
    if change.kind == "resume":
        if not now.paused or now.paused_until is None:
            return RateApplied(released=True)  # resumed or paused by hand meanwhile
        if now.paused_until > datetime.now(UTC) + _EARLY:
            return RateApplied(paused_until=now.paused_until)
        base = change.base_rate if change.from_ramp else now.resume_rate
    else:
        held = now.source == "api" and not now.paused and now.rate == change.expected
        if not held:
            return RateApplied(released=True)
        base = change.base_rate
    full = base if base is not None else change.configured_rate
    if change.factor >= 1:
        rate, reason = base, "recovered after a throttle"
    else:
        rate = full * change.factor
        reason = f"ramping after a throttle: {change.factor:g} of {full:g}/s"
    await set_queue_rate(
        client, change.task_queue, rate, change.reason_prefix + reason, identity=_IDENTITY
    )
    return RateApplied(rate=rate, base_rate=base)


async def _adapt(change: RateChange, now: QueueRate) -> RateApplied:
    """Set an adaptive destination's rate (`flowcontrol.adaptive`) while the queue is the
    flow's: unpaused and at the workers' rate, at the rate the flow last set, or at one an
    earlier run of the flow set (its reason says so). A throttle's pause is kept, with the new
    rate as the one its resume brings; any other pause stays as it is."""
    client = activity.client()
    if now.paused:
        if now.paused_until is None or change.rate is None:
            return RateApplied(held=True)  # an open circuit, disabled, or paused by hand
        await pause_queue(
            client,
            change.task_queue,
            now,
            now.pause_reason or "throttled",
            identity=_IDENTITY,
            resume_rate=change.rate,
        )
        return RateApplied(rate=change.rate)
    ours = (
        now.source == "worker"
        or (change.expected is not None and math.isclose(now.rate, change.expected, rel_tol=1e-6))
        or (now.reason or "").startswith(ADAPTIVE_REASON)
    )
    if not ours:
        return RateApplied(released=True)
    if change.rate is None:
        # Adopting: the rate in force is where the adaptive rate starts.
        in_force = now.rate if now.source == "api" else change.configured_rate
        return RateApplied(rate=round(in_force, 2))
    reason = f"{ADAPTIVE_REASON}{change.detail}"
    await set_queue_rate(client, change.task_queue, change.rate, reason, identity=_IDENTITY)
    return RateApplied(rate=change.rate)


async def _open(change: RateChange, now: QueueRate) -> RateApplied:
    """Pause the queue for the circuit, unless it is paused by hand (or by a 410) already: that
    pause stays, and the circuit's close will leave it too."""
    if now.paused and now.paused_until is None:
        return RateApplied(released=True)
    since = change.since or datetime.now(UTC)
    # Mid-ramp after a throttle, the rate to come back to is the one from before the storms.
    resume_rate = change.base_rate if change.from_ramp else None
    await pause_queue(
        activity.client(),
        change.task_queue,
        now,
        circuit_reason(since, change.detail),
        identity=_IDENTITY,
        resume_rate=resume_rate,
    )
    return RateApplied(rate=0.0)


async def _disable(change: RateChange, now: QueueRate) -> RateApplied:
    """Hold the queue paused until an operator re-enables it (`flowcontrol.disable`), at the
    rate the circuit's pause remembered; one paused by hand meanwhile stays the operator's."""
    if now.paused and now.circuit_open_since is None and now.paused_until is None:
        return RateApplied(released=True)
    since = change.since or datetime.now(UTC)
    await pause_queue(
        activity.client(),
        change.task_queue,
        now,
        disabled_reason(since, change.detail),
        identity=_IDENTITY,
    )
    return RateApplied(rate=0.0)
