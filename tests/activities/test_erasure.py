"""An erase batch's page over the read model: the items a key prefix or a subject selects, in
key order after the cursor, each erased as `DELETE .../payload` would; an item under way (or
in its delivery reports' window) is skipped with why; other outboxes and prefixes untouched."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from durable_outbox_temporal.contract.erasure import ErasePageRequest
from durable_outbox_temporal.contract.item import (
    DeliveryOutcome,
    ItemEventType,
    ItemProjection,
    ItemStatus,
)
from durable_outbox_temporal.contract.retention import RetentionRule
from durable_outbox_temporal.destinations import DestinationRegistry
from durable_outbox_temporal.transactional import enqueue_in
from sqlalchemy import Engine, update
from sqlalchemy.orm import Session

from activities.erasure import EraseActivities
from readmodel import attempts, erasure, store, subjects
from readmodel.db import create_schema, make_engine
from readmodel.erasure import ERASED
from readmodel.models import OUTBOX_PENDING
from readmodel.retention import prune_rows
from tests.conftest import webhook_destination
from tests.readmodel.test_store import T0, event, view

DAY = timedelta(days=1)


@pytest.fixture
def engine(tmp_path: Path) -> Engine:
    engine = make_engine(f"sqlite:///{tmp_path / 'readmodel.db'}")
    create_schema(engine)
    return engine


def item(engine: Engine, key: str, status: ItemStatus, outbox: str = "o", **fields: object) -> None:
    store.apply_projection(
        engine,
        ItemProjection(
            view(key, 1, status, outbox, **fields),
            [event(1, ItemEventType.ENQUEUED, status)],
            payload={"to": f"{key}@example.com"},
        ),
    )


def page(activities: EraseActivities, **request: Any) -> list[tuple[int, list[tuple[str, str]]]]:
    """Every page to the end, as the batch runs them: (erased, [(skipped key, why)]) per page;
    a why is cut at its first colon."""
    results = []
    cursor = None
    while True:
        fields = {"key_prefix": None, "subject_digest": None, **request, "cursor": cursor}
        result = activities._erase_page(ErasePageRequest(**fields))
        results.append((result.erased, [(s.key, s.reason.split(":")[0]) for s in result.skipped]))
        cursor = result.next_cursor
        if cursor is None:
            return results


def test_a_prefix_erases_the_ended_items_in_pages_and_skips_those_under_way(
    engine: Engine,
) -> None:
    item(engine, "ada-1", ItemStatus.SENT)
    item(engine, "ada-2", ItemStatus.QUEUED)
    item(engine, "ada-3", ItemStatus.FAILED)
    item(engine, "bob-1", ItemStatus.SENT)
    item(engine, "ada-1", ItemStatus.SENT, outbox="p")
    activities = EraseActivities(engine, DestinationRegistry({}))

    results = page(activities, outbox="o", key_prefix="ada-", limit=2)

    assert results == [(1, [("ada-2", "item 'ada-2' is queued")]), (1, [])]
    erased = {key for key in ("ada-1", "ada-3") if attempts.erased_at(engine, f"outbox/o/{key}")}
    assert erased == {"ada-1", "ada-3"}
    for kept in ("outbox/o/ada-2", "outbox/o/bob-1", "outbox/p/ada-1"):
        record = store.get_item(engine, kept)
        assert record is not None and record.payload is not None, kept
    # Run again (a retried page, a second batch): nothing new, the queued one still skipped.
    assert page(activities, outbox="o", key_prefix="ada-", limit=10) == [
        (2, [("ada-2", "item 'ada-2' is queued")])
    ]


def test_a_subject_selects_its_items_and_a_report_window_holds_one_back(
    engine: Engine, fake_provider: Any
) -> None:
    destination = webhook_destination(fake_provider, report_window_s=3600)
    item(engine, "k1", ItemStatus.SENT, destination=destination.name)
    item(
        engine,
        "k2",
        ItemStatus.SENT,
        destination=destination.name,
        delivery=DeliveryOutcome.PENDING,
        finished_at=datetime.now(UTC),
    )
    item(engine, "k3", ItemStatus.SENT, destination=destination.name)
    [ada, bea] = subjects.digests(engine, ["ada", "bea"])
    subjects.record(engine, [("outbox/o/k1", "o", "k1", ada), ("outbox/o/k2", "o", "k2", ada)])
    subjects.record(engine, [("outbox/o/k3", "o", "k3", bea)])
    activities = EraseActivities(engine, DestinationRegistry({destination.name: destination}))

    [(erased, [(key, reason)])] = page(activities, outbox="o", subject_digest=ada)

    assert (erased, key) == (1, "k2") and "takes delivery reports until" in reason
    assert attempts.erased_at(engine, "outbox/o/k1") is not None
    assert attempts.erased_at(engine, "outbox/o/k2") is None
    assert attempts.erased_at(engine, "outbox/o/k3") is None


def test_what_retention_left_of_a_pruned_item_is_erased_by_prefix_and_by_subject(
    engine: Engine,
) -> None:
    # Pruned a year on, each item left its key's memory (with its request's digest) and its
    # subject link; the erasure must reach them, not skip the item as "not ended".
    for key in ("ada-1", "ada-2", "bob-1"):
        item(engine, key, ItemStatus.SENT, finished_at=T0, payload_hash=f"digest-{key}")
    item(engine, "ada-3", ItemStatus.SENT, finished_at=T0 + 300 * DAY)
    [ada] = subjects.digests(engine, ["ada"])
    subjects.record(engine, [("outbox/o/ada-2", "o", "ada-2", ada)])
    rule = RetentionRule("d", None, payload_retention_s=0, item_retention_s=DAY.total_seconds())
    assert prune_rows(engine, rule, T0 + DAY, limit=10).pruned == 3
    activities = EraseActivities(engine, DestinationRegistry({}))

    assert page(activities, outbox="o", key_prefix="ada-", limit=1) == [(1, []), (1, []), (1, [])]
    assert page(activities, outbox="o", subject_digest=ada) == [(0, [])]  # its link went

    assert memory(engine, "ada-1") == memory(engine, "ada-2") == ERASED
    assert memory(engine, "bob-1") == "digest-bob-1"
    assert attempts.erased_at(engine, "outbox/o/ada-1") is not None
    # A key without memory or row: not ended yet, as before.
    [(erased, [(key, _)])] = page(activities, outbox="o", subject_digest=other(engine))
    assert (erased, key) == (0, "zed")


def memory(engine: Engine, key: str) -> str | None:
    remembered = store.item_or_remembered_key(engine, f"outbox/o/{key}")
    assert isinstance(remembered, store.RememberedKey), remembered
    return remembered.payload_hash


def other(engine: Engine) -> str:
    """A subject whose one item has neither a row nor a key memory yet."""
    [zed] = subjects.digests(engine, ["zed"])
    subjects.record(engine, [("outbox/o/zed", "o", "zed", zed)])
    return zed


def test_a_relay_row_the_outbox_refused_is_erased_by_a_prefix_batch(engine: Engine) -> None:
    with Session(engine) as session, session.begin():
        enqueue_in(session, outbox="o", destination="d", payload={"to": "x"}, key="ada-sms")
        session.execute(update(OUTBOX_PENDING).values(status=erasure.REFUSED))
    activities = EraseActivities(engine, DestinationRegistry({}))

    assert page(activities, outbox="o", key_prefix="ada-") == [(1, [])]
    assert page(activities, outbox="o", key_prefix="ada-") == [(0, [])]  # nothing left
