"""Reads and idempotent writes of the read model.

A projection may be retried, replayed, or (rarely) overtaken by a newer one for the same item, so
every write is conditional: events are unique per (item, seq) and the item row only moves forward
in `version` (the newest event seq it reflects).
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, NamedTuple

from durable_outbox_temporal.contract.item import ItemProjection, ItemStatus
from sqlalchemy import Engine, Executable, and_, bindparam, func, or_, select, text, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import RowMapping
from sqlalchemy.sql.elements import BindParameter

from readmodel.models import (
    EVENTS,
    ITEM_ERASURES,
    ITEM_KEYS,
    ITEMS,
    EventRecord,
    ItemRecord,
    read_event,
    read_view,
)

MAX_PAGE = 500

# What an upsert overwrites: everything but the key (the payload is merged separately) and what
# retention alone writes.
ITEM_COLUMNS = tuple(
    column.name for column in ITEMS.c if column.name not in ("id", "payload", "payload_pruned_at")
)


class InvalidCursor(ValueError):
    """A list cursor that this service did not issue."""


def apply_projection(engine: Engine, projection: ItemProjection) -> None:
    """Write one item's events and newest view in one transaction; re-applying changes nothing."""
    apply_projections(engine, [projection])


def apply_projections(engine: Engine, projections: Sequence[ItemProjection]) -> None:
    """Write a batch of projections (any items, any order, repeats allowed) in one transaction.

    Each statement runs once per batch with the rows as executemany parameters: a transition
    costs a share of a commit rather than a commit, which is what lets many workflows project
    concurrently.
    """
    if not projections:
        return
    is_postgres = engine.dialect.name == "postgresql"
    insert_events, upsert_items, fill_payload = _projection_statements(engine.dialect.name)
    events: dict[tuple[str, int], dict[str, Any]] = {}
    rows: dict[str, dict[str, Any]] = {}
    payloads: dict[str, Any] = {}
    for projection in projections:
        view = projection.view
        for event in projection.events:
            events[(view.id, event.seq)] = {
                **field_values(event),
                "item_id": view.id,
                "outbox": view.outbox,
            }
        if projection.payload is not None:
            payloads.setdefault(view.id, projection.payload)
        # One row per item: the newest version wins, as it would across separate statements,
        # and the older ones need not be written at all.
        current = rows.get(view.id)
        if current is None or current["last_event_seq"] < view.last_event_seq:
            rows[view.id] = _item_row(projection)
    for item_id, row in rows.items():
        row["payload"] = payloads.get(item_id)
    with engine.begin() as connection:
        if events:
            if is_postgres:
                # A live tailer reads `id > last_seen`. PostgreSQL allocates sequence values at
                # insert time but makes them visible at commit, so two writers could commit ids
                # out of order and the tailer would skip the smaller one. Taking these per-outbox
                # locks first (sorted, so two writers never wait on each other in a cycle) means
                # that, within an outbox, one transaction allocates and commits its ids before
                # the next allocates any. SQLite serialises all writers already.
                for outbox in sorted({row["outbox"] for row in events.values()}):
                    connection.execute(
                        text("SELECT pg_advisory_xact_lock(hashtext(:outbox))"), {"outbox": outbox}
                    )
            ordered = sorted(events.values(), key=lambda row: (row["item_id"], row["seq"]))
            connection.execute(insert_events, ordered)
        connection.execute(upsert_items, list(rows.values()))
        if payloads:
            # Only the first projection of a run carries the payload; if it arrives after a newer
            # one (a late retry), the version check above skipped it, so fill the payload here.
            connection.execute(
                fill_payload, [{"item_id": k, "item_payload": v} for k, v in payloads.items()]
            )


@functools.cache
def _projection_statements(dialect: str) -> tuple[Executable, Executable, Executable]:
    """The projection's three statements, built once: the rows go in as executemany parameters,
    so SQLAlchemy compiles each statement once per process instead of once per batch."""
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    insert_events = insert(EVENTS).on_conflict_do_nothing(index_elements=["item_id", "seq"])
    upsert = insert(ITEMS)
    updates: dict[str, Any] = {name: upsert.excluded[name] for name in ITEM_COLUMNS}
    updates["payload"] = func.coalesce(upsert.excluded.payload, ITEMS.c.payload)
    upsert_items = upsert.on_conflict_do_update(
        index_elements=["id"],
        set_=updates,
        where=ITEMS.c.last_event_seq < upsert.excluded.last_event_seq,
    )
    # Never an erased or pruned item's (`readmodel/erasure.py`, `readmodel/retention.py`): a
    # late projection carrying the payload would bring it back.
    fill_payload = (
        update(ITEMS)
        .where(
            ITEMS.c.id == bindparam("item_id"),
            ITEMS.c.payload.is_(None),
            ITEMS.c.payload_pruned_at.is_(None),
            ~select(ITEM_ERASURES.c.item_id).where(ITEM_ERASURES.c.item_id == ITEMS.c.id).exists(),
        )
        .values(payload=bindparam("item_payload"))
    )
    return insert_events, upsert_items, fill_payload


def field_values(instance: Any) -> dict[str, Any]:
    """A dataclass's fields by name, each value as it is: `dataclasses.asdict` copies every value
    (a datetime through `copy.deepcopy`), which cost ten times the rest of a projection's row,
    and the columns take the values as they are (an item's recipients as objects too)."""
    cls: type = type(instance)
    return {field.name: getattr(instance, field.name) for field in _fields(cls)}


@functools.cache
def _fields(cls: type) -> tuple[dataclasses.Field[Any], ...]:
    return dataclasses.fields(cls)


def _item_row(projection: ItemProjection) -> dict[str, Any]:
    view = projection.view
    created_at = view.created_at or projection.enqueued_at
    if created_at is None and projection.events:
        created_at = min(event.at for event in projection.events)
    if created_at is None:
        raise ValueError(f"projection of {view.id!r} has no creation time and no events")
    return {**field_values(view), "created_at": created_at, "payload": projection.payload}


def get_item(engine: Engine, item_id: str) -> ItemRecord | None:
    """The item's record, or None if it was never projected."""
    with engine.connect() as connection:
        row = connection.execute(select(ITEMS).where(ITEMS.c.id == item_id)).mappings().first()
    return None if row is None else _item_record(row)


class RememberedKey(NamedTuple):
    """What is left of an item whose row retention deleted: its final status and the digest
    of its request, enough to answer a repeat of its key without sending it again."""

    status: ItemStatus
    payload_hash: str | None


def item_or_remembered_key(engine: Engine, item_id: str) -> ItemRecord | RememberedKey | None:
    """The item's record; else, if retention deleted its row, its key memory; else None. One
    connection for both: a new key (the common enqueue) asks both."""
    by_id, remembered = _key_lookup_statements()
    with engine.connect() as connection:
        row = connection.execute(by_id, {"item_id": item_id}).mappings().first()
        if row is not None:
            return _item_record(row)
        kept = connection.execute(remembered, {"item_id": item_id}).first()
    return None if kept is None else RememberedKey(ItemStatus(kept.status), kept.payload_hash)


class PrunedItem(NamedTuple):
    """What the key memory says of an item whose row retention deleted."""

    status: ItemStatus
    finished_at: datetime | None
    pruned_at: datetime


def pruned_item(engine: Engine, item_id: str) -> PrunedItem | None:
    """The item's key memory, if retention deleted its row (None: no memory of it)."""
    query = select(ITEM_KEYS.c.status, ITEM_KEYS.c.finished_at, ITEM_KEYS.c.pruned_at).where(
        ITEM_KEYS.c.item_id == item_id
    )
    with engine.connect() as connection:
        kept = connection.execute(query).first()
    return None if kept is None else PrunedItem(ItemStatus(kept.status), *kept[1:])


@functools.cache
def _key_lookup_statements() -> tuple[Executable, Executable]:
    """`item_or_remembered_key`'s two queries, built once: building them took half of the
    lookup's CPU, and every enqueue makes it (docs/decisions/key-lookup-one-statement.md)."""
    item_id: BindParameter[str] = bindparam("item_id", type_=ITEMS.c.id.type)
    return (
        select(ITEMS).where(ITEMS.c.id == item_id),
        select(ITEM_KEYS.c.status, ITEM_KEYS.c.payload_hash).where(ITEM_KEYS.c.item_id == item_id),
    )


def last_event_seq(engine: Engine, item_id: str) -> int | None:
    """The newest event seq the read model holds for the item, or None if it holds none."""
    query = select(func.max(EVENTS.c.seq)).where(EVENTS.c.item_id == item_id)
    with engine.connect() as connection:
        newest = connection.execute(query).scalar()
    return None if newest is None else int(newest)


def item_events(engine: Engine, item_id: str) -> list[EventRecord]:
    """The item's history, oldest first."""
    query = select(EVENTS).where(EVENTS.c.item_id == item_id).order_by(EVENTS.c.seq)
    with engine.connect() as connection:
        return [read_event(row) for row in connection.execute(query).mappings()]


def list_items(
    engine: Engine,
    outbox: str,
    *,
    status: str | None = None,
    statuses: Sequence[str] | None = None,
    destination: str | None = None,
    key_prefix: str | None = None,
    error_code: str | None = None,
    delivery: str | None = None,
    created_from: datetime | None = None,
    created_to: datetime | None = None,
    cursor: str | None = None,
    limit: int = 50,
) -> tuple[list[ItemRecord], str | None]:
    """Newest first, keyset-paginated: a cursor stays valid however many items arrive meanwhile.

    `created_from` is inclusive and `created_to` exclusive; `statuses` takes any of them;
    raises `InvalidCursor` on a bad cursor.
    """
    limit = max(1, min(limit, MAX_PAGE))
    conditions = _item_conditions(
        outbox,
        status=status,
        statuses=statuses,
        destination=destination,
        key_prefix=key_prefix,
        error_code=error_code,
        delivery=delivery,
        created_from=created_from,
        created_to=created_to,
    )
    if cursor is not None:
        after_created, after_id = decode_cursor(cursor)
        conditions.append(
            or_(
                ITEMS.c.created_at < after_created,
                and_(ITEMS.c.created_at == after_created, ITEMS.c.id < after_id),
            )
        )
    query = (
        select(ITEMS)
        .where(*conditions)
        .order_by(ITEMS.c.created_at.desc(), ITEMS.c.id.desc())
        .limit(limit + 1)
    )
    with engine.connect() as connection:
        items = [_item_record(row) for row in connection.execute(query).mappings()]
    if len(items) <= limit:
        return items, None
    items = items[:limit]
    last = items[-1].view
    assert last.created_at is not None  # NOT NULL in the table
    return items, encode_cursor(last.created_at, last.id)


def count_items(
    engine: Engine,
    outbox: str,
    *,
    statuses: Sequence[str] | None = None,
    destination: str | None = None,
    key_prefix: str | None = None,
    created_from: datetime | None = None,
    created_to: datetime | None = None,
) -> int:
    """How many items `list_items` would page through with the same filter."""
    conditions = _item_conditions(
        outbox,
        statuses=statuses,
        destination=destination,
        key_prefix=key_prefix,
        created_from=created_from,
        created_to=created_to,
    )
    with engine.connect() as connection:
        return int(
            connection.scalar(select(func.count()).select_from(ITEMS).where(*conditions)) or 0
        )


def _item_conditions(
    outbox: str,
    *,
    status: str | None = None,
    statuses: Sequence[str] | None = None,
    destination: str | None = None,
    key_prefix: str | None = None,
    error_code: str | None = None,
    delivery: str | None = None,
    created_from: datetime | None = None,
    created_to: datetime | None = None,
) -> list[Any]:
    conditions: list[Any] = [ITEMS.c.outbox == outbox]
    if status is not None:
        conditions.append(ITEMS.c.status == status)
    if statuses:
        conditions.append(ITEMS.c.status.in_(sorted(set(statuses))))
    if destination is not None:
        conditions.append(ITEMS.c.destination == destination)
    if key_prefix:
        # Escaped: `%` and `_` in a key are themselves, not wildcards.
        conditions.append(ITEMS.c.key.startswith(key_prefix, autoescape=True))
    if error_code is not None:
        conditions.append(ITEMS.c.last_error_code == error_code)
    if delivery is not None:
        conditions.append(ITEMS.c.delivery == delivery)
    if created_from is not None:
        conditions.append(ITEMS.c.created_at >= created_from)
    if created_to is not None:
        conditions.append(ITEMS.c.created_at < created_to)
    return conditions


class ReportTarget(NamedTuple):
    """The item a provider's message id belongs to, and the addresses it expects reports on."""

    item_id: str
    ordering_key: str | None
    # Casefolded; empty when the item tracks no recipients.
    recipients: frozenset[str]
    # When a sent item was sent (its report window runs from then); None otherwise.
    sent_at: datetime | None = None
    # Bulk mode: the shard count the item was routed by (its report goes to that shard).
    shards: int | None = None


def items_by_message_id(
    engine: Engine, destination: str, message_ids: Sequence[str]
) -> dict[str, ReportTarget]:
    """The item of each provider message id the destination's items hold (absent: unknown)."""
    if not message_ids:
        return {}
    query = select(
        ITEMS.c.provider_message_id,
        ITEMS.c.id,
        ITEMS.c.ordering_key,
        ITEMS.c.recipients,
        ITEMS.c.status,
        ITEMS.c.finished_at,
        ITEMS.c.shards,
    ).where(
        ITEMS.c.provider_message_id.in_(sorted(set(message_ids))),
        ITEMS.c.destination == destination,
    )
    with engine.connect() as connection:
        return {
            message_id: ReportTarget(
                item_id,
                ordering_key,
                frozenset(recipient.address.casefold() for recipient in recipients or ()),
                finished_at if status == ItemStatus.SENT.value else None,
                shards,
            )
            for message_id, item_id, ordering_key, recipients, status, finished_at, shards in (
                connection.execute(query)
            )
        }


def events_since(engine: Engine, outbox: str, since_id: int, limit: int = 500) -> list[EventRecord]:
    """Events of the outbox after cursor `since_id`, in cursor order (the live stream's feed)."""
    query = (
        select(EVENTS)
        .where(EVENTS.c.outbox == outbox, EVENTS.c.id > since_id)
        .order_by(EVENTS.c.id)
        .limit(limit)
    )
    with engine.connect() as connection:
        return [read_event(row) for row in connection.execute(query).mappings()]


def events_since_each(
    engine: Engine, cursors: Mapping[str, int], limit: int = 500
) -> list[EventRecord]:
    """Events of each outbox in `cursors` after its own cursor, in cursor order: one query for
    every outbox a live tailer follows (per-outbox cursors, as ids of one outbox commit in order
    but those of two outboxes need not)."""
    if not cursors:
        return []
    query = (
        select(EVENTS)
        .where(
            or_(
                *(
                    and_(EVENTS.c.outbox == outbox, EVENTS.c.id > since_id)
                    for outbox, since_id in sorted(cursors.items())
                )
            )
        )
        .order_by(EVENTS.c.id)
        .limit(limit)
    )
    with engine.connect() as connection:
        return [read_event(row) for row in connection.execute(query).mappings()]


def last_event_id(engine: Engine, outbox: str) -> int:
    """The outbox's newest event cursor (0 when it has none): where a new tailer starts."""
    query = select(func.max(EVENTS.c.id)).where(EVENTS.c.outbox == outbox)
    with engine.connect() as connection:
        return int(connection.scalar(query) or 0)


def counts_by_status(engine: Engine, outbox: str) -> dict[str, int]:
    """The outbox's item counts by status; statuses without items are absent."""
    query = (
        select(ITEMS.c.status, func.count())
        .where(ITEMS.c.outbox == outbox)
        .group_by(ITEMS.c.status)
    )
    with engine.connect() as connection:
        return {status: count for status, count in connection.execute(query)}


def list_outboxes(engine: Engine) -> dict[str, dict[str, int]]:
    """Every outbox with its item counts by status."""
    query = select(ITEMS.c.outbox, ITEMS.c.status, func.count()).group_by(
        ITEMS.c.outbox, ITEMS.c.status
    )
    outboxes: dict[str, dict[str, int]] = {}
    with engine.connect() as connection:
        for outbox, status, count in connection.execute(query):
            outboxes.setdefault(outbox, {})[status] = count
    return dict(sorted(outboxes.items()))


def list_failed(engine: Engine, outbox: str, destination: str | None = None) -> list[str]:
    """Keys of the outbox's failed items (for redrive-all), oldest first."""
    query = select(ITEMS.c.key).where(
        ITEMS.c.outbox == outbox, ITEMS.c.status == ItemStatus.FAILED.value
    )
    if destination is not None:
        query = query.where(ITEMS.c.destination == destination)
    with engine.connect() as connection:
        return list(connection.scalars(query.order_by(ITEMS.c.created_at, ITEMS.c.id)))


def _item_record(row: RowMapping) -> ItemRecord:
    return ItemRecord(
        view=read_view(row), payload=row["payload"], payload_pruned_at=row["payload_pruned_at"]
    )


def encode_cursor(created_at: datetime, item_id: str) -> str:
    """A keyset cursor: a row's time (`created_at`, or another ordering time) and its id."""
    raw = json.dumps([created_at.isoformat(), item_id])
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    """The time and id `encode_cursor` put in `cursor`; raises `InvalidCursor` for anything else,
    a time that leaves years 1-9999 in UTC included (the database could not compare it)."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        created_at, item_id = json.loads(raw)
        if not isinstance(created_at, str) or not isinstance(item_id, str):
            raise TypeError("cursor fields have the wrong types")
        at = datetime.fromisoformat(created_at)
        return at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC), item_id
    except (ValueError, TypeError, OverflowError, RecursionError) as err:  # binascii: ValueError
        raise InvalidCursor("invalid cursor") from err
