"""One destination's recent activity for the dashboard's health strip: items sent and failed per
minute over the last hour or so, and the queue it still holds (how many, and the oldest's age).

The database counts them per status and minute (a busy destination ends hundreds of thousands of
items an hour: only the counts travel); queued items are counted by status and `created_at`.
The minutes are filled in here, so a quiet minute is a zero rather than a gap.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from durable_outbox_temporal.contract.item import ItemStatus
from sqlalchemy import ColumnElement, Engine, Integer, cast, func, select

from readmodel.models import ITEMS

MAX_MINUTES = 24 * 60


@dataclass(frozen=True)
class MinuteActivity:
    """Items of the destination that ended sent or failed within one minute starting `at`."""

    at: datetime
    sent: int
    failed: int


@dataclass(frozen=True)
class DestinationActivity:
    minutes: list[MinuteActivity]
    queued: int
    oldest_queued_age_s: float | None


def _minute(moment: datetime) -> datetime:
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.replace(second=0, microsecond=0)


def _minutes_since(engine: Engine, first: datetime) -> ColumnElement[Any]:
    """Whole minutes from `first` (a whole minute) to an item's `finished_at`, computed by the
    database; never negative, as only items finished since `first` are counted."""
    start = int(first.timestamp())
    if engine.dialect.name == "postgresql":
        return func.floor((func.extract("epoch", ITEMS.c.finished_at) - start) / 60)
    # SQLite keeps times as text; strftime('%s') reads them as whole seconds since the epoch,
    # and integer division truncates (a floor here: the difference is not negative).
    seconds = cast(func.strftime("%s", ITEMS.c.finished_at), Integer) - start
    return seconds // 60


def destination_activity(
    engine: Engine, destination: str, minutes: int, now: datetime | None = None
) -> DestinationActivity:
    """The last `minutes` whole minutes (the current one included), oldest first."""
    minutes = max(1, min(minutes, MAX_MINUTES))
    now = now or datetime.now(UTC)
    first = _minute(now) - timedelta(minutes=minutes - 1)
    bucket = _minutes_since(engine, first)
    finished = (
        select(ITEMS.c.status, bucket, func.count())
        .where(
            ITEMS.c.destination == destination,
            ITEMS.c.status.in_([ItemStatus.SENT, ItemStatus.FAILED]),
            ITEMS.c.finished_at >= first,
        )
        .group_by(ITEMS.c.status, bucket)
    )
    queued = select(func.count(), func.min(ITEMS.c.created_at)).where(
        ITEMS.c.destination == destination, ITEMS.c.status == ItemStatus.QUEUED
    )
    sent = [0] * minutes
    failed = [0] * minutes
    with engine.connect() as connection:
        for status, index, count in connection.execute(finished):
            if index is not None and 0 <= int(index) < minutes:
                (sent if status == ItemStatus.SENT else failed)[int(index)] += int(count)
        count, oldest = connection.execute(queued).one()
    age = None
    if oldest is not None:
        if oldest.tzinfo is None:
            oldest = oldest.replace(tzinfo=UTC)
        age = max(0.0, (now - oldest).total_seconds())
    return DestinationActivity(
        minutes=[
            MinuteActivity(at=first + timedelta(minutes=n), sent=sent[n], failed=failed[n])
            for n in range(minutes)
        ],
        queued=int(count or 0),
        oldest_queued_age_s=age,
    )
