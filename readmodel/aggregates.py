"""The aggregate event store and latest-state rows: idempotent writes, paged reads.

Each event is written once by (type, id, seq), however often a write is retried or replayed;
the state row only ever moves forward in version.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from durable_outbox_temporal.contract.aggregate import RecordedEvent, StoreEvents
from sqlalchemy import Engine, Executable, and_, or_, select, text
from sqlalchemy.dialects import postgresql, sqlite

from readmodel.models import AGGREGATE_EVENTS, AGGREGATES, read_aggregate_event

MAX_PAGE = 500
# Names the advisory lock event-store writers take on PostgreSQL ("aggevt").
EVENT_STORE_LOCK_KEY = 0x616767657674


@dataclass
class AggregateRecord:
    """An aggregate's latest stored state."""

    type: str
    id: str
    version: int
    state: dict[str, Any]
    updated_at: datetime


def store_events(engine: Engine, batch: StoreEvents) -> None:
    """Write the events (each once) and the state they lead to, in one transaction."""
    insert_events, upsert_state = _statements(engine.dialect.name)
    rows = [
        {**dataclasses.asdict(event), "aggregate_type": batch.type, "aggregate_id": batch.id}
        for event in sorted(batch.events, key=lambda event: event.seq)
    ]
    with engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            # Writers take turns, so events commit in `id` order: an async projector that has
            # read up to id N never meets an id below N committing later (SQLite has one writer
            # at a time anyway). Writes are a few short statements; aggregates do not need more.
            connection.execute(
                text("SELECT pg_advisory_xact_lock(:key)"), {"key": EVENT_STORE_LOCK_KEY}
            )
        if rows:
            connection.execute(insert_events, rows)
        connection.execute(
            upsert_state,
            {
                "type": batch.type,
                "id": batch.id,
                "version": batch.version,
                "state": batch.state,
                "updated_at": batch.updated_at,
            },
        )


@functools.cache
def _statements(dialect: str) -> tuple[Executable, Executable]:
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    insert_events = insert(AGGREGATE_EVENTS).on_conflict_do_nothing(
        index_elements=["aggregate_type", "aggregate_id", "seq"]
    )
    upsert = insert(AGGREGATES)
    upsert_state = upsert.on_conflict_do_update(
        index_elements=["type", "id"],
        set_={name: upsert.excluded[name] for name in ("version", "state", "updated_at")},
        where=AGGREGATES.c.version < upsert.excluded.version,
    )
    return insert_events, upsert_state


def events(
    engine: Engine, aggregate_type: str, aggregate_id: str, *, after: int = 0, limit: int = 100
) -> list[RecordedEvent]:
    """The aggregate's events with seq > `after`, oldest first."""
    query = (
        select(AGGREGATE_EVENTS)
        .where(
            AGGREGATE_EVENTS.c.aggregate_type == aggregate_type,
            AGGREGATE_EVENTS.c.aggregate_id == aggregate_id,
            AGGREGATE_EVENTS.c.seq > after,
        )
        .order_by(AGGREGATE_EVENTS.c.seq)
        .limit(max(1, min(limit, MAX_PAGE)))
    )
    with engine.connect() as connection:
        return [read_aggregate_event(row) for row in connection.execute(query).mappings()]


def events_after_each(
    engine: Engine, cursors: Mapping[tuple[str, str], int], limit: int = 500
) -> list[tuple[tuple[str, str], RecordedEvent]]:
    """Events of each aggregate in `cursors` (keyed by type and id) with seq above its own
    cursor, oldest first: one query for every aggregate a live tailer follows."""
    if not cursors:
        return []
    query = (
        select(AGGREGATE_EVENTS)
        .where(
            or_(
                *(
                    and_(
                        AGGREGATE_EVENTS.c.aggregate_type == aggregate_type,
                        AGGREGATE_EVENTS.c.aggregate_id == aggregate_id,
                        AGGREGATE_EVENTS.c.seq > after,
                    )
                    for (aggregate_type, aggregate_id), after in sorted(cursors.items())
                )
            )
        )
        # The cursor grows with seq within one aggregate (its events are stored in order), and
        # across aggregates it keeps a busy one from starving the others of a page.
        .order_by(AGGREGATE_EVENTS.c.id)
        .limit(limit)
    )
    with engine.connect() as connection:
        return [
            ((row["aggregate_type"], row["aggregate_id"]), read_aggregate_event(row))
            for row in connection.execute(query).mappings()
        ]


def get(engine: Engine, aggregate_type: str, aggregate_id: str) -> AggregateRecord | None:
    query = select(AGGREGATES).where(
        AGGREGATES.c.type == aggregate_type, AGGREGATES.c.id == aggregate_id
    )
    with engine.connect() as connection:
        row = connection.execute(query).mappings().first()
    return None if row is None else AggregateRecord(**row)


def list_ids(
    engine: Engine, aggregate_type: str, *, after: str | None = None, limit: int = 50
) -> tuple[list[AggregateRecord], str | None]:
    """The type's aggregates by id; pass the returned cursor (the last id) as `after`."""
    limit = max(1, min(limit, MAX_PAGE))
    conditions = [AGGREGATES.c.type == aggregate_type]
    if after is not None:
        conditions.append(AGGREGATES.c.id > after)
    query = select(AGGREGATES).where(and_(*conditions)).order_by(AGGREGATES.c.id).limit(limit + 1)
    with engine.connect() as connection:
        records = [AggregateRecord(**row) for row in connection.execute(query).mappings()]
    if len(records) <= limit:
        return records, None
    return records[:limit], records[limit - 1].id
