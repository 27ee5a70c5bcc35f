"""Erasing an ended item leaves no copy of its personal data in the read model: payload and its
digest, recipients' addresses (statuses kept), event details and the last error naming them,
attempt headers and bodies, claim-check blob, the relay's row, its debounce carrier's copy; a
carrier still under way refuses the erase. On SQLite and PostgreSQL, sealed and plain."""

from __future__ import annotations

from datetime import timedelta

import pytest
from durable_outbox_temporal.codec import EncryptionCodec, new_key_setting
from durable_outbox_temporal.contract.debounce import COLLECTED_KEY
from durable_outbox_temporal.contract.item import (
    ItemEvent,
    ItemEventType,
    ItemProjection,
    ItemStatus,
    RecipientStatus,
)
from durable_outbox_temporal.contract.retention import RetentionRule
from durable_outbox_temporal.contract.sealed_columns import seal_with
from durable_outbox_temporal.transactional import enqueue_in
from sqlalchemy import Engine, insert, select, update
from sqlalchemy.orm import Session

from readmodel import attempts, erasure, store, subjects
from readmodel.models import OUTBOX_PENDING, PAYLOAD_BLOBS
from readmodel.retention import prune_rows
from tests.readmodel.test_sealing import raw_text, write_everything
from tests.readmodel.test_store import T0, view

ERASABLE = ["sent", "failed", "cancelled", "superseded"]
DAY = timedelta(days=1)


@pytest.mark.parametrize("sealed", [False, True], ids=["plain", "sealed"])
def test_an_erased_item_leaves_no_copy(engine: Engine, sealed: bool) -> None:
    # Each written with the relay's `outbox_pending` row of its key (`enqueue_in`).
    codec = EncryptionCodec.from_setting(new_key_setting("k1")) if sealed else None
    write_everything(engine, "grace", key="gone", codec=codec)
    write_everything(engine, "kept", key="other", codec=codec)
    with engine.begin() as connection:
        connection.execute(
            insert(PAYLOAD_BLOBS).values(
                digest="d" * 64, data=b"grace", size=5, stored_at=T0, workflow_id="outbox/o/gone"
            )
        )

    erased_at = erasure.erase_item(engine, "outbox/o/gone", ERASABLE)

    assert erased_at is not None
    at_rest = raw_text(engine)
    if not sealed:  # (the aggregate's own "grace" is not the item's to erase)
        assert "grace@example.com" not in at_rest and "250 grace" not in at_rest
        assert "sha256:grace" not in at_rest and "sha256:kept" in at_rest
        assert "kept@example.com" in at_rest
    seal_with(engine, None if codec is None else codec.value_keys())
    record = store.get_item(engine, "outbox/o/gone")
    assert record is not None and record.payload is None
    assert record.view.status is ItemStatus.SENT
    [recipient] = record.view.recipients
    assert (recipient.address, recipient.status, recipient.detail) == (
        erasure.ERASED,
        RecipientStatus.DELIVERED,
        None,
    )
    assert record.view.last_error == f"bounced {erasure.ERASED}"
    assert record.view.payload_hash == erasure.ERASED  # a digest would confirm a guess of it
    details = [event.detail for event in store.item_events(engine, "outbox/o/gone")]
    assert details == [None, f"{erasure.ERASED}: ok"]
    [attempt] = attempts.read_attempts(engine, "outbox/o/gone")
    assert attempt["response"]["body"] is None and attempt["request"]["headers"] == {}
    assert attempt["response"]["status"] == 202
    with engine.connect() as connection:
        assert connection.execute(select(PAYLOAD_BLOBS.c.digest)).all() == []
        relayed = connection.execute(select(OUTBOX_PENDING.c.key)).scalars().all()
    assert relayed == ["other"]  # the relay's row of its key went; other keys' rows stay
    other = store.get_item(engine, "outbox/o/other")
    assert other is not None and other.payload == {"to": "kept@example.com", "subject": "kept"}
    assert erasure.erase_item(engine, "outbox/o/gone", ERASABLE) == erased_at


def member(engine: Engine, key: str, payload: dict[str, object], carrier: str) -> None:
    store.apply_projection(
        engine,
        ItemProjection(
            view(key, 1, ItemStatus.SUPERSEDED, superseded_by=f"outbox/o/{carrier}"),
            [ItemEvent(1, ItemEventType.SUPERSEDED, ItemStatus.SUPERSEDED, T0)],
            T0,
            payload=payload,
        ),
    )


def carrier(engine: Engine, key: str, payload: dict[str, object], status: ItemStatus) -> None:
    store.apply_projection(
        engine,
        ItemProjection(
            view(key, 1, status),
            [ItemEvent(1, ItemEventType.ENQUEUED, status, T0)],
            T0,
            payload=payload,
        ),
    )


def test_a_debounce_members_copy_in_its_carrier_goes_with_it(engine: Engine) -> None:
    ada, bob = {"to": "ada@example.com"}, {"to": "bob@example.com"}
    member(engine, "ada", ada, carrier="collected")
    member(engine, "bob", bob, carrier="collected")
    carrier(engine, "collected", {COLLECTED_KEY: [ada, bob]}, ItemStatus.SENT)
    member(engine, "latest", bob, carrier="latest-carrier")
    carrier(engine, "latest-carrier", bob, ItemStatus.SENT)

    assert erasure.erase_item(engine, "outbox/o/ada", ERASABLE) is not None
    assert erasure.erase_item(engine, "outbox/o/latest", ERASABLE) is not None

    collected = store.get_item(engine, "outbox/o/collected")
    assert collected is not None and collected.payload == {COLLECTED_KEY: [bob]}
    latest = store.get_item(engine, "outbox/o/latest-carrier")
    assert latest is not None and latest.payload is None
    assert attempts.erased_at(engine, "outbox/o/latest-carrier") is not None  # never redriven


def test_a_carrier_still_under_way_refuses_the_erase(engine: Engine) -> None:
    ada = {"to": "ada@example.com"}
    member(engine, "ada", ada, carrier="running")
    carrier(engine, "running", {COLLECTED_KEY: [ada]}, ItemStatus.SENDING)

    with pytest.raises(erasure.CarrierUnderWay, match="'outbox/o/running'.*sending"):
        erasure.erase_item(engine, "outbox/o/ada", ERASABLE)

    kept = store.get_item(engine, "outbox/o/ada")
    assert kept is not None and kept.payload == ada
    assert attempts.erased_at(engine, "outbox/o/ada") is None


def test_a_pruned_items_key_memory_is_found_by_prefix_and_its_digest_erased(
    engine: Engine,
) -> None:
    # Rows pruned by retention leave each key's memory and subject link; a prefix still finds
    # the key (in key order with the rows left, a page at a time), and the erase takes the
    # digest of its request, which would confirm a guess of the payload.
    for key, finished in (("a-1", T0), ("a-2", T0 + 9 * DAY), ("a-3", T0), ("b-1", T0)):
        store.apply_projection(
            engine,
            ItemProjection(
                view(key, 1, ItemStatus.SENT, finished_at=finished, payload_hash=f"sha256:{key}"),
                [],
                T0,
                payload={"to": f"{key}@example.com"},
            ),
        )
    [ada] = subjects.digests(engine, ["ada"])
    subjects.record(engine, [("outbox/o/a-3", "o", "a-3", ada)])
    rule = RetentionRule("d", None, payload_retention_s=0, item_retention_s=DAY.total_seconds())
    assert prune_rows(engine, rule, T0 + DAY, limit=10).pruned == 3

    found = erasure.keys_with_prefix(engine, "o", "a-", after=None, limit=2)
    assert found == ["a-1", "a-2"]
    assert erasure.keys_with_prefix(engine, "o", "a-", after="a-2", limit=2) == ["a-3"]
    assert erasure.keys_with_prefix(engine, "p", "a-", after=None, limit=2) == []

    erased_at = erasure.erase_remembered_key(engine, "outbox/o/a-3")

    assert erased_at is not None
    assert "sha256:a-3" not in raw_text(engine) and "sha256:a-1" in raw_text(engine)
    remembered = store.item_or_remembered_key(engine, "outbox/o/a-3")
    assert remembered == store.RememberedKey(ItemStatus.SENT, erasure.ERASED)
    assert subjects.keys_of(engine, "o", ada, after=None, limit=5) == []
    assert attempts.erased_at(engine, "outbox/o/a-3") == erased_at
    assert erasure.erase_remembered_key(engine, "outbox/o/a-3") == erased_at  # a repeat
    # A key with a row, or none at all, has no memory to erase.
    assert erasure.erase_remembered_key(engine, "outbox/o/a-2") is None
    assert erasure.erase_remembered_key(engine, "outbox/o/nothing") is None


def test_an_item_erase_that_meets_a_pruned_row_erases_its_key_memory(engine: Engine) -> None:
    # The erase read the row, then retention pruned it before the erase's update: the update
    # found no row, which read as "queued again (redriven)", and the digest stayed.
    store.apply_projection(
        engine,
        ItemProjection(
            view("a-1", 1, ItemStatus.SENT, finished_at=T0, payload_hash="sha256:a-1"),
            [],
            T0,
            payload={"to": "a-1@example.com"},
        ),
    )
    rule = RetentionRule("d", None, payload_retention_s=0, item_retention_s=DAY.total_seconds())
    assert prune_rows(engine, rule, T0 + DAY, limit=10).pruned == 1

    erased_at = erasure.erase_item(engine, "outbox/o/a-1", ERASABLE, T0 + 2 * DAY)

    assert erased_at == T0 + 2 * DAY
    assert "sha256:a-1" not in raw_text(engine)
    remembered = store.item_or_remembered_key(engine, "outbox/o/a-1")
    assert remembered == store.RememberedKey(ItemStatus.SENT, erasure.ERASED)
    assert erasure.erase_item(engine, "outbox/o/nothing", ERASABLE) is None


def test_a_relay_row_the_outbox_refused_is_found_by_prefix_and_erased(engine: Engine) -> None:
    # Refused for good, it made no item: its payload stayed in `outbox_pending` for good, where
    # no erasure found it. A pending row is the application's accepted work and stays.
    with Session(engine) as session, session.begin():
        for key in ("c7-refused", "c7-pending", "c8-refused"):
            enqueue_in(
                session, outbox="o", destination="d", payload={"to": f"{key}@example.com"}, key=key
            )
    with engine.begin() as connection:
        connection.execute(
            update(OUTBOX_PENDING)
            .where(OUTBOX_PENDING.c.key.in_(["c7-refused", "c8-refused"]))
            .values(status=erasure.REFUSED, last_error="refused: not E.164")
        )

    assert erasure.keys_with_prefix(engine, "o", "c7-", after=None, limit=5) == ["c7-refused"]
    assert erasure.erase_refused_relay_rows(engine, "o", "c7-refused") == 1
    assert erasure.erase_refused_relay_rows(engine, "o", "c7-pending") == 0
    assert erasure.erase_refused_relay_rows(engine, "o", "c7-refused") == 0  # gone already

    with engine.connect() as connection:
        left = sorted(connection.execute(select(OUTBOX_PENDING.c.key)).scalars())
    assert left == ["c7-pending", "c8-refused"]
