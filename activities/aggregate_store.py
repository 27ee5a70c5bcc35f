"""The event-store activity: an aggregate workflow writes its new events to `aggregate_events`."""

from __future__ import annotations

import asyncio

from durable_outbox_temporal.contract.aggregate import STORE_ACTIVITY, StoreEvents
from sqlalchemy import Engine
from temporalio import activity

from readmodel import aggregates


class AggregateStoreActivities:
    """Runs as a local activity on the workflow worker: a write costs no extra task."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    @activity.defn(name=STORE_ACTIVITY)
    async def store_aggregate_events(self, batch: StoreEvents) -> None:
        """Idempotent: a retried or replayed write leaves the store unchanged."""
        await asyncio.to_thread(aggregates.store_events, self._engine, batch)
