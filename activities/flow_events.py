"""Operational events of flow control: a destination's throttle storm, its circuit opening or
closing, its disabling after failing too long (`flowcontrol.disable`), each sent as an outbox
item to the destination's `events_destination` (a webhook an operator's tooling listens on), so
it is as durable and as visible as any other delivery.

The destination's flow workflow (`durable_outbox_temporal.contract.flow`) asks for each; this
activity runs on the operations worker, which can enqueue to every configured destination.
"""

from __future__ import annotations

from typing import Any

from durable_outbox_temporal.client import OutboxClient
from durable_outbox_temporal.contract.flow import (
    FLOW_EVENT_ACTIVITY,
    FLOW_EVENTS_OUTBOX,
    FlowNotice,
)
from temporalio import activity

# Event types as a receiver sees them, by flow event kind.
EVENT_TYPES = {
    "throttled": "destination.throttled",
    "recovered": "destination.recovered",
    "opened": "destination.circuit_opened",
    "closed": "destination.circuit_closed",
    "disabled": "destination.disabled",
    "adapted": "destination.rate_adapted",
}


def event_payload(notice: FlowNotice) -> dict[str, Any]:
    """The JSON a receiver gets: what happened to which destination, when, and the state after."""
    event = notice.event
    return {
        "type": EVENT_TYPES.get(event.kind, f"destination.{event.kind}"),
        "destination": notice.destination,
        "at": event.at.isoformat(),
        "detail": event.detail,
        "circuit": notice.circuit,
        "paused_until": None if notice.paused_until is None else notice.paused_until.isoformat(),
        "submit_rate": event.rate,
    }


def event_key(notice: FlowNotice) -> str:
    """One key per event: a retried activity (or a replayed flow) finds the item it made."""
    return f"flow.{notice.destination}.{notice.event.kind}.{notice.event.at.timestamp():.6f}"


class FlowEventActivities:
    def __init__(self, client: OutboxClient) -> None:
        self.client = client

    @activity.defn(name=FLOW_EVENT_ACTIVITY)
    async def send_flow_event(self, notice: FlowNotice) -> bool:
        """Enqueue the event to its destination; whether it was new."""
        enqueued = await self.client.enqueue(
            FLOW_EVENTS_OUTBOX,
            notice.events_destination,
            event_payload(notice),
            key=event_key(notice),
        )
        return enqueued.created
