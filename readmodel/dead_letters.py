"""The dead-letter view: an outbox's failed items, newest failure first, and discards.

A discard marks one failure (the item's `last_event_seq` when it was discarded) as given up on:
the item stays in the read model, with its events, for audit, and leaves the default list. If
the item is redriven later and fails again, that newer failure is a dead letter of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from durable_outbox_temporal.contract.dead_letters import DeadLetterFilter
from durable_outbox_temporal.contract.item import ItemStatus
from sqlalchemy import Engine, and_, or_, select
from sqlalchemy.dialects import postgresql, sqlite

from readmodel.models import DISCARDS, ITEMS, ItemRecord, read_view
from readmodel.store import MAX_PAGE, decode_cursor, encode_cursor


@dataclass
class Discard:
    reason: str
    discarded_at: datetime


@dataclass
class DeadLetter:
    record: ItemRecord
    # Set when an operator discarded this failure.
    discard: Discard | None = None


def list_dead_letters(
    engine: Engine,
    outbox: str,
    which: DeadLetterFilter,
    *,
    include_discarded: bool = False,
    failed_before: datetime | None = None,
    cursor: str | None = None,
    limit: int = 50,
) -> tuple[list[DeadLetter], str | None]:
    """A page of the outbox's failed items, newest failure first, and the next cursor.

    `failed_from` is inclusive and `failed_to` (like `failed_before`) exclusive. Keyset-paged
    on (finished_at, id), so a page stays right while items are redriven out of the list.
    """
    limit = max(1, min(limit, MAX_PAGE))
    discard_matches = and_(
        DISCARDS.c.item_id == ITEMS.c.id, DISCARDS.c.last_event_seq == ITEMS.c.last_event_seq
    )
    conditions: list[Any] = [
        ITEMS.c.outbox == outbox,
        ITEMS.c.status == ItemStatus.FAILED.value,
        ITEMS.c.finished_at.is_not(None),
    ]
    if not include_discarded:
        conditions.append(DISCARDS.c.item_id.is_(None))
    if which.destination is not None:
        conditions.append(ITEMS.c.destination == which.destination)
    if which.error_code is not None:
        conditions.append(ITEMS.c.last_error_code == which.error_code)
    if which.failed_from is not None:
        conditions.append(ITEMS.c.finished_at >= which.failed_from)
    if which.failed_to is not None:
        conditions.append(ITEMS.c.finished_at < which.failed_to)
    if failed_before is not None:
        conditions.append(ITEMS.c.finished_at < failed_before)
    if cursor is not None:
        after_finished, after_id = decode_cursor(cursor)
        conditions.append(
            or_(
                ITEMS.c.finished_at < after_finished,
                and_(ITEMS.c.finished_at == after_finished, ITEMS.c.id < after_id),
            )
        )
    query = (
        select(ITEMS, DISCARDS.c.reason, DISCARDS.c.discarded_at)
        .select_from(ITEMS.outerjoin(DISCARDS, discard_matches))
        .where(*conditions)
        .order_by(ITEMS.c.finished_at.desc(), ITEMS.c.id.desc())
        .limit(limit + 1)
    )
    with engine.connect() as connection:
        rows = list(connection.execute(query).mappings())
    letters = [
        DeadLetter(
            ItemRecord(view=read_view(row), payload=row["payload"]),
            None if row["reason"] is None else Discard(row["reason"], row["discarded_at"]),
        )
        for row in rows[:limit]
    ]
    if len(rows) <= limit:
        return letters, None
    last = letters[-1].record.view
    assert last.finished_at is not None  # selected on it
    return letters, encode_cursor(last.finished_at, last.id)


def discard(
    engine: Engine, outbox: str, item_id: str, last_event_seq: int, reason: str, at: datetime
) -> Discard:
    """Mark the item's failure at `last_event_seq` discarded; a second discard of the same
    failure keeps the first one's reason and time. Returns the discard in force."""
    values = {
        "item_id": item_id,
        "outbox": outbox,
        "last_event_seq": last_event_seq,
        "reason": reason,
        "discarded_at": at,
    }
    with engine.begin() as connection:
        insert = (
            postgresql.insert(DISCARDS)
            if connection.dialect.name == "postgresql"
            else sqlite.insert(DISCARDS)
        )
        # A discard of a newer failure replaces the older one; the same failure keeps its own.
        connection.execute(
            insert.values(values).on_conflict_do_update(
                index_elements=[DISCARDS.c.item_id],
                set_={name: values[name] for name in values if name != "item_id"},
                where=DISCARDS.c.last_event_seq < last_event_seq,
            )
        )
        row = connection.execute(
            select(DISCARDS.c.reason, DISCARDS.c.discarded_at).where(DISCARDS.c.item_id == item_id)
        ).one()
    return Discard(row.reason, row.discarded_at)
