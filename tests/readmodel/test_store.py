"""Idempotent projections, pagination and the live cursor, on SQLite and PostgreSQL."""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from durable_outbox_temporal.contract.item import (
    ItemEvent,
    ItemEventType,
    ItemProjection,
    ItemStatus,
    OutboxItemView,
)
from sqlalchemy import Connection, Engine, func, insert, select, text
from sqlalchemy import event as sa_event
from sqlalchemy.exc import IntegrityError

from readmodel import store
from readmodel.db import create_schema
from readmodel.models import EVENTS

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def view(
    key: str, seq: int, status: ItemStatus, outbox: str = "o", **fields: Any
) -> OutboxItemView:
    values: dict[str, Any] = {
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


def lifecycle(key: str) -> list[ItemProjection]:
    """An item's projections in the order its workflow sends them: start, accept + poll, sent."""
    polled = ItemEvent(3, ItemEventType.POLLED, ItemStatus.SENDING, T0 + timedelta(seconds=3), 1)
    sent = ItemEvent(4, ItemEventType.SENT, ItemStatus.SENT, T0 + timedelta(seconds=4), 1, "ok")
    return [
        ItemProjection(view(key, 1, ItemStatus.QUEUED), [ENQUEUED], T0, payload={"to": "a@b.c"}),
        ItemProjection(
            view(key, 3, ItemStatus.SENDING, operation_url="https://op/1", poll_count=1),
            [ACCEPTED, polled],
            T0,
        ),
        ItemProjection(
            view(
                key,
                4,
                ItemStatus.SENT,
                operation_url="https://op/1",
                poll_count=1,
                finished_at=T0 + timedelta(seconds=4),
                provider_message_id="m-1",
            ),
            [sent],
            T0,
        ),
    ]


def snapshot(engine: Engine, item_id: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The item's row and history without what names the item or depends on insertion order."""
    row = store.get_item(engine, item_id)
    assert row is not None
    events = store.item_events(engine, item_id)
    return (
        {**_without(asdict(row.view), "id", "key"), "payload": row.payload},
        [_without(asdict(e), "id", "item_id") for e in events],
    )


def _without(values: dict[str, Any], *names: str) -> dict[str, Any]:
    return {name: value for name, value in values.items() if name not in names}


def test_replayed_projection_changes_nothing(engine: Engine) -> None:
    for projection in lifecycle("k"):
        store.apply_projection(engine, projection)
    before = snapshot(engine, "outbox/o/k")
    ids_before = [e.id for e in store.item_events(engine, "outbox/o/k")]

    for projection in lifecycle("k"):
        store.apply_projection(engine, projection)

    assert snapshot(engine, "outbox/o/k") == before
    assert [e.id for e in store.item_events(engine, "outbox/o/k")] == ids_before
    row, events = before
    assert (
        row["status"] == "sent" and row["last_event_seq"] == 4 and row["payload"] == {"to": "a@b.c"}
    )
    assert [e["seq"] for e in events] == [1, 2, 3, 4]


def test_older_projection_never_overwrites_a_newer_one(engine: Engine) -> None:
    start, _, sent = lifecycle("k")
    store.apply_projection(engine, sent)
    store.apply_projection(engine, start)

    row = store.get_item(engine, "outbox/o/k")
    assert row is not None
    assert (row.view.status, row.view.last_event_seq, row.view.provider_message_id) == (
        "sent",
        4,
        "m-1",
    )
    assert row.payload == {"to": "a@b.c"}  # carried only by the late start projection
    assert [e.seq for e in store.item_events(engine, "outbox/o/k")] == [1, 4]


def test_every_arrival_order_ends_identical(engine: Engine) -> None:
    """Retries and late arrivals, in any order and repeated, leave the same row and history."""
    for projection in lifecycle("in-order"):
        store.apply_projection(engine, projection)
    expected = snapshot(engine, "outbox/o/in-order")

    for n, order in enumerate(itertools.permutations(range(3))):
        projections = lifecycle(f"k{n}")
        # Each permutation also resends its first projection at the end, as a retry would.
        for index in (*order, order[0]):
            store.apply_projection(engine, projections[index])
        assert snapshot(engine, f"outbox/o/k{n}") == expected, order


def test_a_batch_ends_as_the_same_projections_one_by_one(engine: Engine) -> None:
    """Group commit: many items, their projections shuffled and repeated, in one transaction."""
    for projection in lifecycle("single"):
        store.apply_projection(engine, projection)
    expected = snapshot(engine, "outbox/o/single")

    batch = []
    for n, order in enumerate(itertools.permutations(range(3))):
        projections = lifecycle(f"b{n}")
        batch += [projections[index] for index in (*order, order[0])]
    store.apply_projections(engine, batch)

    for n in range(6):
        assert snapshot(engine, f"outbox/o/b{n}") == expected, n
    # Events of one item are numbered in the cursor's order even when they arrived shuffled.
    events = store.events_since(engine, "o", 0)
    for n in range(6):
        mine = [e.seq for e in events if e.item_id == f"outbox/o/b{n}"]
        assert mine == sorted(mine) == [1, 2, 3, 4]


def test_events_are_unique_per_item_and_seq(engine: Engine) -> None:
    store.apply_projection(engine, ItemProjection(view("k", 1, ItemStatus.QUEUED), [ENQUEUED]))
    rewritten = ItemEvent(1, ItemEventType.FAILED, ItemStatus.FAILED, T0, 9, "not the original")
    store.apply_projection(
        engine, ItemProjection(view("k", 2, ItemStatus.SENDING), [rewritten, ACCEPTED])
    )

    events = store.item_events(engine, "outbox/o/k")
    assert [(e.seq, e.type, e.attempt) for e in events] == [(1, "enqueued", 0), (2, "accepted", 0)]
    # The database itself refuses a duplicate, so no writer can get around it.
    duplicate = {"item_id": "outbox/o/k", "outbox": "o", "seq": 1, "type": "x", "status": "x"}
    with pytest.raises(IntegrityError), engine.begin() as connection:
        connection.execute(insert(EVENTS).values(at=T0, **duplicate))


def test_timestamps_read_back_in_utc_and_filter_across_offsets(engine: Engine) -> None:
    plus_two = timezone(timedelta(hours=2))
    local = datetime(2026, 1, 1, 2, 0, tzinfo=plus_two)  # 00:00 UTC
    store.apply_projection(
        engine, ItemProjection(view("k", 1, ItemStatus.QUEUED, created_at=local), [ENQUEUED])
    )

    row = store.get_item(engine, "outbox/o/k")
    assert row is not None and row.view.created_at == T0 and row.view.created_at.tzinfo == UTC
    assert store.item_events(engine, "outbox/o/k")[0].at.tzinfo == UTC
    # 01:30+02:00 is 23:30 UTC the day before: the item is after it, not before.
    after, _ = store.list_items(
        engine, "o", created_from=datetime(2026, 1, 1, 1, 30, tzinfo=plus_two)
    )
    before, _ = store.list_items(
        engine, "o", created_to=datetime(2026, 1, 1, 1, 30, tzinfo=plus_two)
    )
    assert [item.view.key for item in after] == ["k"] and before == []


def test_created_at_falls_back_to_the_enqueue_time(engine: Engine) -> None:
    enqueued_at = T0 - timedelta(minutes=5)
    store.apply_projection(
        engine,
        ItemProjection(view("k", 1, ItemStatus.QUEUED, created_at=None), [ENQUEUED], enqueued_at),
    )
    row = store.get_item(engine, "outbox/o/k")
    assert row is not None and row.view.created_at == enqueued_at


def test_keyset_pagination_with_filters(engine: Engine) -> None:
    for n in range(9):
        status = ItemStatus.FAILED if n % 3 == 0 else ItemStatus.SENT
        # Pairs share a creation time, so the id must break ties for paging to be exact.
        created_at = T0 + timedelta(minutes=n // 2)
        item = view(f"k{n}", 1, status, destination=f"d{n % 2}", created_at=created_at)
        store.apply_projection(engine, ItemProjection(item, [ENQUEUED]))

    def all_pages(**filters: Any) -> list[list[str]]:
        pages, cursor = [], None
        while True:
            items, cursor = store.list_items(engine, "o", limit=2, cursor=cursor, **filters)
            pages.append([item.view.key for item in items])
            if cursor is None:
                return pages

    assert all_pages() == [["k8", "k7"], ["k6", "k5"], ["k4", "k3"], ["k2", "k1"], ["k0"]]
    assert all_pages(status="failed") == [["k6", "k3"], ["k0"]]
    assert all_pages(destination="d0") == [["k8", "k6"], ["k4", "k2"], ["k0"]]
    assert all_pages(status="sent", destination="d1") == [["k7", "k5"], ["k1"]]
    assert all_pages(
        created_from=T0 + timedelta(minutes=1), created_to=T0 + timedelta(minutes=3)
    ) == [
        ["k5", "k4"],
        ["k3", "k2"],
    ]
    with pytest.raises(store.InvalidCursor):
        store.list_items(engine, "o", cursor="not-a-cursor")
    with pytest.raises(store.InvalidCursor):
        store.list_items(engine, "o", cursor="WzEsIDJd")  # [1, 2]: valid JSON, wrong fields


def test_pages_stay_stable_while_items_arrive(engine: Engine) -> None:
    for n in range(4):
        item = view(f"old{n}", 1, ItemStatus.QUEUED, created_at=T0 + timedelta(minutes=n))
        store.apply_projection(engine, ItemProjection(item, [ENQUEUED]))

    first, cursor = store.list_items(engine, "o", limit=2)
    for n in range(3):
        item = view(f"new{n}", 1, ItemStatus.QUEUED, created_at=T0 + timedelta(hours=1, minutes=n))
        store.apply_projection(engine, ItemProjection(item, [ENQUEUED]))
    second, last_cursor = store.list_items(engine, "o", limit=2, cursor=cursor)

    assert [i.view.key for i in first] == ["old3", "old2"]
    assert [i.view.key for i in second] == ["old1", "old0"] and last_cursor is None


def test_counts_outboxes_and_failed(engine: Engine) -> None:
    project(engine, "a")
    project(engine, "b", outbox="other")
    for key, destination in (("c", "d"), ("e", "x")):
        failed = view(key, 1, ItemStatus.FAILED, destination=destination)
        store.apply_projection(engine, ItemProjection(failed, [ENQUEUED]))

    assert store.counts_by_status(engine, "o") == {"sent": 1, "failed": 2}
    assert store.counts_by_status(engine, "nobody") == {}
    assert store.list_outboxes(engine) == {"o": {"sent": 1, "failed": 2}, "other": {"sent": 1}}
    assert store.list_failed(engine, "o") == ["c", "e"]
    assert store.list_failed(engine, "o", destination="x") == ["e"]
    assert store.list_failed(engine, "other") == []


def test_events_since_follows_the_cursor_of_one_outbox(engine: Engine) -> None:
    project(engine, "a")
    project(engine, "b", outbox="other")
    project(engine, "c")

    events = store.events_since(engine, "o", 0)
    page = store.events_since(engine, "o", events[1].id or 0, limit=2)

    assert [(e.item_id, e.seq) for e in events] == [
        *(("outbox/o/a", seq) for seq in (1, 2, 3)),
        *(("outbox/o/c", seq) for seq in (1, 2, 3)),
    ]
    ids = [e.id or 0 for e in events]
    assert ids == sorted(ids)
    assert [e.id for e in page] == ids[2:4]
    assert store.last_event_id(engine, "o") == ids[-1]
    assert store.last_event_id(engine, "nobody") == 0
    assert store.events_since(engine, "o", ids[-1]) == []


def test_schema_creation_twice_and_concurrently(
    engine_factory: Callable[[str], Engine],
) -> None:
    """Processes starting together on a new database each create the schema; all succeed."""
    errors: list[BaseException] = []

    def start_up(engine: Engine, barrier: threading.Barrier) -> None:
        try:
            barrier.wait()
            create_schema(engine)
        except BaseException as err:  # reported by the assertion below
            errors.append(err)

    # Rounds, each on a new database, because the races are brief. Every round has one process
    # migrate while seven wait on the schema lock and then find the schema at head; on SQLite each
    # waiter sleeps in SQLite's busy handler (up to 100 ms a retry), which made 40 rounds take
    # 23 s. More rounds did not reach the WAL-switch race either: with the busy timeout set first,
    # the switch waits rather than fails (no retry in `_enable_wal` in 45 rounds, measured, also
    # under load), so SQLite gets PostgreSQL's count.
    rounds = 10
    for round_ in range(rounds):
        engines = [engine_factory(f"db{round_}") for _ in range(8)]
        barrier = threading.Barrier(len(engines))
        threads = [threading.Thread(target=start_up, args=(e, barrier)) for e in engines]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for engine in engines:
            engine.dispose()  # so thirty rounds stay within PostgreSQL's connection limit
        assert errors == [], round_

    writer, restarted = engine_factory("db0"), engine_factory("db0")
    project(writer)
    create_schema(restarted)
    row = store.get_item(restarted, "outbox/o/k")
    assert row is not None and row.view.status == "sent"


def test_concurrent_writers_keep_the_live_cursor_ordered(engine: Engine) -> None:
    """A tailer reading `id > last_seen` while several writers commit never skips an event."""
    outbox = f"o{uuid.uuid4().hex[:8]}"
    errors: list[BaseException] = []

    def writer(prefix: str) -> None:
        try:
            for n in range(15):
                project(engine, f"{prefix}{n}", outbox)
        except BaseException as err:  # reported by the assertion below
            errors.append(err)

    threads = [threading.Thread(target=writer, args=(p,)) for p in "wxyz"]
    seen: list[int] = []
    for thread in threads:
        thread.start()
    while any(thread.is_alive() for thread in threads):
        seen.extend(e.id or 0 for e in store.events_since(engine, outbox, seen[-1] if seen else 0))
    for thread in threads:
        thread.join()
    seen.extend(e.id or 0 for e in store.events_since(engine, outbox, seen[-1] if seen else 0))

    assert errors == []
    everything = [e.id for e in store.events_since(engine, outbox, 0, limit=1000)]
    assert seen == everything and len(everything) == 4 * 15 * 3


def test_writer_waits_for_an_uncommitted_writer_of_the_same_outbox(
    postgres_engine: Engine,
) -> None:
    """PostgreSQL: while one projection of an outbox is uncommitted, a second one cannot commit
    events with larger ids, which a tailer would show before the first's and then skip it."""
    outbox = f"o{uuid.uuid4().hex[:8]}"
    first_pid: list[int] = []
    first_ready, release_first = threading.Event(), threading.Event()

    @sa_event.listens_for(postgres_engine, "commit")
    def hold_first_commit(connection: Connection) -> None:
        if threading.current_thread().name == "first":
            first_pid.append(connection.exec_driver_sql("SELECT pg_backend_pid()").scalar_one())
            first_ready.set()
            release_first.wait(timeout=30)

    first = threading.Thread(target=project, args=(postgres_engine, "a", outbox), name="first")
    second = threading.Thread(target=project, args=(postgres_engine, "b", outbox), name="second")
    first.start()
    assert first_ready.wait(timeout=30)
    second.start()
    # Until the second writer either commits or is seen waiting on the first.
    deadline = time.monotonic() + 30
    while second.is_alive() and not _blocked_by(postgres_engine, first_pid[0]):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    seen = [e.id or 0 for e in store.events_since(postgres_engine, outbox, 0)]
    release_first.set()
    first.join()
    second.join()
    seen += [
        e.id or 0 for e in store.events_since(postgres_engine, outbox, seen[-1] if seen else 0)
    ]

    everything = [e.id for e in store.events_since(postgres_engine, outbox, 0)]
    assert len(everything) == 6 and seen == everything


def _blocked_by(engine: Engine, pid: int) -> bool:
    query = text("SELECT count(*) FROM pg_stat_activity WHERE :pid = ANY(pg_blocking_pids(pid))")
    with engine.connect() as connection:
        return bool(connection.execute(query, {"pid": pid}).scalar_one())


def test_no_event_is_written_twice_under_concurrent_retries(engine: Engine) -> None:
    """The same projection sent by racing retries still leaves one copy of each event."""
    projections = lifecycle("k")
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def retry() -> None:
        try:
            barrier.wait()
            for projection in projections:
                store.apply_projection(engine, projection)
        except BaseException as err:  # reported by the assertion below
            errors.append(err)

    threads = [threading.Thread(target=retry) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    with engine.connect() as connection:
        count = connection.execute(select(func.count()).select_from(EVENTS)).scalar_one()
    assert count == 4
    row = store.get_item(engine, "outbox/o/k")
    assert row is not None and row.view.last_event_seq == 4
