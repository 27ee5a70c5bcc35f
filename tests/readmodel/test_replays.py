"""What a replay pages through and the links it leaves, on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from durable_outbox_temporal.contract.item import ItemProjection, ItemStatus
from sqlalchemy import Engine

from readmodel import erasure, store
from readmodel.replays import ReplayLink, erased_among, record_replays, replay_links
from tests.readmodel.test_store import T0, view


def put(engine: Engine, key: str, minute: int, status: ItemStatus, **fields: Any) -> None:
    item = view(key, 3, status, created_at=T0 + timedelta(minutes=minute), **fields)
    store.apply_projection(engine, ItemProjection(view=item, events=[], payload={"n": minute}))


def keys(engine: Engine, **options: object) -> list[str]:
    found: list[str] = []
    cursor = None
    while True:
        records, cursor = store.list_items(engine, "o", cursor=cursor, limit=2, **options)  # type: ignore[arg-type]
        found += [record.view.key for record in records]
        if cursor is None:
            return found


def test_statuses_prefix_and_range_select_and_page_alike_count(engine: Engine) -> None:
    put(engine, "inv-1", 1, ItemStatus.SENT)
    put(engine, "inv-2", 2, ItemStatus.FAILED)
    put(engine, "inv-3", 3, ItemStatus.QUEUED)
    put(engine, "inv-4", 4, ItemStatus.SENT, destination="other")
    put(engine, "rcpt-5", 5, ItemStatus.SENT)
    which = {
        "statuses": ["sent", "failed"],
        "destination": "d",
        "key_prefix": "inv-",
        "created_from": T0 + timedelta(minutes=1),
        "created_to": T0 + timedelta(minutes=5),
    }

    assert keys(engine, **which) == ["inv-2", "inv-1"]
    assert store.count_items(engine, "o", **which) == 2  # type: ignore[arg-type]
    assert keys(engine, statuses=["sent"]) == ["rcpt-5", "inv-4", "inv-1"]
    assert store.count_items(engine, "o") == 5
    # The range is half-open: an item created at `created_to` is out.
    assert keys(engine, created_to=T0 + timedelta(minutes=2)) == ["inv-1"]


def test_links_read_both_ways_and_a_repeat_writes_nothing(engine: Engine) -> None:
    link = ReplayLink(
        replay_item_id="outbox/o/replay:r1:inv-1",
        original_item_id="outbox/o/inv-1",
        outbox="o",
        replay_id="r1",
        original_key="inv-1",
        replay_key="replay:r1:inv-1",
        destination="d",
        replayed_at=T0,
    )
    record_replays(engine, [link])
    record_replays(engine, [link])  # a retried page

    assert replay_links(engine, "outbox/o/inv-1") == (None, [link])
    assert replay_links(engine, "outbox/o/replay:r1:inv-1") == (link, [])


def test_erased_items_are_found_among_a_page(engine: Engine) -> None:
    put(engine, "gone", 1, ItemStatus.SENT)
    put(engine, "kept", 2, ItemStatus.SENT)
    erasure.erase_item(engine, "outbox/o/gone", {"sent"})

    assert erased_among(engine, ["outbox/o/gone", "outbox/o/kept"]) == {"outbox/o/gone"}
    assert erased_among(engine, []) == set()
