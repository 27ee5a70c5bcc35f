"""Aggregate reads: state (live; or stored, while Temporal is down or once it forgot an aggregate
whose run ended idle), history, the type's ids.

Reads take a `reader`, the actor the caller reads as (already checked against the caller's
token, or None): a definition's secret fields are redacted unless it lets that actor see them.
Commands go straight to `AggregateClient.command`: the API checks their actor first.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from durable_outbox_temporal.aggregate_definition import AggregateDefinition
from durable_outbox_temporal.aggregates import AggregateClient
from durable_outbox_temporal.contract.aggregate import (
    AggregateView,
    EffectRecord,
    RecordedEvent,
    ResumedAggregate,
    effect_counts,
    is_shredded,
)
from durable_outbox_temporal.errors import UnknownAggregate, is_temporal_unavailable
from sqlalchemy import Engine

from readmodel import aggregates as event_store
from readmodel.aggregates import AggregateRecord
from readmodel.projectors.base import AsyncProjector


class AggregateService:
    """The aggregate use cases over one `AggregateClient` and the read-model engine."""

    def __init__(
        self,
        client: AggregateClient,
        engine: Engine,
        projectors: Iterable[AsyncProjector] = (),
    ) -> None:
        self.client = client
        self.engine = engine
        # Erasing an aggregate's data removes what these hold of it too.
        self.projectors = tuple(projectors)

    async def state(
        self, aggregate_type: str, aggregate_id: str, *, reader: str | None = None
    ) -> AggregateView:
        """Live from the workflow; from the event store's state row while Temporal is down."""
        definition = self.client.check(aggregate_type, aggregate_id)
        view = await self._view(aggregate_type, aggregate_id)
        if not definition.has_secrets() or _may_read_secrets(definition, view.state, reader):
            return view
        return dataclasses.replace(view, state=definition.redact_state(view.state))

    async def _view(self, aggregate_type: str, aggregate_id: str) -> AggregateView:
        try:
            return await self.client.state(aggregate_type, aggregate_id)
        except Exception as err:
            # An aggregate whose run ended idle, once Temporal forgot the run, or any while
            # Temporal is down: what the store holds.
            if not (isinstance(err, UnknownAggregate) or is_temporal_unavailable(err)):
                raise
            stored = await self._stored(aggregate_type, aggregate_id)
            if stored is None:
                raise
            carry = stored.carry
            return AggregateView(
                type=aggregate_type,
                id=aggregate_id,
                version=stored.version,
                state=stored.state if carry is None else carry.state,
                views={} if carry is None else carry.views,
                updated_at=stored.updated_at,
                rejected=0 if carry is None else len(carry.rejected),
                effects=effect_counts([] if carry is None else carry.effects),
            )

    async def effects(self, aggregate_type: str, aggregate_id: str) -> list[EffectRecord]:
        """The effect ledger: live, or as the aggregate's last run stored it as it ended idle."""
        try:
            return await self.client.effects(aggregate_type, aggregate_id)
        except UnknownAggregate:
            stored = await self._stored(aggregate_type, aggregate_id)
            if stored is None or stored.carry is None:
                raise
            return list(stored.carry.effects)

    async def _stored(self, aggregate_type: str, aggregate_id: str) -> ResumedAggregate | None:
        return await asyncio.to_thread(
            event_store.resume, self.engine, aggregate_type, aggregate_id
        )

    async def events(
        self,
        aggregate_type: str,
        aggregate_id: str,
        *,
        after: int = 0,
        limit: int = 100,
        reader: str | None = None,
    ) -> list[RecordedEvent]:
        """Stored events after seq `after`; `UnknownAggregate` for an aggregate never stored."""
        definition = self.client.check(aggregate_type, aggregate_id)
        events = await asyncio.to_thread(
            event_store.events, self.engine, aggregate_type, aggregate_id, after=after, limit=limit
        )
        if not events and after == 0:
            record = await asyncio.to_thread(
                event_store.get, self.engine, aggregate_type, aggregate_id
            )
            if record is None:
                raise UnknownAggregate(f"no {aggregate_type} {aggregate_id!r}")
        return await self._visible(definition, aggregate_id, events, reader)

    async def visible(
        self, aggregate_type: str, aggregate_id: str, events: list[RecordedEvent]
    ) -> list[RecordedEvent]:
        """Events a live stream's tailer read, as any reader sees them (secret fields redacted)."""
        definition = self.client.check(aggregate_type, aggregate_id)
        return await self._visible(definition, aggregate_id, events, None)

    async def _visible(
        self,
        definition: AggregateDefinition[Any],
        aggregate_id: str,
        events: list[RecordedEvent],
        reader: str | None,
    ) -> list[RecordedEvent]:
        """The events with their secret fields redacted, unless `reader` may see them."""
        if not events or not definition.has_secrets():
            return events
        if reader is not None:
            # The stored state decides: it trails the live one by a moment at most.
            record = await asyncio.to_thread(
                event_store.get, self.engine, definition.type_name, aggregate_id
            )
            if record is not None and _may_read_secrets(definition, record.state, reader):
                return events
        return [
            dataclasses.replace(event, data=definition.redact_event(event.type, event.data))
            for event in events
        ]

    async def erase(self, aggregate_type: str, aggregate_id: str) -> datetime:
        """Erase the aggregate's data from the event store by deleting its data key (crypto-
        shredding): its events stay, in order, their data read as `SHREDDED`; what the
        projectors hold of it goes in the same transaction. When it was
        erased; `UnknownAggregate` for an aggregate the store has never held."""
        self.client.check(aggregate_type, aggregate_id)
        erased = await asyncio.to_thread(
            event_store.erase,
            self.engine,
            aggregate_type,
            aggregate_id,
            datetime.now(UTC),
            self.projectors,
        )
        if erased is None:
            raise UnknownAggregate(f"no {aggregate_type} {aggregate_id!r} in the event store")
        return erased

    async def list(
        self, aggregate_type: str, *, after: str | None = None, limit: int = 50
    ) -> tuple[list[AggregateRecord], str | None]:
        self.client.check(aggregate_type)
        return await asyncio.to_thread(
            event_store.list_ids, self.engine, aggregate_type, after=after, limit=limit
        )


def _may_read_secrets(
    definition: AggregateDefinition[Any], state: Mapping[str, Any], reader: str | None
) -> bool:
    # An erased state entitles nobody: who may read is part of what was erased.
    if reader is None or is_shredded(dict(state)):
        return False
    return definition.may_read_secrets(definition.load_state(state), reader)
