"""Async projectors: cross-aggregate read models built from the event store, each at its own
checkpoint (docs/explanation/aggregates.md).

A projector reads `aggregate_events` after its position (the events' global `id`) and applies
them in the same transaction that moves its checkpoint forward, so a retried, repeated or
concurrent batch never applies an event twice and the read model never goes backwards. After
`FAULT_AFTER` consecutive failures it is `faulted` and stops, the others carrying on; a rebuild
empties its tables and starts it again from the first event. An event whose aggregate's data was
erased (`readmodel.aggregates.erase`) is passed over: there is nothing left to project, and a
rebuild after an erasure leaves the erased data out of the projection. What a projector already
holds of that aggregate goes in the erasure's own transaction (`forget_aggregate`): its `forget`
removes it, and a projector without one is restarted from the first event, so no copy of the
erased data outlives the erasure in a projection.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from durable_outbox_temporal.contract.aggregate import SHREDDED, is_shredded
from sqlalchemy import Column, Connection, Engine, Table, bindparam, func, select, update
from sqlalchemy.dialects import postgresql, sqlite

from readmodel import data_keys
from readmodel.models import AGGREGATE_EVENTS, PROJECTOR_CHECKPOINTS

FAULT_AFTER = 5
BATCH = 500
MAX_ROWS_PAGE = 500
RUNNING, FAULTED = "running", "faulted"


@dataclass(frozen=True)
class StoredEvent:
    """One event as a projector sees it: its global position and its aggregate."""

    position: int
    aggregate_type: str
    aggregate_id: str
    seq: int
    type: str
    data: dict[str, Any]
    recorded_at: datetime


@dataclass(frozen=True)
class AsyncProjector:
    """A projector: the aggregate types it reads, what it does with one event (inside the
    batch's transaction), the table it owns (emptied on rebuild) and the columns its rows may
    be filtered by in the API."""

    name: str
    aggregate_types: frozenset[str]
    apply: Callable[[Connection, StoredEvent], None]
    table: Table
    filters: Mapping[str, Column[Any]] = field(default_factory=dict)
    # What the projector holds of one aggregate, removed when its data is erased (called with
    # the erasure's connection and the aggregate's type and id). Without it an erasure
    # restarts the projector from the first event (`forget_aggregate`).
    forget: Callable[[Connection, str, str], None] | None = None


@dataclass
class ProjectorStatus:
    """Where a projector stands. `position` is the last event (`aggregate_events.id`) it
    applied, `lag` the events of its types not applied yet; `faulted` after 5 consecutive
    failures, until a rebuild."""

    name: str
    status: str
    position: int
    lag: int
    consecutive_failures: int
    last_error: str | None
    updated_at: datetime | None
    rebuilt_at: datetime | None


class UnknownProjector(KeyError):
    """No projector of that name is registered."""


def project_batch(engine: Engine, projector: AsyncProjector, limit: int = BATCH) -> int:
    """Apply the next events (up to `limit`) and move the checkpoint past them, in one
    transaction that holds the checkpoint's lock; how many were applied (0 when faulted)."""
    if not _may_have_work(engine, projector):
        return 0
    with _checkpoint_locked(engine, projector.name) as (connection, checkpoint):
        if checkpoint["status"] == FAULTED:
            return 0
        query = (
            select(AGGREGATE_EVENTS)
            .where(
                AGGREGATE_EVENTS.c.id > checkpoint["position"],
                AGGREGATE_EVENTS.c.aggregate_type.in_(sorted(projector.aggregate_types)),
            )
            .order_by(AGGREGATE_EVENTS.c.id)
            .limit(limit)
        )
        rows = list(connection.execute(query).mappings())
        keys = data_keys.keys_by_id(connection, (row["data"] for row in rows))
        events = [_stored(row, data_keys.open_value(row["data"], keys, SHREDDED)) for row in rows]
        for event in events:
            if not is_shredded(event.data):
                projector.apply(connection, event)
        if events or checkpoint["consecutive_failures"]:
            connection.execute(
                update(PROJECTOR_CHECKPOINTS)
                .where(PROJECTOR_CHECKPOINTS.c.name == projector.name)
                .values(
                    position=events[-1].position if events else checkpoint["position"],
                    consecutive_failures=0,
                    last_error=None,
                    updated_at=datetime.now(UTC),
                )
            )
        return len(events)


def record_failure(engine: Engine, name: str, error: str) -> str:
    """Count one more consecutive failure; the projector's status after it."""
    with _checkpoint_locked(engine, name) as (connection, checkpoint):
        failures = checkpoint["consecutive_failures"] + 1
        status = FAULTED if failures >= FAULT_AFTER else checkpoint["status"]
        connection.execute(
            update(PROJECTOR_CHECKPOINTS)
            .where(PROJECTOR_CHECKPOINTS.c.name == name)
            .values(
                consecutive_failures=failures,
                last_error=error[:2000],
                status=status,
                updated_at=datetime.now(UTC),
            )
        )
        return status


def rebuild(engine: Engine, projector: AsyncProjector) -> None:
    """Empty the projector's table and start it from the first event, running again."""
    with _checkpoint_locked(engine, projector.name) as (connection, _):
        connection.execute(projector.table.delete())
        now = datetime.now(UTC)
        connection.execute(
            update(PROJECTOR_CHECKPOINTS)
            .where(PROJECTOR_CHECKPOINTS.c.name == projector.name)
            .values(
                position=0,
                status=RUNNING,
                consecutive_failures=0,
                last_error=None,
                updated_at=now,
                rebuilt_at=now,
            )
        )


def forget_aggregate(
    connection: Connection, projector: AsyncProjector, aggregate_type: str, aggregate_id: str
) -> None:
    """Inside an erasure's transaction: what `projector` holds of the aggregate goes, by its
    `forget`, or by emptying its table and starting it from the first event (the rebuild then
    passes the shredded events over). The checkpoint's lock is taken first: a batch that read
    the events before the erasure commits before this runs, one after finds them shredded."""
    if aggregate_type not in projector.aggregate_types:
        return
    _lock_checkpoint(connection, projector.name)
    if projector.forget is not None:
        projector.forget(connection, aggregate_type, aggregate_id)
        return
    connection.execute(projector.table.delete())
    connection.execute(
        update(PROJECTOR_CHECKPOINTS)
        .where(PROJECTOR_CHECKPOINTS.c.name == projector.name)
        .values(position=0, updated_at=datetime.now(UTC))
    )


def status(engine: Engine, projector: AsyncProjector) -> ProjectorStatus:
    with engine.connect() as connection:
        row = _checkpoint(connection, projector.name)
        position = row["position"] if row else 0
        lag = connection.execute(
            select(func.count())
            .select_from(AGGREGATE_EVENTS)
            .where(
                AGGREGATE_EVENTS.c.id > position,
                AGGREGATE_EVENTS.c.aggregate_type.in_(sorted(projector.aggregate_types)),
            )
        ).scalar_one()
    if row is None:
        return ProjectorStatus(projector.name, RUNNING, 0, lag, 0, None, None, None)
    return ProjectorStatus(
        name=projector.name,
        status=row["status"],
        position=position,
        lag=lag,
        consecutive_failures=row["consecutive_failures"],
        last_error=row["last_error"],
        updated_at=row["updated_at"],
        rebuilt_at=row["rebuilt_at"],
    )


def rows(
    engine: Engine,
    projector: AsyncProjector,
    filters: Mapping[str, str],
    *,
    after: str | None = None,
    limit: int = 50,
) -> tuple[list[dict[str, Any]], str | None]:
    """The projector's rows matching `filters` (its declared columns), by primary key; pass
    the returned cursor back as `after`. KeyError names a filter the projector does not have."""
    unknown = sorted(set(filters) - set(projector.filters))
    if unknown:
        raise KeyError(", ".join(unknown))
    [key] = projector.table.primary_key.columns
    limit = max(1, min(limit, MAX_ROWS_PAGE))
    query = select(projector.table).order_by(key).limit(limit + 1)
    for name, value in filters.items():
        query = query.where(projector.filters[name] == value)
    if after is not None:
        query = query.where(key > after)
    with engine.connect() as connection:
        found = [dict(row) for row in connection.execute(query).mappings()]
    if len(found) <= limit:
        return found, None
    return found[:limit], str(found[limit - 1][key.name])


def _may_have_work(engine: Engine, projector: AsyncProjector) -> bool:
    """False when a plain read shows nothing to do: the projector is faulted, or healthy with
    no event past its position. Runners poll twice a second, and taking the checkpoint's lock
    for nothing would hold SQLite's one write lock against every other writer each time."""
    with engine.connect() as connection:
        checkpoint = _checkpoint(connection, projector.name)
        if checkpoint is None:
            return True
        if checkpoint["status"] == FAULTED:
            return False
        # A failure count to clear is work too, even with no new event.
        if checkpoint["consecutive_failures"]:
            return True
        newer = {"position": checkpoint["position"], "types": sorted(projector.aggregate_types)}
        return connection.execute(_NEWER_EVENT, newer).first() is not None


# The idle poll's statements, built once: building them was most of a poll's CPU (a poll 0.31 ms
# on SQLite, was 0.78; 0.84 on PostgreSQL, was 1.43), twice a second for each projector whether
# or not any aggregate is used.
_CHECKPOINT = select(PROJECTOR_CHECKPOINTS).where(PROJECTOR_CHECKPOINTS.c.name == bindparam("name"))
_NEWER_EVENT = (
    select(AGGREGATE_EVENTS.c.id)
    .where(
        AGGREGATE_EVENTS.c.id > bindparam("position"),
        AGGREGATE_EVENTS.c.aggregate_type.in_(bindparam("types", expanding=True)),
    )
    .limit(1)
)


def _checkpoint(connection: Connection, name: str) -> Any:
    return connection.execute(_CHECKPOINT, {"name": name}).mappings().first()


@contextmanager
def _checkpoint_locked(engine: Engine, name: str) -> Iterator[tuple[Connection, Any]]:
    """A transaction holding the projector's checkpoint row (made if missing) for writing:
    `FOR UPDATE` on PostgreSQL; on SQLite the write lock from the start (`BEGIN IMMEDIATE`),
    so no two batches of one projector ever interleave."""
    with engine.begin() as connection:
        if connection.dialect.name == "sqlite":
            connection.exec_driver_sql("BEGIN IMMEDIATE")
        yield connection, _lock_checkpoint(connection, name)


def _lock_checkpoint(connection: Connection, name: str) -> Any:
    """The projector's checkpoint row (made if missing), held for writing until the
    transaction ends (`FOR UPDATE` on PostgreSQL; SQLite's one writer holds it already)."""
    dialect = connection.dialect.name
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    connection.execute(
        insert(PROJECTOR_CHECKPOINTS)
        .values(
            name=name,
            position=0,
            status=RUNNING,
            consecutive_failures=0,
            updated_at=datetime.now(UTC),
        )
        .on_conflict_do_nothing(index_elements=["name"])
    )
    query = select(PROJECTOR_CHECKPOINTS).where(PROJECTOR_CHECKPOINTS.c.name == name)
    if dialect == "postgresql":
        query = query.with_for_update()
    return connection.execute(query).mappings().one()


def _stored(row: Any, data: dict[str, Any]) -> StoredEvent:
    return StoredEvent(
        position=row["id"],
        aggregate_type=row["aggregate_type"],
        aggregate_id=row["aggregate_id"],
        seq=row["seq"],
        type=row["type"],
        data=data,
        recorded_at=row["recorded_at"],
    )
