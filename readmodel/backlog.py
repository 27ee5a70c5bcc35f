"""The backlog as alerting sees it: a few aggregate queries over the read model.

Items waiting, in flight and dead-lettered per outbox and destination (with the oldest waiting
one), the ordering lanes that hold items, and running totals of items sent and failed. Each query
reads an index range proportional to the backlog, or to the events since the last reading, never
the whole history, so a scrape costs the same after a million deliveries as after ten.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from durable_outbox_temporal.contract.item import ItemEventType, ItemStatus
from durable_outbox_temporal.contract.lane import LaneStatus
from sqlalchemy import Connection, Engine, Select, and_, func, or_, select

from readmodel.models import EVENTS, ITEMS, LANES

# Items the outbox still owes someone: waiting, handed to the provider, or failed (dead letters,
# until redriven). Sent and cancelled items are history, counted by `DeliveryTally` instead.
BACKLOG_STATUSES = (ItemStatus.QUEUED, ItemStatus.SENDING, ItemStatus.FAILED)
# Lanes holding items; an idle lane holds none.
BUSY_LANE_STATUSES = (LaneStatus.RUNNING, LaneStatus.HALTED)

OutboxDestination = tuple[str, str]


@dataclass(frozen=True)
class ItemBacklog:
    """How many items of one outbox and destination are in one backlog status, and since when."""

    outbox: str
    destination: str
    status: ItemStatus
    items: int
    oldest_created_at: datetime


@dataclass(frozen=True)
class LaneBacklog:
    """The lanes of one outbox in one busy status: how many, and the items they hold."""

    outbox: str
    status: LaneStatus
    lanes: int
    items: int
    longest: int


@dataclass(frozen=True)
class Backlog:
    """One reading of the backlog, and the sent and failed totals as of that reading."""

    items: list[ItemBacklog]
    lanes: list[LaneBacklog]
    sent: Mapping[OutboxDestination, int]
    failed: Mapping[OutboxDestination, int]


@dataclass
class DeliveryTally:
    """Items sent and failed per outbox and destination, counted from the append-only events.

    Events are only ever appended, so each reading counts just the events after the previous
    one and adds them to the totals: the totals only grow (Prometheus counters), and a reading
    costs the events since the last one, not the whole history. The first reading counts
    everything already there.

    The position is kept per outbox because that is the order ids become visible in: on
    PostgreSQL a transaction takes its ids when it inserts and shows them when it commits, and
    the projection serialises writers per outbox only (`store.apply_projections`), so a smaller
    id of another outbox may still appear after a larger one was read.
    """

    cursors: dict[str, int] = field(default_factory=dict)
    sent: Counter[OutboxDestination] = field(default_factory=Counter)
    failed: Counter[OutboxDestination] = field(default_factory=Counter)

    def advance(self, connection: Connection) -> None:
        """Add the sent and failed events written since the last call; all or nothing."""
        # Each outbox's newest id first: every smaller id of that outbox is committed by then,
        # so counting up to it (and no further) never skips an event that commits later.
        newest = {
            outbox: last_id
            for outbox, last_id in connection.execute(newest_event_per_outbox())
            if last_id > self.cursors.get(outbox, 0)
        }
        if not newest:
            return
        ranges = [
            and_(
                EVENTS.c.outbox == outbox,
                EVENTS.c.id > self.cursors.get(outbox, 0),
                EVENTS.c.id <= last_id,
            )
            for outbox, last_id in newest.items()
        ]
        query = (
            select(EVENTS.c.outbox, ITEMS.c.destination, EVENTS.c.type, func.count())
            .select_from(EVENTS.join(ITEMS, ITEMS.c.id == EVENTS.c.item_id))
            .where(EVENTS.c.type.in_([ItemEventType.SENT, ItemEventType.FAILED]), or_(*ranges))
            .group_by(EVENTS.c.outbox, ITEMS.c.destination, EVENTS.c.type)
        )
        sent: Counter[OutboxDestination] = Counter()
        failed: Counter[OutboxDestination] = Counter()
        for outbox, destination, event_type, count in connection.execute(query):
            totals = sent if event_type == ItemEventType.SENT else failed
            totals[(outbox, destination)] += count
        # Only now, with every query answered: a failed reading leaves the tally as it was.
        self.sent.update(sent)
        self.failed.update(failed)
        self.cursors.update(newest)


def newest_event_per_outbox() -> Select[str, int]:
    """Each outbox that has events, with the id of its newest.

    Walks the (outbox, id) index downwards, one probe per outbox: the last entry below the
    previous outbox is the next outbox's newest event. DISTINCT or GROUP BY would read every
    event, and `max(id) WHERE outbox = ?` lets PostgreSQL walk the primary key backwards
    through all newer events of other outboxes instead (seen: 300k rows for a quiet outbox).
    """

    def last_entry(column: Any, below: Any = None) -> Any:
        query = select(column).order_by(EVENTS.c.outbox.desc(), EVENTS.c.id.desc()).limit(1)
        return (query if below is None else query.where(EVENTS.c.outbox < below)).scalar_subquery()

    newest = select(
        last_entry(EVENTS.c.outbox).label("outbox"), last_entry(EVENTS.c.id).label("id")
    ).cte("newest", recursive=True)
    newest = newest.union_all(
        select(
            last_entry(EVENTS.c.outbox, newest.c.outbox), last_entry(EVENTS.c.id, newest.c.outbox)
        ).where(newest.c.outbox.is_not(None))
    )
    return select(newest.c.outbox, newest.c.id).where(newest.c.outbox.is_not(None))


def item_backlog_query() -> Select[str, str, str, int, datetime]:
    """Items per outbox, destination and backlog status, and the oldest one's creation time:
    one range of `ix_outbox_items_status_outbox_destination`, already in group order."""
    return (
        select(
            ITEMS.c.outbox,
            ITEMS.c.destination,
            ITEMS.c.status,
            func.count(),
            func.min(ITEMS.c.created_at),
        )
        .where(ITEMS.c.status.in_(BACKLOG_STATUSES))
        .group_by(ITEMS.c.status, ITEMS.c.outbox, ITEMS.c.destination)
    )


def item_backlog(connection: Connection) -> list[ItemBacklog]:
    """The items owed per outbox, destination and status, with the oldest one's creation time."""
    return [
        ItemBacklog(outbox, destination, ItemStatus(status), count, oldest)
        for outbox, destination, status, count, oldest in connection.execute(item_backlog_query())
    ]


def lane_backlog_query() -> Select[str, str, int, int, int]:
    """Busy lanes per outbox and status, their items and the longest: one range of
    `ix_outbox_lanes_status_outbox` (idle lanes, which can be many, are not read)."""
    return (
        select(
            LANES.c.outbox,
            LANES.c.status,
            func.count(),
            func.sum(LANES.c.length),
            func.max(LANES.c.length),
        )
        .where(LANES.c.status.in_(BUSY_LANE_STATUSES))
        .group_by(LANES.c.status, LANES.c.outbox)
    )


def lane_backlog(connection: Connection) -> list[LaneBacklog]:
    """Busy lanes per outbox and status: how many, the items in them, the longest one."""
    return [
        LaneBacklog(outbox, LaneStatus(status), lanes, int(items), int(longest))
        for outbox, status, lanes, items, longest in connection.execute(lane_backlog_query())
    ]


def read_backlog(engine: Engine, tally: DeliveryTally) -> Backlog:
    """One reading: the backlog now, and `tally` advanced to now (on one connection).

    The statements are not one snapshot (SQLite's driver begins no transaction for reads, and
    PostgreSQL reads committed), so the counters are read first: an item a reading counts as
    sent is never still queued in the same reading, only the other way round for a moment."""
    with engine.connect() as connection:
        tally.advance(connection)
        items = item_backlog(connection)
        lanes = lane_backlog(connection)
    # Copies: the reading is handed to another thread while the tally goes on counting.
    return Backlog(items=items, lanes=lanes, sent=dict(tally.sent), failed=dict(tally.failed))


# The most queued items `queued_ahead` counts: a longer queue reads as "at least this many".
AHEAD_COUNTED = 10_000


def queued_ahead(connection: Connection, destination: str, created_at: datetime) -> int:
    """Queued items of `destination` (any outbox: they share its rate) created before
    `created_at`, counted up to `AHEAD_COUNTED`: a range of the status index, bounded."""
    ahead = (
        select(ITEMS.c.id)
        .where(
            ITEMS.c.status == ItemStatus.QUEUED,
            ITEMS.c.destination == destination,
            ITEMS.c.created_at < created_at,
        )
        .limit(AHEAD_COUNTED)
        .subquery()
    )
    return int(connection.execute(select(func.count()).select_from(ahead)).scalar_one())
