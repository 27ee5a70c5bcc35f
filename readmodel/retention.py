"""Retention in the read model: ended items' payloads and attempt bodies pruned, then their rows,
a page at a time, the key memory kept (`outbox_keys`).

Only ended items are touched (`sent`, `failed`, `cancelled`, `superseded`), and each statement
says so again, so an item redriven between the page's read and its write is left alone (the
redrive's claim, `readmodel.attempts.claim_redrive`, refuses a pruned item in one statement
likewise). A page is one transaction; PostgreSQL locks its rows for it. Pages take the oldest
first and find their items by what is not pruned yet, so a page retried, or a run stopped and
started again, goes on where it was.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from durable_outbox_temporal.contract.item import ItemStatus
from durable_outbox_temporal.contract.retention import RetentionRule
from sqlalchemy import ColumnElement, Connection, Engine, Select, and_, delete, select, update
from sqlalchemy.dialects import postgresql, sqlite

from readmodel.models import (
    DISCARDS,
    EVENTS,
    ITEM_ATTEMPTS,
    ITEM_ERASURES,
    ITEM_KEYS,
    ITEMS,
    PAYLOAD_BLOBS,
)

ENDED = [status.value for status in ItemStatus if status.is_final]


def prune_payloads(
    engine: Engine,
    rule: RetentionRule,
    ended_before: datetime,
    limit: int,
    now: datetime | None = None,
) -> int:
    """Remove the payload, attempt headers and bodies and claim-check blobs of up to `limit`
    ended items of the rule that ended before `ended_before`, oldest first; how many."""
    now = now or datetime.now(UTC)
    query = _selected(
        select(ITEMS.c.id).where(ITEMS.c.payload_pruned_at.is_(None)), rule, ended_before, limit
    )
    with engine.begin() as connection:
        ids = _locked_ids(connection, query)
        if not ids:
            return 0
        connection.execute(
            update(ITEMS)
            .where(ITEMS.c.id.in_(ids), ITEMS.c.status.in_(ENDED))
            .values(payload=None, payload_pruned_at=now)
        )
        connection.execute(
            update(ITEM_ATTEMPTS)
            .where(ITEM_ATTEMPTS.c.item_id.in_(ids))
            .values(request_headers={}, response_headers={}, body=None, body_truncated=False)
        )
        connection.execute(delete(PAYLOAD_BLOBS).where(PAYLOAD_BLOBS.c.workflow_id.in_(ids)))
    return len(ids)


def prune_rows(
    engine: Engine,
    rule: RetentionRule,
    ended_before: datetime,
    limit: int,
    now: datetime | None = None,
) -> int:
    """Delete up to `limit` ended items of the rule that ended before `ended_before` (their
    rows, events, attempts, erasure and discard marks, blobs), oldest first, keeping each key's
    memory; how many."""
    now = now or datetime.now(UTC)
    query = _selected(select(ITEMS.c.id), rule, ended_before, limit)
    with engine.begin() as connection:
        ids = _locked_ids(connection, query)
        if not ids:
            return 0
        remembered = select(
            ITEMS.c.id, ITEMS.c.status, ITEMS.c.payload_hash, ITEMS.c.finished_at
        ).where(ITEMS.c.id.in_(ids), ITEMS.c.status.in_(ENDED))
        keys = [
            {
                "item_id": row.id,
                "status": row.status,
                "payload_hash": row.payload_hash,
                "finished_at": row.finished_at,
                "pruned_at": now,
            }
            for row in connection.execute(remembered)
        ]
        if not keys:
            return 0
        connection.execute(_remember(engine.dialect.name), keys)
        gone = [key["item_id"] for key in keys]
        for table, column in (
            (EVENTS, EVENTS.c.item_id),
            (ITEM_ATTEMPTS, ITEM_ATTEMPTS.c.item_id),
            (ITEM_ERASURES, ITEM_ERASURES.c.item_id),
            (DISCARDS, DISCARDS.c.item_id),
            (PAYLOAD_BLOBS, PAYLOAD_BLOBS.c.workflow_id),
        ):
            connection.execute(delete(table).where(column.in_(gone)))
        connection.execute(delete(ITEMS).where(ITEMS.c.id.in_(gone)))
    return len(gone)


def _selected(
    query: Select[Any], rule: RetentionRule, ended_before: datetime, limit: int
) -> Select[Any]:
    """`query` narrowed to the rule's ended items that ended before the cutoff, oldest first."""
    conditions: list[ColumnElement[bool]] = [
        ITEMS.c.destination == rule.destination,
        ITEMS.c.status.in_(ENDED),
        ITEMS.c.finished_at < ended_before,
    ]
    if rule.outbox is not None:
        conditions.append(ITEMS.c.outbox == rule.outbox)
    elif rule.excluded:
        conditions.append(ITEMS.c.outbox.not_in(rule.excluded))
    return query.where(and_(*conditions)).order_by(ITEMS.c.finished_at, ITEMS.c.id).limit(limit)


def _locked_ids(connection: Connection, query: Select[Any]) -> list[str]:
    if connection.dialect.name == "postgresql":
        # Another run (two workers' schedules never overlap, but a manual run may) skips them.
        query = query.with_for_update(skip_locked=True)
    return list(connection.execute(query).scalars())


def _remember(dialect: str) -> Any:
    """Insert key memories, keeping one already there (a page retried after its commit)."""
    insert_into = postgresql.insert if dialect == "postgresql" else sqlite.insert
    return insert_into(ITEM_KEYS).on_conflict_do_nothing(index_elements=["item_id"])
