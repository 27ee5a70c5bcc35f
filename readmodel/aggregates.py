"""The aggregate event store and latest-state rows: idempotent writes, paged reads, erasure.

Each event is written once by (type, id, seq), however often a write is retried or replayed;
the state row only ever moves forward in version. Events' data and the state are sealed under
the aggregate's data key (`readmodel.data_keys`): `erase` deletes it, and they read as
`SHREDDED` from then on, the events still there, in order, with their types and times, so the
store replays (docs/decisions/aggregate-crypto-shredding.md).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from durable_outbox_temporal.contract.aggregate import (
    SHREDDED,
    AggregateCarry,
    PassivateAggregate,
    RecordedEvent,
    ResumedAggregate,
    StoreEvents,
    aggregate_workflow_id,
    is_shredded,
)
from pydantic import TypeAdapter
from sqlalchemy import Connection, Engine, Executable, and_, or_, select, text, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import RowMapping

from readmodel import data_keys
from readmodel.models import AGGREGATE_EVENTS, AGGREGATES, read_aggregate_event
from readmodel.projectors.base import AsyncProjector, forget_aggregate

MAX_PAGE = 500
_CARRY = TypeAdapter(AggregateCarry)
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
    # When a run of it last ended idle, its carry stored for the next run (None: never).
    passivated_at: datetime | None = None


def store_events(engine: Engine, batch: StoreEvents) -> None:
    """Write the events (each once) and the state they lead to, in one transaction."""
    insert_events, upsert_state = _statements(engine.dialect.name)
    with engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            # Writers take turns, so events commit in `id` order: an async projector that has
            # read up to id N never meets an id below N committing later (SQLite has one writer
            # at a time anyway). Writes are a few short statements; aggregates do not need more.
            connection.execute(
                text("SELECT pg_advisory_xact_lock(:key)"), {"key": EVENT_STORE_LOCK_KEY}
            )
        key = data_keys.current_key(connection, aggregate_workflow_id(batch.type, batch.id))
        rows = [
            {
                **dataclasses.asdict(event),
                "data": key.seal_json(event.data),
                "aggregate_type": batch.type,
                "aggregate_id": batch.id,
            }
            for event in sorted(batch.events, key=lambda event: event.seq)
        ]
        if rows:
            connection.execute(insert_events, rows)
        connection.execute(
            upsert_state,
            {
                "type": batch.type,
                "id": batch.id,
                "version": batch.version,
                "state": key.seal_json(batch.state),
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
        return _opened(connection, list(connection.execute(query).mappings()))


def _opened(connection: Connection, rows: list[RowMapping]) -> list[RecordedEvent]:
    """The rows' events with their data opened under each one's data key (or shredded)."""
    keys = data_keys.keys_by_id(connection, (row["data"] for row in rows))
    return [
        dataclasses.replace(
            read_aggregate_event(row), data=data_keys.open_value(row["data"], keys, SHREDDED)
        )
        for row in rows
    ]


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
        rows = list(connection.execute(query).mappings())
        opened = _opened(connection, rows)
    return [
        ((row["aggregate_type"], row["aggregate_id"]), event)
        for row, event in zip(rows, opened, strict=True)
    ]


def passivate(engine: Engine, request: PassivateAggregate) -> bool:
    """Store what an idle run carries on its aggregate's row, sealed under its data key, for
    the next run. False (nothing written) unless the row is at the carry's version: the carry
    goes only with the state it leads to. Idempotent."""
    scope = aggregate_workflow_id(request.type, request.id)
    with engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            # Ordered with an erasure: its shred comes before this write or after it.
            connection.execute(
                text("SELECT pg_advisory_xact_lock(:key)"), {"key": EVENT_STORE_LOCK_KEY}
            )
        key = data_keys.current_key(connection, scope)
        written = connection.execute(
            update(AGGREGATES)
            .where(
                AGGREGATES.c.type == request.type,
                AGGREGATES.c.id == request.id,
                AGGREGATES.c.version == request.carry.version,
            )
            .values(
                carry=key.seal_json(_CARRY.dump_python(request.carry, mode="json")),
                passivated_at=request.passivated_at,
            )
        )
        return bool(written.rowcount)


def resume(engine: Engine, aggregate_type: str, aggregate_id: str) -> ResumedAggregate | None:
    """What a new run of the aggregate starts from: the carry its last run stored, if it is at
    the stored version; else the stored state and version (a run that ended otherwise: one
    terminated); `erased` if its data was erased meanwhile. None for an aggregate never
    stored."""
    query = select(AGGREGATES).where(
        AGGREGATES.c.type == aggregate_type, AGGREGATES.c.id == aggregate_id
    )
    with engine.connect() as connection:
        row = connection.execute(query).mappings().first()
        if row is None:
            return None
        keys = data_keys.keys_by_id(connection, (row["state"], row["carry"]))
    state = data_keys.open_value(row["state"], keys, SHREDDED)
    carried = data_keys.open_value(row["carry"], keys, SHREDDED)
    carry = None
    if carried is not None and not is_shredded(carried):
        carry = _CARRY.validate_python(carried)
        if carry.version != row["version"]:
            carry = None  # older than the store: the state row is what holds
    return ResumedAggregate(
        carry=carry,
        version=row["version"],
        state=state,
        updated_at=row["updated_at"],
        erased=carry is None and is_shredded(state),
    )


def get(engine: Engine, aggregate_type: str, aggregate_id: str) -> AggregateRecord | None:
    query = select(AGGREGATES).where(
        AGGREGATES.c.type == aggregate_type, AGGREGATES.c.id == aggregate_id
    )
    with engine.connect() as connection:
        row = connection.execute(query).mappings().first()
        return None if row is None else _records(connection, [row])[0]


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
        records = _records(connection, list(connection.execute(query).mappings()))
    if len(records) <= limit:
        return records, None
    return records[:limit], records[limit - 1].id


def erase(
    engine: Engine,
    aggregate_type: str,
    aggregate_id: str,
    now: datetime,
    projectors: Iterable[AsyncProjector] = (),
) -> datetime | None:
    """Erase the aggregate's data from the event store: its data keys deleted, any event or
    state written before they existed (plain) overwritten with `SHREDDED`, and what the
    `projectors` of its type hold of it removed, in one transaction. When it was erased; None
    for an aggregate the store has never held."""
    scope = aggregate_workflow_id(aggregate_type, aggregate_id)
    of_aggregate = and_(
        AGGREGATE_EVENTS.c.aggregate_type == aggregate_type,
        AGGREGATE_EVENTS.c.aggregate_id == aggregate_id,
    )
    with engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            # A write in flight commits before the shred, or after it under a new key.
            connection.execute(
                text("SELECT pg_advisory_xact_lock(:key)"), {"key": EVENT_STORE_LOCK_KEY}
            )
        erased_at = data_keys.shred(connection, scope, now)
        plain = [
            row.id
            for row in connection.execute(
                select(AGGREGATE_EVENTS.c.id, AGGREGATE_EVENTS.c.data).where(of_aggregate)
            )
            if not data_keys.is_data_sealed(row.data)
        ]
        if plain:
            connection.execute(
                update(AGGREGATE_EVENTS)
                .where(AGGREGATE_EVENTS.c.id.in_(plain))
                .values(data=SHREDDED)
            )
        state = connection.execute(
            update(AGGREGATES)
            .where(AGGREGATES.c.type == aggregate_type, AGGREGATES.c.id == aggregate_id)
            .values(state=SHREDDED, carry=None)
        )
        if erased_at is None and (plain or state.rowcount):
            erased_at = now
        if erased_at is not None:
            for projector in projectors:
                forget_aggregate(connection, projector, aggregate_type, aggregate_id)
        return erased_at


def _records(connection: Connection, rows: list[RowMapping]) -> list[AggregateRecord]:
    keys = data_keys.keys_by_id(connection, (row["state"] for row in rows))
    return [
        AggregateRecord(
            type=row["type"],
            id=row["id"],
            version=row["version"],
            state=data_keys.open_value(row["state"], keys, SHREDDED),
            updated_at=row["updated_at"],
            passivated_at=row["passivated_at"],
        )
        for row in rows
    ]
