"""A destination's recent activity (the dashboard's health strip), counted by the database per
status and minute, on SQLite and on PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine, insert

from readmodel.activity import destination_activity
from readmodel.models import ITEMS

NOW = datetime(2026, 11, 27, 2, 30, 40, tzinfo=UTC)


def row(n: int, destination: str, status: str, at: datetime) -> dict[str, Any]:
    return {
        "id": f"outbox/o/k{n}",
        "outbox": "o",
        "key": f"k{n}",
        "destination": destination,
        "status": status,
        "created_at": at - timedelta(seconds=5),
        "updated_at": at,
        "finished_at": None if status == "queued" else at,
        "attempts": 1,
        "max_attempts": 8,
        "poll_count": 0,
        "recipients": [],
        "last_event_seq": 1,
    }


def test_sent_and_failed_per_minute_and_the_queue(engine: Engine) -> None:
    minute = NOW.replace(second=0)
    rows = [
        row(1, "hook", "sent", minute + timedelta(seconds=1)),  # this minute
        row(2, "hook", "sent", minute + timedelta(seconds=39)),  # this minute
        row(3, "hook", "failed", minute - timedelta(seconds=1)),  # the one before
        row(4, "hook", "sent", minute - timedelta(minutes=2)),  # first of the three
        row(5, "hook", "sent", minute - timedelta(minutes=2, seconds=1)),  # before them
        row(6, "other", "sent", minute),  # another destination
        row(7, "hook", "queued", NOW - timedelta(seconds=95)),
        row(8, "hook", "queued", NOW - timedelta(seconds=10)),
        row(9, "hook", "cancelled", minute),  # neither sent nor failed
    ]
    with engine.begin() as connection:
        connection.execute(insert(ITEMS), rows)

    activity = destination_activity(engine, "hook", 3, NOW)

    assert [(m.at, m.sent, m.failed) for m in activity.minutes] == [
        (minute - timedelta(minutes=2), 1, 0),
        (minute - timedelta(minutes=1), 0, 1),
        (minute, 2, 0),
    ]
    assert activity.queued == 2 and activity.oldest_queued_age_s is not None
    assert round(activity.oldest_queued_age_s) == 100  # created 5 s before its 95 s
    assert destination_activity(engine, "nobody", 3, NOW).queued == 0
