"""The destination flow workflow's one activity: set the submit queue's rate as its ramp says,
unless the queue is no longer the flow's to change (`flowcontrol.throttle`)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from temporalio import activity

from contract.flow import APPLY_RATE_ACTIVITY, RateApplied, RateChange
from flowcontrol.queue_rates import read_queue_rate, set_queue_rate

_IDENTITY = "durable-outbox-flow"
# A resume due now may find the queue's pause ending a moment later (clocks, rounding).
_EARLY = timedelta(seconds=0.05)


@activity.defn(name=APPLY_RATE_ACTIVITY)
async def apply_flow_rate(change: RateChange) -> RateApplied:
    """Resume a throttled queue, or step its rate up, as `change` says."""
    client = activity.client()
    now = await read_queue_rate(client, change.task_queue)
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
    await set_queue_rate(client, change.task_queue, rate, reason, identity=_IDENTITY)
    return RateApplied(rate=rate, base_rate=base)
