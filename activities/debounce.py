"""The debounce window's I/O (`workflows/debounce.py`): hand its carrier to the item's usual
placement, and write the members that end in the window to the read model."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from durable_outbox_temporal import (
    IdempotencyConflict,
    LaneFull,
    OutboxClient,
    OutboxError,
    TemporalUnavailable,
)
from durable_outbox_temporal.contract import transitions
from durable_outbox_temporal.contract.debounce import (
    CANCEL_MEMBER_ACTIVITY,
    CLOSE_WINDOW_ACTIVITY,
    DebounceCancel,
    DebounceClose,
    without_payload,
)
from durable_outbox_temporal.contract.ids import item_workflow_id
from durable_outbox_temporal.contract.item import (
    ItemEventType,
    ItemStatus,
    OutboxItemInput,
    OutboxItemView,
)
from temporalio import activity

from readmodel.writer import ProjectionWriter

# Hand-over errors that pass: the local activity retries them (Temporal back, a lane's room).
WAITED_OUT = (TemporalUnavailable, LaneFull)


class DebounceActivities:
    """Local activities of the window workflow, on the workflow worker (which has the read
    model): each is safe to repeat."""

    def __init__(self, client: OutboxClient, writer: ProjectionWriter) -> None:
        self.client = client
        self.writer = writer

    @activity.defn(name=CLOSE_WINDOW_ACTIVITY)
    async def close_window(self, close: DebounceClose) -> None:
        """Hand the carrier over (a repeat finds it there), then end the others superseded.

        A hand-over that can never succeed ends the window's items failed, saying why, rather
        than retrying for ever; only an unreachable Temporal or a full lane is waited out."""
        carrier = close.carrier
        [result] = await self.client.hand_over([carrier])
        if isinstance(result, Exception):
            if not isinstance(result, OutboxError) or isinstance(result, WAITED_OUT):
                raise result
            await self._fail_window(close, result)
            return
        carrier_id = item_workflow_id(carrier.outbox, carrier.key)
        await self._end(
            close.superseded,
            ItemStatus.SUPERSEDED,
            ItemEventType.SUPERSEDED,
            f"carried by {carrier.key}",
            superseded_by=carrier_id,
        )

    async def _fail_window(self, close: DebounceClose, error: OutboxError) -> None:
        carrier = close.carrier
        activity.logger.warning(
            "debounce window carried by %s: the hand-over was refused (%s: %s); its %d item(s)"
            " end failed",
            carrier.key,
            type(error).__name__,
            error,
            len(close.superseded) + 1,
        )
        detail = f"its debounce window's carrier {carrier.key} was refused: {error}"
        members = list(close.superseded)
        if not isinstance(error, IdempotencyConflict):
            # The carrier's key is its own; under a conflict it is another item's row.
            members.append(without_payload(carrier))
        await self._end(members, ItemStatus.FAILED, ItemEventType.FAILED, detail)

    async def _end(
        self,
        members: list[OutboxItemInput],
        status: ItemStatus,
        event: ItemEventType,
        detail: str,
        superseded_by: str | None = None,
    ) -> None:
        at = datetime.now(UTC)
        await asyncio.gather(
            *(
                self.writer.write(
                    transitions.left_window(
                        item_workflow_id(member.outbox, member.key),
                        member,
                        status,
                        event,
                        at,
                        detail,
                        superseded_by=superseded_by,
                    )
                )
                for member in members
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
