"""One destination's recent activity for the dashboard's health strip: items sent and failed per
minute over the last hour or so, and the queue it still holds (how many, and the oldest's age).

Reads only what the existing indexes give: finished items of the destination by status and
`finished_at`, queued items by status and `created_at`. The minutes are filled in here, so a
quiet minute is a zero rather than a gap.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import Engine, func, select

from contract.item import ItemStatus
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


def destination_activity(
    engine: Engine, destination: str, minutes: int, now: datetime | None = None
) -> DestinationActivity:
    """The last `minutes` whole minutes (the current one included), oldest first."""
    minutes = max(1, min(minutes, MAX_MINUTES))
    now = now or datetime.now(UTC)
    first = _minute(now) - timedelta(minutes=minutes - 1)
    finished = select(ITEMS.c.status, ITEMS.c.finished_at).where(
        ITEMS.c.destination == destination,
        ITEMS.c.status.in_([ItemStatus.SENT, ItemStatus.FAILED]),
        ITEMS.c.finished_at >= first,
    )
    queued = select(func.count(), func.min(ITEMS.c.created_at)).where(
        ITEMS.c.destination == destination, ITEMS.c.status == ItemStatus.QUEUED
    )
    sent = [0] * minutes
    failed = [0] * minutes
    with engine.connect() as connection:
        for status, finished_at in connection.execute(finished):
            if finished_at is None:
                continue
            index = int((_minute(finished_at) - first).total_seconds() // 60)
            if 0 <= index < minutes:
                (sent if status == ItemStatus.SENT else failed)[index] += 1
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
