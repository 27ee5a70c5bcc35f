"""Retention in the read model, on SQLite and PostgreSQL: only ended items past the cutoff are
pruned, oldest first, a page at a time; a pruned payload is gone (attempt bodies too) and says
so, and a late projection never brings it back; pruned rows leave their key's memory, which
still answers a repeat; an outbox's own rule and the destination's rule for the others split
the items between them; a redrive's claim and a prune never both win."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from durable_outbox_temporal.codec import EncryptionCodec, new_key_setting
from durable_outbox_temporal.contract.item import (
    ItemEvent,
    ItemEventType,
    ItemProjection,
    ItemStatus,
)
from durable_outbox_temporal.contract.lane import LanePolicy, LaneProjection, LaneStatus, LaneView
from durable_outbox_temporal.contract.retention import RetentionRule
from durable_outbox_temporal.contract.sealed_columns import seal_with
from durable_outbox_temporal.contract.sealing import PREFIX
from sqlalchemy import Engine, func, select, text

from readmodel import attempts, store
from readmodel.lanes import apply_lane_projections, get_lane, list_lanes
from readmodel.models import EVENTS, ITEM_ATTEMPTS, ITEMS
from readmodel.replays import ReplayLink, record_replays, replay_links
from readmodel.retention import prune_idle_lanes, prune_payloads, prune_rows
from tests.readmodel.test_store import T0, view

DAY = timedelta(days=1)
RULE = RetentionRule("d", None, payload_retention_s=DAY.total_seconds(), item_retention_s=0)


def item(
    engine: Engine,
    key: str,
    status: ItemStatus,
    ended_days_ago: float | None,
    outbox: str = "o",
) -> None:
    """An item with a payload, two events and an attempt, that ended that long before T0+10d."""
    finished = None if ended_days_ago is None else T0 + 10 * DAY - ended_days_ago * DAY
    events = [ItemEvent(1, ItemEventType.ENQUEUED, ItemStatus.QUEUED, T0)]
    if status.is_final:
        events.append(ItemEvent(2, ItemEventType.SENT, status, finished or T0))
    store.apply_projection(
        engine,
        ItemProjection(
            view(
                key,
                len(events),
                status,
                outbox=outbox,
                finished_at=finished,
                payload_hash=f"hash-{key}",
            ),
            events,
            T0,
            payload={"to": f"{key}@example.com"},
        ),
    )
    attempts.write_attempts(
        engine,
        f"outbox/{outbox}/{key}",
        [
            attempts.Attempt(
                kind="submit",
                started_at=T0,
                latency_ms=3,
                method="POST",
                host="provider.example",
                path="/emails",
                request_headers={"x-echo": key},
                status=202,
                response_headers={"location": key},
                body=f"{key}@example.com",
            )
        ],
    )


NOW = T0 + 10 * DAY


def test_payloads_of_ended_items_past_the_cutoff_go_oldest_first_a_page_at_a_time(
    engine: Engine,
) -> None:
    item(engine, "old-sent", ItemStatus.SENT, ended_days_ago=5)
    item(engine, "older-failed", ItemStatus.FAILED, ended_days_ago=6)
    item(engine, "recent", ItemStatus.SENT, ended_days_ago=0.5)
    item(engine, "queued", ItemStatus.QUEUED, ended_days_ago=None)
    item(engine, "other-destination", ItemStatus.SENT, ended_days_ago=5)
    with engine.begin() as connection:
        connection.execute(
            ITEMS.update().where(ITEMS.c.key == "other-destination").values(destination="e")
        )
    cutoff = NOW - DAY

    assert prune_payloads(engine, RULE, cutoff, limit=1, now=NOW).pruned == 1
    first = store.get_item(engine, "outbox/o/older-failed")
    assert first is not None and first.payload is None and first.payload_pruned_at == NOW
    assert prune_payloads(engine, RULE, cutoff, limit=1, now=NOW).pruned == 1
    assert prune_payloads(engine, RULE, cutoff, limit=1, now=NOW).pruned == 0

    for key in ("recent", "queued", "other-destination"):
        kept = store.get_item(engine, f"outbox/o/{key}")
        assert kept is not None and kept.payload == {"to": f"{key}@example.com"}, key
        assert kept.payload_pruned_at is None
    [attempt] = attempts.read_attempts(engine, "outbox/o/old-sent")
    assert attempt["request"]["headers"] == {} and attempt["response"]["body"] is None
    assert attempt["response"]["status"] == 202  # what it was stays, not what it said
    # A late projection of the first event, carrying the payload, does not bring it back.
    store.apply_projection(
        engine,
        ItemProjection(
            view("old-sent", 1, ItemStatus.QUEUED),
            [ItemEvent(1, ItemEventType.ENQUEUED, ItemStatus.QUEUED, T0)],
            T0,
            payload={"to": "old-sent@example.com"},
        ),
    )
    again = store.get_item(engine, "outbox/o/old-sent")
    assert again is not None and again.payload is None and again.view.status is ItemStatus.SENT


def test_a_pruned_failed_item_cannot_be_claimed_for_a_redrive(engine: Engine) -> None:
    item(engine, "dead", ItemStatus.FAILED, ended_days_ago=5)
    item(engine, "claimed", ItemStatus.FAILED, ended_days_ago=5)

    assert attempts.claim_redrive(engine, "outbox/o/claimed")
    assert prune_payloads(engine, RULE, NOW - DAY, limit=10, now=NOW).pruned == 1

    assert not attempts.claim_redrive(engine, "outbox/o/dead")
    claimed = store.get_item(engine, "outbox/o/claimed")
    assert claimed is not None and claimed.payload is not None  # redriven: not ended, kept


def test_pruned_rows_go_with_their_events_and_attempts_and_leave_the_key_memory(
    engine: Engine,
) -> None:
    item(engine, "gone", ItemStatus.SENT, ended_days_ago=5)
    item(engine, "failed", ItemStatus.FAILED, ended_days_ago=4)
    item(engine, "kept", ItemStatus.SENT, ended_days_ago=1)
    rule = RetentionRule("d", None, payload_retention_s=0, item_retention_s=2 * DAY.total_seconds())
    # "gone" was a replay of "kept", "failed" the original of a replay not pruned yet.
    record_replays(
        engine,
        [
            ReplayLink("outbox/o/gone", "outbox/o/kept", "o", "r1", "kept", "gone", "d", T0),
            ReplayLink("outbox/o/kept", "outbox/o/failed", "o", "r2", "failed", "kept", "d", T0),
        ],
    )

    assert prune_rows(engine, rule, NOW - 2 * DAY, limit=500, now=NOW).pruned == 2

    assert store.get_item(engine, "outbox/o/gone") is None
    assert store.item_or_remembered_key(engine, "outbox/o/gone") == store.RememberedKey(
        ItemStatus.SENT, "hash-gone"
    )
    assert store.item_or_remembered_key(engine, "outbox/o/failed") == store.RememberedKey(
        ItemStatus.FAILED, "hash-failed"
    )
    assert isinstance(store.item_or_remembered_key(engine, "outbox/o/kept"), store.ItemRecord)
    with engine.connect() as connection:
        events = connection.execute(select(EVENTS.c.item_id).distinct()).scalars().all()
        logged = connection.execute(select(func.count()).select_from(ITEM_ATTEMPTS)).scalar()
    assert events == ["outbox/o/kept"] and logged == 1
    # The replay's link went with its row; the link of one still there stays.
    assert replay_links(engine, "outbox/o/kept") == (
        ReplayLink("outbox/o/kept", "outbox/o/failed", "o", "r2", "failed", "kept", "d", T0),
        [],
    )
    assert prune_rows(engine, rule, NOW - 2 * DAY, limit=500, now=NOW).pruned == 0


def test_a_sealed_digest_moves_into_the_key_memory_as_stored(engine: Engine) -> None:
    # Sealed under k1, then k1 removed: the page still moves the digest (never opened there), and
    # once k1 is back the key memory opens it.
    k1 = EncryptionCodec.from_setting(new_key_setting("k1")).value_keys()
    seal_with(engine, k1)
    item(engine, "gone", ItemStatus.SENT, ended_days_ago=5)
    seal_with(engine, EncryptionCodec.from_setting(new_key_setting("k2")).value_keys())
    rule = RetentionRule("d", None, payload_retention_s=0, item_retention_s=2 * DAY.total_seconds())

    assert prune_rows(engine, rule, NOW - 2 * DAY, limit=500, now=NOW).pruned == 1

    with engine.connect() as connection:
        [stored] = connection.execute(text("SELECT payload_hash FROM outbox_keys")).scalars()
    assert stored.startswith(f"{PREFIX}k1:") and "hash-gone" not in stored
    seal_with(engine, k1)
    assert store.item_or_remembered_key(engine, "outbox/o/gone") == store.RememberedKey(
        ItemStatus.SENT, "hash-gone"
    )


def test_an_outboxs_own_rule_and_the_destinations_split_the_items(engine: Engine) -> None:
    item(engine, "a", ItemStatus.SENT, ended_days_ago=3, outbox="short")
    item(engine, "b", ItemStatus.SENT, ended_days_ago=3, outbox="usual")
    destination_rule = RetentionRule(
        "d", None, 5 * DAY.total_seconds(), 5 * DAY.total_seconds(), ["short"]
    )
    outbox_rule = RetentionRule("d", "short", 2 * DAY.total_seconds(), 2 * DAY.total_seconds())

    assert prune_payloads(engine, destination_rule, NOW - 5 * DAY, limit=10, now=NOW).pruned == 0
    assert prune_payloads(engine, outbox_rule, NOW - 2 * DAY, limit=10, now=NOW).pruned == 1

    short, usual = (
        store.get_item(engine, "outbox/short/a"),
        store.get_item(engine, "outbox/usual/b"),
    )
    assert short is not None and short.payload is None
    assert usual is not None and usual.payload is not None


@pytest.mark.parametrize("phase", [prune_payloads, prune_rows], ids=["payloads", "rows"])
def test_pages_go_on_after_the_last_item_of_the_page_before_ties_included(
    engine: Engine, phase: Any
) -> None:
    """Items ending at the same instant are split across pages by id; each page starts after
    the one before's last item, and the walk ends with an empty page that keeps the cursor."""
    for key in ("a", "b", "c", "d", "e"):
        item(engine, key, ItemStatus.SENT, ended_days_ago=5)
    item(engine, "f", ItemStatus.SENT, ended_days_ago=4)
    item(engine, "kept", ItemStatus.SENT, ended_days_ago=0.5)

    pages, after = [], None
    while True:
        page = phase(engine, RULE, NOW - DAY, limit=2, now=NOW, after=after)
        pages.append((page.pruned, page.more, page.last and page.last.item_id))
        if not page.more:
            break
        after = page.last

    assert pages == [
        (2, True, "outbox/o/b"),
        (2, True, "outbox/o/d"),
        (2, True, "outbox/o/f"),
        (0, False, "outbox/o/f"),
    ]
    assert phase(engine, RULE, NOW - DAY, limit=2, now=NOW).pruned == 0  # from the start: none
    kept = store.get_item(engine, "outbox/o/kept")
    assert kept is not None and kept.payload is not None


def lane(engine: Engine, key: str, status: LaneStatus, idle_days: float) -> None:
    """A lane's row, last changed that many days before NOW."""
    at = NOW - idle_days * DAY
    apply_lane_projections(
        engine,
        [
            LaneProjection(
                LaneView(
                    id=f"lane/o/{key}",
                    outbox="o",
                    ordering_key=key,
                    status=status,
                    policy=LanePolicy.HALT,
                    sent=3,
                    updated_at=at,
                    version=int(at.timestamp() * 1_000_000),
                )
            )
        ],
    )


def test_lanes_idle_past_the_cutoff_go_a_page_at_a_time_and_busy_ones_stay(
    engine: Engine,
) -> None:
    # Every ordering key ever used left a lane's row; an idle one (its workflow ended) goes
    # once it is older than the cutoff, a running or halted one never.
    for n in range(3):
        lane(engine, f"old-{n}", LaneStatus.IDLE, idle_days=5)
    lane(engine, "recent", LaneStatus.IDLE, idle_days=1)
    lane(engine, "halted", LaneStatus.HALTED, idle_days=9)
    lane(engine, "running", LaneStatus.RUNNING, idle_days=9)

    first = prune_idle_lanes(engine, NOW - 2 * DAY, limit=2)
    second = prune_idle_lanes(engine, NOW - 2 * DAY, limit=2, after=first.last)

    assert (first.pruned, first.more, second.pruned, second.more) == (2, True, 1, False)
    left = {view.ordering_key for view in list_lanes(engine, "o")[0]}
    assert left == {"recent", "halted", "running"}
    assert prune_idle_lanes(engine, NOW - 2 * DAY, limit=2).pruned == 0
    # A lane that started again has a row of its new start: the next pages leave it.
    lane(engine, "old-0", LaneStatus.RUNNING, idle_days=0)
    assert prune_idle_lanes(engine, NOW, limit=10).pruned == 1  # "recent" only
    assert get_lane(engine, "o", "old-0") is not None
