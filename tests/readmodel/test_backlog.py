"""The backlog queries behind the alerting metrics, on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from durable_outbox_temporal.contract.item import (
    ItemEvent,
    ItemEventType,
    ItemProjection,
    ItemStatus,
)
from durable_outbox_temporal.contract.lane import LanePolicy, LaneProjection, LaneStatus, LaneView
from sqlalchemy import Engine, insert, text
from sqlalchemy import event as sa_event

from readmodel import backlog, store
from readmodel.backlog import DeliveryTally, ItemBacklog, LaneBacklog, read_backlog
from readmodel.lanes import apply_lane_projections
from readmodel.models import EVENTS
from tests.readmodel.test_store import T0, view

FINAL_EVENT = {
    ItemStatus.SENT: ItemEventType.SENT,
    ItemStatus.FAILED: ItemEventType.FAILED,
    ItemStatus.CANCELLED: ItemEventType.CANCELLED,
}


def put(
    engine: Engine,
    key: str,
    status: ItemStatus,
    *,
    outbox: str = "o",
    destination: str = "d",
    created_s: int = 0,
    seq: int = 1,
) -> None:
    """Project the item at `seq` with its status, recording the event that got it there."""
    kind = FINAL_EVENT.get(status, ItemEventType.ENQUEUED)
    if status is ItemStatus.SENDING:
        kind = ItemEventType.ACCEPTED
    item = view(
        key,
        seq,
        status,
        outbox,
        destination=destination,
        created_at=T0 + timedelta(seconds=created_s),
    )
    event = ItemEvent(seq=seq, type=kind, status=status, at=T0 + timedelta(seconds=seq))
    store.apply_projection(engine, ItemProjection(item, [event]))


def put_lane(
    engine: Engine, ordering_key: str, status: LaneStatus, length: int, outbox: str = "o"
) -> None:
    lane = LaneView(
        id=f"lane/{outbox}/{ordering_key}",
        outbox=outbox,
        ordering_key=ordering_key,
        status=status,
        policy=LanePolicy.HALT,
        length=length,
        version=1,
    )
    apply_lane_projections(engine, [LaneProjection(lane=lane)])


def test_item_backlog_counts_the_items_owed_and_the_oldest_queued(engine: Engine) -> None:
    put(engine, "q1", ItemStatus.QUEUED, created_s=30)
    put(engine, "q2", ItemStatus.QUEUED, created_s=10)
    put(engine, "q3", ItemStatus.QUEUED, destination="e", created_s=20)
    put(engine, "s1", ItemStatus.SENDING, created_s=5)
    put(engine, "f1", ItemStatus.FAILED, created_s=1)
    put(engine, "f2", ItemStatus.FAILED, outbox="p", created_s=2)
    put(engine, "done", ItemStatus.SENT, created_s=0)
    put(engine, "gone", ItemStatus.CANCELLED, created_s=0)

    with engine.connect() as connection:
        rows = sorted(backlog.item_backlog(connection), key=lambda r: (r.outbox, r.destination))

    at = {seconds: T0 + timedelta(seconds=seconds) for seconds in (1, 2, 5, 10, 20)}
    assert sorted(rows, key=lambda r: (r.outbox, r.destination, r.status)) == [
        ItemBacklog("o", "d", ItemStatus.FAILED, 1, at[1]),
        ItemBacklog("o", "d", ItemStatus.QUEUED, 2, at[10]),
        ItemBacklog("o", "d", ItemStatus.SENDING, 1, at[5]),
        ItemBacklog("o", "e", ItemStatus.QUEUED, 1, at[20]),
        ItemBacklog("p", "d", ItemStatus.FAILED, 1, at[2]),
    ]

    # The oldest queued item goes out: the next oldest is the one to watch.
    put(engine, "q2", ItemStatus.SENT, created_s=10, seq=2)
    with engine.connect() as connection:
        queued = [r for r in backlog.item_backlog(connection) if r.status is ItemStatus.QUEUED]
    assert {(r.destination, r.items, r.oldest_created_at) for r in queued} == {
        ("d", 1, T0 + timedelta(seconds=30)),
        ("e", 1, at[20]),
    }


def test_queued_ahead_counts_the_destinations_older_queued_items_of_every_outbox(
    engine: Engine,
) -> None:
    put(engine, "a", ItemStatus.QUEUED, created_s=1)
    put(engine, "b", ItemStatus.QUEUED, outbox="p", created_s=2)  # another outbox: same rate
    put(engine, "c", ItemStatus.QUEUED, destination="e", created_s=3)  # another destination
    put(engine, "d", ItemStatus.SENDING, created_s=4)  # out already
    put(engine, "me", ItemStatus.QUEUED, created_s=5)
    put(engine, "later", ItemStatus.QUEUED, created_s=6)
    with engine.connect() as connection:
        assert backlog.queued_ahead(connection, "d", T0 + timedelta(seconds=5)) == 2
        assert backlog.queued_ahead(connection, "d", T0) == 0


def test_lane_backlog_counts_busy_lanes_their_items_and_the_longest(engine: Engine) -> None:
    put_lane(engine, "a", LaneStatus.RUNNING, 3)
    put_lane(engine, "b", LaneStatus.RUNNING, 7)
    put_lane(engine, "c", LaneStatus.HALTED, 4)
    put_lane(engine, "d", LaneStatus.IDLE, 0)
    put_lane(engine, "e", LaneStatus.HALTED, 2, outbox="p")

    with engine.connect() as connection:
        rows = backlog.lane_backlog(connection)

    assert sorted(rows, key=lambda r: (r.outbox, r.status)) == [
        LaneBacklog("o", LaneStatus.HALTED, lanes=1, items=4, longest=4),
        LaneBacklog("o", LaneStatus.RUNNING, lanes=2, items=10, longest=7),
        LaneBacklog("p", LaneStatus.HALTED, lanes=1, items=2, longest=2),
    ]


def test_the_tally_adds_only_new_outcomes_and_matches_a_full_count(engine: Engine) -> None:
    tally = DeliveryTally()
    put(engine, "a", ItemStatus.SENT)
    put(engine, "b", ItemStatus.SENT, destination="e")
    put(engine, "c", ItemStatus.FAILED)
    put(engine, "d", ItemStatus.QUEUED, outbox="p")

    first = read_backlog(engine, tally)
    again = read_backlog(engine, tally)
    # `c` redriven, then failed again (each permanent failure counts); `d` sent; `e` cancelled.
    put(engine, "c", ItemStatus.QUEUED, seq=2)
    put(engine, "c", ItemStatus.FAILED, seq=3)
    put(engine, "d", ItemStatus.SENT, outbox="p", seq=2)
    put(engine, "e", ItemStatus.CANCELLED)
    later = read_backlog(engine, tally)

    assert first.sent == again.sent == {("o", "d"): 1, ("o", "e"): 1}
    assert first.failed == again.failed == {("o", "d"): 1}
    assert later.sent == {("o", "d"): 1, ("o", "e"): 1, ("p", "d"): 1}
    assert later.failed == {("o", "d"): 2}
    # A tally started now (the API restarted) counts the same history from scratch.
    fresh = read_backlog(engine, DeliveryTally())
    assert (fresh.sent, fresh.failed) == (later.sent, later.failed)


def test_a_failed_reading_leaves_the_tally_as_it_was(engine: Engine) -> None:
    tally = DeliveryTally()
    put(engine, "a", ItemStatus.SENT)
    read_backlog(engine, tally)
    put(engine, "b", ItemStatus.SENT)

    def fail_the_count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if "count(" in statement and "JOIN outbox_items" in statement:
            raise RuntimeError("database went away mid-reading")

    sa_event.listen(engine, "before_cursor_execute", fail_the_count)
    with pytest.raises(RuntimeError):
        read_backlog(engine, tally)
    sa_event.remove(engine, "before_cursor_execute", fail_the_count)
    after = read_backlog(engine, tally)

    # Had the failed reading moved the cursor, `b` would never be counted.
    assert after.sent == {("o", "d"): 2}


def test_the_tally_never_skips_an_event_that_commits_after_a_newer_one(
    postgres_engine: Engine,
) -> None:
    """PostgreSQL takes ids at insert and shows them at commit; writers of different outboxes
    do not wait for each other, so outbox `slow`'s smaller id can appear after `fast`'s."""
    engine = postgres_engine
    tally = DeliveryTally()
    put(engine, "seed", ItemStatus.SENT, outbox="slow")
    read_backlog(engine, tally)
    put(engine, "late", ItemStatus.QUEUED, outbox="slow")

    with engine.connect() as slow:
        slow.execute(
            insert(EVENTS).values(
                item_id="outbox/slow/late",
                outbox="slow",
                seq=2,
                type=ItemEventType.SENT,
                status=ItemStatus.SENT,
                at=T0,
                attempt=1,
            )
        )  # its id is taken now, not yet visible
        put(engine, "quick", ItemStatus.SENT, outbox="fast")
        middle = read_backlog(engine, tally)
        slow.commit()
    ids = [event.id for event in store.item_events(engine, "outbox/slow/late")]
    quick_id = store.item_events(engine, "outbox/fast/quick")[0].id
    end = read_backlog(engine, tally)

    assert ids[-1] < quick_id  # the late event's id is smaller, and it became visible later
    assert middle.sent == {("slow", "d"): 1, ("fast", "d"): 1}
    assert end.sent == {("slow", "d"): 2, ("fast", "d"): 1}


def plan(engine: Engine, statement: Any) -> str:
    """The database's plan for `statement`, as text."""
    sql = str(statement.compile(engine, compile_kwargs={"literal_binds": True}))
    with engine.connect() as connection:
        if engine.dialect.name == "sqlite":
            rows = connection.execute(text(f"EXPLAIN QUERY PLAN {sql}")).all()
            return "\n".join(str(row[-1]) for row in rows)
        # Tables this small are read whole whatever the indexes: ask what it does without that.
        connection.execute(text("SET enable_seqscan = off"))
        return "\n".join(row[0] for row in connection.execute(text(f"EXPLAIN {sql}")))


def test_each_outbox_newest_event_comes_from_the_outbox_index(engine: Engine) -> None:
    put(engine, "a", ItemStatus.SENT, outbox="quiet")
    put(engine, "b", ItemStatus.SENT, outbox="busy")

    newest = plan(engine, backlog.newest_event_per_outbox())
    with engine.connect() as connection:
        found = dict(connection.execute(backlog.newest_event_per_outbox()).all())

    # Never by walking the primary key backwards through the other outboxes' newer events.
    assert "ix_outbox_events_outbox_id" in newest and "pkey" not in newest
    assert found == {
        outbox: store.item_events(engine, f"outbox/{outbox}/{key}")[-1].id
        for outbox, key in (("quiet", "a"), ("busy", "b"))
    }
