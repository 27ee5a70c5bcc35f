"""Idempotent projections, pagination and the live cursor, on SQLite and PostgreSQL."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine

from common.models import ItemEvent, ItemEventType, ItemProjection, ItemStatus, OutboxItemView
from readmodel import store
from readmodel.db import create_schema

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def view(key: str, seq: int, status: ItemStatus, outbox: str = "o", **fields) -> OutboxItemView:  # type: ignore[no-untyped-def]
    values = {
        "id": f"outbox/{outbox}/{key}",
        "outbox": outbox,
        "key": key,
        "destination": "d",
        "status": status,
        "attempts": seq,
        "max_attempts": 5,
        "last_error": None,
        "next_attempt_at": None,
        "operation_url": None,
        "poll_count": 0,
        "created_at": T0,
        "updated_at": T0 + timedelta(seconds=seq),
        "finished_at": None,
        "last_event_seq": seq,
    }
    values.update(fields)
    return OutboxItemView(**values)


def event(seq: int, kind: ItemEventType, status: ItemStatus) -> ItemEvent:
    return ItemEvent(seq=seq, type=kind, status=status, at=T0 + timedelta(seconds=seq))


ENQUEUED = event(1, ItemEventType.ENQUEUED, ItemStatus.QUEUED)
ACCEPTED = event(2, ItemEventType.ACCEPTED, ItemStatus.SENDING)
SENT = event(3, ItemEventType.SENT, ItemStatus.SENT)


def project(engine: Engine, key: str = "k", outbox: str = "o") -> None:
    store.apply_projection(
        engine,
        ItemProjection(view(key, 1, ItemStatus.QUEUED, outbox), [ENQUEUED], payload={"to": key}),
    )
    store.apply_projection(
        engine, ItemProjection(view(key, 3, ItemStatus.SENT, outbox), [ACCEPTED, SENT])
    )


def test_replayed_projection_changes_nothing(store_engine: Engine) -> None:
    project(store_engine)
    project(store_engine)

    row = store.get_item(store_engine, "outbox/o/k")
    assert row is not None and row.status == "sent" and row.version == 3
    assert row.payload == {"to": "k"}
    assert [e.seq for e in store.item_events(store_engine, "outbox/o/k")] == [1, 2, 3]


def test_older_projection_never_overwrites_a_newer_one(store_engine: Engine) -> None:
    store.apply_projection(store_engine, ItemProjection(view("k", 3, ItemStatus.SENT), [SENT]))
    store.apply_projection(
        store_engine, ItemProjection(view("k", 1, ItemStatus.QUEUED), [ENQUEUED], payload={"a": 1})
    )

    row = store.get_item(store_engine, "outbox/o/k")
    assert row is not None and row.status == "sent" and row.version == 3
    assert [e.seq for e in store.item_events(store_engine, "outbox/o/k")] == [1, 3]


def test_keyset_pagination_with_filters(store_engine: Engine) -> None:
    for n in range(7):
        status = ItemStatus.FAILED if n % 3 == 0 else ItemStatus.SENT
        item = view(f"k{n}", 1, status, created_at=T0 + timedelta(minutes=n))
        store.apply_projection(store_engine, ItemProjection(item, [ENQUEUED]))

    pages, cursor = [], None
    while True:
        items, cursor = store.list_items(store_engine, "o", limit=3, cursor=cursor)
        pages.append([item.key for item in items])
        if cursor is None:
            break
    failed, _ = store.list_items(store_engine, "o", status="failed")
    window, _ = store.list_items(
        store_engine,
        "o",
        created_from=T0 + timedelta(minutes=2),
        created_to=T0 + timedelta(minutes=4),
    )

    assert pages == [["k6", "k5", "k4"], ["k3", "k2", "k1"], ["k0"]]
    assert [item.key for item in failed] == ["k6", "k3", "k0"]
    assert [item.key for item in window] == ["k3", "k2"]
    with pytest.raises(store.InvalidCursor):
        store.list_items(store_engine, "o", cursor="not-a-cursor")


def test_counts_outboxes_failed_and_events_since(store_engine: Engine) -> None:
    project(store_engine, "a")
    project(store_engine, "b", outbox="other")
    store.apply_projection(
        store_engine, ItemProjection(view("c", 1, ItemStatus.FAILED), [ENQUEUED])
    )

    events = store.events_since(store_engine, "o", 0)
    later = store.events_since(store_engine, "o", events[1].id or 0)

    assert store.counts_by_status(store_engine, "o") == {"sent": 1, "failed": 1}
    assert store.list_outboxes(store_engine) == {
        "o": {"sent": 1, "failed": 1},
        "other": {"sent": 1},
    }
    assert store.list_failed(store_engine, "o") == ["c"]
    assert [(e.item_id, e.seq) for e in events] == [
        ("outbox/o/a", 1),
        ("outbox/o/a", 2),
        ("outbox/o/a", 3),
        ("outbox/o/c", 1),
    ]
    assert [e.id for e in later] == [e.id for e in events[2:]]


def test_schema_creation_is_idempotent(store_engine: Engine) -> None:
    project(store_engine)
    create_schema(store_engine)
    assert store.get_item(store_engine, "outbox/o/k") is not None


def test_concurrent_writers_keep_the_live_cursor_ordered(store_engine: Engine) -> None:
    """Ids of one outbox's events are committed in id order, so a tailer never skips one."""
    errors: list[BaseException] = []

    def writer(prefix: str) -> None:
        try:
            for n in range(15):
                project(store_engine, f"{prefix}{n}")
        except BaseException as err:  # surfaced below
            errors.append(err)

    threads = [threading.Thread(target=writer, args=(p,)) for p in "xyz"]
    seen: list[int] = []
    for thread in threads:
        thread.start()
    # Tail while writers run: every batch must continue strictly after the last id seen.
    while any(thread.is_alive() for thread in threads):
        batch = store.events_since(store_engine, "o", seen[-1] if seen else 0)
        seen.extend(e.id or 0 for e in batch)
    for thread in threads:
        thread.join()
    seen.extend(e.id or 0 for e in store.events_since(store_engine, "o", seen[-1] if seen else 0))

    assert not errors
    everything = [e.id for e in store.events_since(store_engine, "o", 0, limit=1000)]
    assert seen == everything and len(everything) == 45 * 3
