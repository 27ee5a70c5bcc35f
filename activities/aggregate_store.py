"""The event-store activities: an aggregate workflow writes its new events to `aggregate_events`,
stores what it carries as it ends idle, and a new run loads what the last one stored."""

from __future__ import annotations

import asyncio

from durable_outbox_temporal.contract.aggregate import (
    EVENTS_PAGE_ACTIVITY,
    PASSIVATE_ACTIVITY,
    RESUME_ACTIVITY,
    STORE_ACTIVITY,
    PassivateAggregate,
    RecordedEvent,
    ResumedAggregate,
    StoreEvents,
)
from sqlalchemy import Engine
from temporalio import activity

from readmodel import aggregates

# Events a page of `read_aggregate_events` holds: a local activity's result is recorded in the
# history, so a page stays well under Temporal's payload limits.
EVENTS_PAGE = 100


class AggregateStoreActivities:
    """Runs as a local activity on the workflow worker: a write costs no extra task."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    @activity.defn(name=STORE_ACTIVITY)
    async def store_aggregate_events(self, batch: StoreEvents) -> None:
        """Idempotent: a retried or replayed write leaves the store unchanged."""
        await asyncio.to_thread(aggregates.store_events, self._engine, batch)

    @activity.defn(name=PASSIVATE_ACTIVITY)
    async def passivate_aggregate(self, request: PassivateAggregate) -> bool:
        """Store an idle run's carry; False if the store is not at its version (the run goes on)."""
        return await asyncio.to_thread(aggregates.passivate, self._engine, request)

    @activity.defn(name=RESUME_ACTIVITY)
    async def resume_aggregate(
        self, aggregate_type: str, aggregate_id: str
    ) -> ResumedAggregate | None:
        """What a new run starts from; None for an aggregate the store has never held."""
        return await asyncio.to_thread(
            aggregates.resume, self._engine, aggregate_type, aggregate_id
        )

    @activity.defn(name=EVENTS_PAGE_ACTIVITY)
    async def read_aggregate_events(
        self, aggregate_type: str, aggregate_id: str, after: int
    ) -> list[RecordedEvent]:
        """The stored events after seq `after`, a page of at most `EVENTS_PAGE`, oldest first."""
        return await asyncio.to_thread(
            aggregates.events,
            self._engine,
            aggregate_type,
            aggregate_id,
            after=after,
            limit=EVENTS_PAGE,
        )
