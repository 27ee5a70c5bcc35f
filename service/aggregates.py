"""Aggregate reads: state (live, or stored while Temporal is down), history, the type's ids.

Commands go straight to `AggregateClient.command`: there is nothing to add on the way.
"""

from __future__ import annotations

import asyncio

from sqlalchemy import Engine

from contract.aggregate import AggregateView, RecordedEvent
from outbox_client.aggregates import AggregateClient
from outbox_client.errors import UnknownAggregate, is_temporal_unavailable
from readmodel import aggregates as event_store
from readmodel.aggregates import AggregateRecord


class AggregateService:
    """The aggregate use cases over one `AggregateClient` and the read-model engine."""

    def __init__(self, client: AggregateClient, engine: Engine) -> None:
        self.client = client
        self.engine = engine

    async def state(self, aggregate_type: str, aggregate_id: str) -> AggregateView:
        """Live from the workflow; from the event store's state row while Temporal is down."""
        try:
            return await self.client.state(aggregate_type, aggregate_id)
        except Exception as err:
            if not is_temporal_unavailable(err):
                raise
            record = await asyncio.to_thread(
                event_store.get, self.engine, aggregate_type, aggregate_id
            )
            if record is None:
                raise
            return AggregateView(
                type=record.type,
                id=record.id,
                version=record.version,
                state=record.state,
                views={},
                updated_at=record.updated_at,
            )

    async def events(
        self, aggregate_type: str, aggregate_id: str, *, after: int = 0, limit: int = 100
    ) -> list[RecordedEvent]:
        """Stored events after seq `after`; `UnknownAggregate` for an aggregate never stored."""
        self.client.check(aggregate_type, aggregate_id)
        events = await asyncio.to_thread(
            event_store.events, self.engine, aggregate_type, aggregate_id, after=after, limit=limit
        )
        if not events and after == 0:
            record = await asyncio.to_thread(
                event_store.get, self.engine, aggregate_type, aggregate_id
            )
            if record is None:
                raise UnknownAggregate(f"no {aggregate_type} {aggregate_id!r}")
        return events

    async def list(
        self, aggregate_type: str, *, after: str | None = None, limit: int = 50
    ) -> tuple[list[AggregateRecord], str | None]:
        self.client.check(aggregate_type)
        return await asyncio.to_thread(
            event_store.list_ids, self.engine, aggregate_type, after=after, limit=limit
        )
