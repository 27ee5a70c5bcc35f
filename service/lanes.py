"""Ordering-lane use cases: list the outbox's lanes, read one live or projected, resume one."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Literal

from durable_outbox_temporal import (
    LaneNotFound,
    OutboxClient,
    is_temporal_unavailable,
    validate_outbox,
)
from durable_outbox_temporal.contract.ids import item_workflow_id
from durable_outbox_temporal.contract.lane import LaneDetail, LaneStatus, LaneView
from durable_outbox_temporal.validation import validate_ordering_key
from sqlalchemy import Engine

from readmodel import lanes as lane_store
from readmodel import store

log = logging.getLogger("outbox.service")


@dataclass
class LaneSnapshot:
    """A lane's view, the first keys waiting behind its head (live only), and its source."""

    view: LaneView
    waiting: list[str] | None
    source: Literal["workflow", "read-model"]


class LaneService:
    """The lane use cases over one `OutboxClient` and one read-model engine."""

    def __init__(self, client: OutboxClient, engine: Engine) -> None:
        self.client = client
        self.engine = engine

    async def list(
        self,
        outbox: str,
        *,
        status: LaneStatus | None = None,
        after: str | None = None,
        limit: int = 50,
    ) -> tuple[list[LaneView], str | None]:
        """A page of the outbox's lanes by ordering key (read model), and the next cursor."""
        validate_outbox(outbox)
        return await asyncio.to_thread(
            lane_store.list_lanes, self.engine, outbox, status=status, after=after, limit=limit
        )

    async def get(self, outbox: str, ordering_key: str) -> LaneSnapshot:
        """Live from the workflow holding the lane while it runs; its last projected view once
        it has ended."""
        validate_outbox(outbox)
        validate_ordering_key(ordering_key)
        view = await asyncio.to_thread(lane_store.get_lane, self.engine, outbox, ordering_key)
        try:
            live = await self._live(outbox, ordering_key, view)
        except Exception as err:
            if not is_temporal_unavailable(err):
                raise
            log.warning("serving lane %s from the read model: Temporal unavailable", ordering_key)
            live = None
        if live is not None:
            return LaneSnapshot(live.view, live.waiting, "workflow")
        if view is None:
            raise LaneNotFound(f"no lane {ordering_key!r} in outbox {outbox!r}")
        return LaneSnapshot(view, None, "read-model")

    async def _live(
        self, outbox: str, ordering_key: str, view: LaneView | None
    ) -> LaneDetail | None:
        """The lane's live detail from where its row says it is; a lane not yet in the read
        model is looked for in its own workflow, then in each bulk destination's shards."""
        if view is not None:
            return await self.client.lane(outbox, ordering_key, view.destination)
        live = await self.client.lane(outbox, ordering_key)
        for destination in self.client.destinations.bulk_destinations():
            if live is not None:
                break
            live = await self.client.lane(outbox, ordering_key, destination.name)
        return live

    async def redrive_head(self, outbox: str, ordering_key: str) -> str:
        """Run a halted lane's failed head item again; the lane goes on once it is sent."""
        holder = _holder(
            await asyncio.to_thread(lane_store.get_lane, self.engine, outbox, ordering_key)
        )
        current = await self.client.lane(outbox, ordering_key, holder)
        head = current.view.head_key if current is not None else None
        record = (
            await asyncio.to_thread(store.get_item, self.engine, item_workflow_id(outbox, head))
            if head is not None
            else None
        )
        return await self.client.resume_lane(
            outbox,
            ordering_key,
            last_event_seq=record.view.last_event_seq if record else 0,
            head_destination=record.view.destination if record else None,
            destination=holder,
        )

    async def skip_head(self, outbox: str, ordering_key: str, reason: str) -> str:
        """Move a halted lane past its failed head item, which stays failed."""
        holder = _holder(
            await asyncio.to_thread(lane_store.get_lane, self.engine, outbox, ordering_key)
        )
        return await self.client.resume_lane(
            outbox, ordering_key, skip_reason=reason, destination=holder
        )


def _holder(view: LaneView | None) -> str | None:
    """The bulk destination whose shard holds the lane, as its row last said (None: its own
    workflow)."""
    return view.destination if view is not None else None
