"""Bulk mode's routes: which shard count each owner goes by, shared by every sender.

An owner is what places items in a shard (`durable_outbox_temporal.contract.bulk.owner_id`): an
ordering lane, whose items must meet in one shard in order, or an unordered item, whose repeated
hand-over must reach the shard that may hold it already. The first hand-over of an owner records
the count its sender has configured; every later one, from any process, goes by that count
(`claim`, one statement per hand-over). So processes configured with different counts (a
rolling restart that changes `shards`) still send each owner's items to one shard, and a new
count moves only owners first seen after it.

Routes go with what they route: an unordered item's with its row (`readmodel.retention.prune_rows`),
a lane's once the lane has been idle since before retention's cutoff and no hand-over has claimed
it since (`readmodel.retention.prune_idle_lanes`), so an idle key takes the count configured when
it next has items. Why: docs/decisions/shard-routes.md
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta

from durable_outbox_temporal.contract.item import ItemStatus
from durable_outbox_temporal.contract.lane import LaneStatus
from sqlalchemy import ColumnElement, Engine, and_, exists, func, literal, or_, select, union_all
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.sql import Executable

from readmodel.models import BULK_ROUTES, ITEMS, LANES

# Lanes named when a check finds some without a route (the log says how many there are).
NAMED = 5


def claim(
    engine: Engine,
    destination: str,
    owners: Sequence[str],
    shards: int,
    now: datetime | None = None,
) -> dict[str, int]:
    """Each owner's count: the one recorded by its first hand-over, or `shards` for an owner
    handed over for the first time now. Every owner's route is marked claimed now."""
    if not owners:
        return {}
    now = now or datetime.now(UTC)
    # Sorted, so that concurrent claims lock their rows in one order (PostgreSQL); one statement
    # built once and sent with every owner's row (a statement of many VALUES compiled each time
    # took three times as long).
    rows = [
        {"destination": destination, "owner": owner, "shards": shards, "claimed_at": now}
        for owner in sorted(set(owners))
    ]
    with engine.begin() as connection:
        found = connection.execute(_claim_statement(engine.dialect.name), rows)
        return {row.owner: row.shards for row in found}


@functools.cache
def _claim_statement(dialect: str) -> Executable:
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    values = insert(BULK_ROUTES)
    return values.on_conflict_do_update(
        index_elements=[BULK_ROUTES.c.destination, BULK_ROUTES.c.owner],
        set_={"claimed_at": values.excluded.claimed_at},
    ).returning(BULK_ROUTES.c.owner, BULK_ROUTES.c.shards)


def find(engine: Engine, destination: str, owner: str) -> int | None:
    """The count the owner goes by; None for an owner with no route (never handed over through
    the read model, or idle and pruned)."""
    with engine.connect() as connection:
        return connection.execute(
            select(BULK_ROUTES.c.shards).where(
                BULK_ROUTES.c.destination == destination, BULK_ROUTES.c.owner == owner
            )
        ).scalar_one_or_none()


def _held_lanes_unrouted(destination: str) -> ColumnElement[bool]:
    """The destination's lanes that hold items (their row not idle) and have no route."""
    routed = exists().where(
        BULK_ROUTES.c.destination == destination, BULK_ROUTES.c.owner == LANES.c.id
    )
    return and_(
        LANES.c.destination == destination,
        LANES.c.status != LaneStatus.IDLE.value,
        ~routed,
    )


def route_held_lanes(
    engine: Engine, destination: str, shards: int, now: datetime | None = None
) -> int:
    """Give every lane of the destination that holds items (its row not idle) and has no route
    the route `shards`; how many were given one. Only right while `shards` is the count those
    lanes were handed over by (a worker calls it when its count is the running shards')."""
    now = now or datetime.now(UTC)
    insert = postgresql.insert if engine.dialect.name == "postgresql" else sqlite.insert
    lanes = select(
        literal(destination),
        LANES.c.id,
        literal(shards),
        literal(now, BULK_ROUTES.c.claimed_at.type),
    ).where(_held_lanes_unrouted(destination))
    statement = (
        insert(BULK_ROUTES)
        .from_select(["destination", "owner", "shards", "claimed_at"], lanes)
        .on_conflict_do_nothing(index_elements=[BULK_ROUTES.c.destination, BULK_ROUTES.c.owner])
        .returning(BULK_ROUTES.c.owner)
    )
    with engine.begin() as connection:
        return len(connection.execute(statement).all())


def unrouted_held(
    engine: Engine, destination: str, listening_since: datetime
) -> tuple[int, list[str]]:
    """How many owners of the destination are held with no count recorded, and the first few's
    ids: lanes holding items with no route (another count would send the key's new items
    elsewhere), and unordered items handed over before items recorded their count (`shards`
    in their row; their cancels and reports go by the configured count), queued, sending, or
    sent since `listening_since` (listening for delivery reports)."""
    lanes = select(LANES.c.id).where(_held_lanes_unrouted(destination))
    items = select(ITEMS.c.id).where(
        ITEMS.c.destination == destination,
        ITEMS.c.ordering_key.is_(None),
        ITEMS.c.shards.is_(None),
        or_(
            ITEMS.c.status.in_([ItemStatus.QUEUED.value, ItemStatus.SENDING.value]),
            and_(
                ITEMS.c.status == ItemStatus.SENT.value,
                ITEMS.c.finished_at >= listening_since,
            ),
        ),
    )
    held = union_all(lanes, items).subquery()
    with engine.connect() as connection:
        ids = list(connection.execute(select(held.c.id).order_by(held.c.id).limit(NAMED)).scalars())
        if len(ids) < NAMED:
            return len(ids), ids
        count = connection.execute(select(func.count()).select_from(held)).scalar_one()
    return count, ids


async def unrouted_owners(
    engine: Engine, destination: str, report_window_s: float
) -> tuple[int, list[str]]:
    """`unrouted_held`, for a destination whose sent items listen `report_window_s` for
    reports: what `durable_outbox_temporal.shards.shard_count_conflicts` asks the API and the
    worker."""
    since = datetime.now(UTC) - timedelta(seconds=report_window_s)
    return await asyncio.to_thread(unrouted_held, engine, destination, since)


class ReadModelRoutes:
    """`durable_outbox_temporal.shards.Routes` on the read model: what the API, the relay and
    the worker's enqueues give their `OutboxClient`."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    async def claim(
        self, destination: str, owners: Sequence[str], shards: int
    ) -> Mapping[str, int]:
        return await asyncio.to_thread(claim, self._engine, destination, owners, shards)

    async def find(self, destination: str, owner: str) -> int | None:
        return await asyncio.to_thread(find, self._engine, destination, owner)
