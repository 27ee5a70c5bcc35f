"""The debounce window's I/O (`workflows/debounce.py`): hand its carrier to the item's usual
placement, and write the members that end in the window to the read model."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from temporalio import activity

from contract import transitions
from contract.debounce import (
    CANCEL_MEMBER_ACTIVITY,
    CLOSE_WINDOW_ACTIVITY,
    DebounceCancel,
    DebounceClose,
)
from contract.ids import item_workflow_id
from contract.item import ItemEventType, ItemStatus, OutboxItemView
from outbox_client import OutboxClient
from readmodel.writer import ProjectionWriter


class DebounceActivities:
    """Local activities of the window workflow, on the workflow worker (which has the read
    model): each is safe to repeat."""

    def __init__(self, client: OutboxClient, writer: ProjectionWriter) -> None:
        self.client = client
        self.writer = writer

    @activity.defn(name=CLOSE_WINDOW_ACTIVITY)
    async def close_window(self, close: DebounceClose) -> None:
        """Hand the carrier over (a repeat finds it there), then end the others superseded."""
        carrier = close.carrier
        [result] = await self.client.hand_over([carrier])
        if isinstance(result, Exception):
            raise result
        carrier_id = item_workflow_id(carrier.outbox, carrier.key)
        at = datetime.now(UTC)
        await asyncio.gather(
            *(
                self.writer.write(
                    transitions.left_window(
                        item_workflow_id(member.outbox, member.key),
                        member,
                        ItemStatus.SUPERSEDED,
                        ItemEventType.SUPERSEDED,
                        at,
                        f"carried by {carrier.key}",
                        superseded_by=carrier_id,
                    )
                )
                for member in close.superseded
            )
        )

    @activity.defn(name=CANCEL_MEMBER_ACTIVITY)
    async def cancel_member(self, cancel: DebounceCancel) -> OutboxItemView:
        """Record a member cancelled in its window; its view."""
        member = cancel.item
        projection = transitions.left_window(
            item_workflow_id(member.outbox, member.key),
            member,
            ItemStatus.CANCELLED,
            ItemEventType.CANCELLED,
            datetime.now(UTC),
            cancel.reason,
        )
        await self.writer.write(projection)
        return projection.view
