"""The aggregate event store on SQLite and PostgreSQL: once per (aggregate, seq), never back."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

from durable_outbox_temporal.contract.aggregate import RecordedEvent, StoreEvents
from sqlalchemy import Engine

from readmodel import aggregates as event_store

T0 = datetime(2026, 11, 23, 12, tzinfo=UTC)


def batch(first: int, last: int, aggregate_id: str = "BA1") -> StoreEvents:
    events = [
        RecordedEvent(
            seq=seq,
            type="SeatAssigned",
            data={"seat": f"{seq}A", "passenger_id": f"p{seq}"},
            recorded_at=T0 + timedelta(seconds=seq),
            actor="api",
            command_id=f"c{seq}",
        )
        for seq in range(first, last + 1)
    ]
    return StoreEvents(
        type="flight",
        id=aggregate_id,
        events=events,
        version=last,
        state={"version": last},
        updated_at=T0 + timedelta(seconds=last),
    )


def test_events_are_stored_once_and_read_back_in_order(engine: Engine) -> None:
    event_store.store_events(engine, batch(1, 3))
    event_store.store_events(engine, batch(1, 3))  # a retried write
    event_store.store_events(engine, batch(3, 5))  # overlapping

    stored = event_store.events(engine, "flight", "BA1")

    assert [e.seq for e in stored] == [1, 2, 3, 4, 5]
    assert stored[0] == batch(1, 1).events[0]
    assert [e.seq for e in event_store.events(engine, "flight", "BA1", after=3, limit=1)] == [4]


def test_state_row_only_moves_forward(engine: Engine) -> None:
    event_store.store_events(engine, batch(1, 4))
    event_store.store_events(engine, batch(1, 2))  # a late, older write

    record = event_store.get(engine, "flight", "BA1")

    assert record is not None and record.version == 4 and record.state == {"version": 4}
    assert record.updated_at == T0 + timedelta(seconds=4)
    assert event_store.get(engine, "flight", "nope") is None


def test_concurrent_writers_never_duplicate_an_event(engine: Engine) -> None:
    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(lambda n: event_store.store_events(engine, batch(1, 20)), range(8)))

    assert [e.seq for e in event_store.events(engine, "flight", "BA1")] == list(range(1, 21))


def test_ids_of_a_type_page_by_id(engine: Engine) -> None:
    for aggregate_id in ("c", "a", "b"):
        event_store.store_events(engine, batch(1, 1, aggregate_id))

    first, after = event_store.list_ids(engine, "flight", limit=2)
    rest, end = event_store.list_ids(engine, "flight", after=after, limit=2)

    assert [r.id for r in first] == ["a", "b"] and after == "b"
    assert [r.id for r in rest] == ["c"] and end is None
    assert event_store.list_ids(engine, "lock") == ([], None)


def test_events_after_each_reads_every_followed_aggregate_from_its_own_seq(engine: Engine) -> None:
    event_store.store_events(engine, batch(1, 3, "BA1"))
    event_store.store_events(engine, batch(1, 2, "BA2"))
    event_store.store_events(engine, batch(1, 2, "BA3"))  # not followed

    found = event_store.events_after_each(engine, {("flight", "BA1"): 1, ("flight", "BA2"): 0})

    assert [(key[1], event.seq) for key, event in found] == [
        ("BA1", 2),
        ("BA1", 3),
        ("BA2", 1),
        ("BA2", 2),
    ]
    assert event_store.events_after_each(engine, {}) == []
    assert len(event_store.events_after_each(engine, {("flight", "BA1"): 0}, limit=2)) == 2
