"""A delivery report after its item's report window is recorded in the item's row: the
recipient's status, the `delivery` summary and a `delivery-report` event, with the workflow's
merge rule (a repeat or an older report changes nothing). Only a sent item of the destination
holding the report's message, on a recipient it sent to, and never an erased one. On SQLite and
PostgreSQL."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from durable_outbox_temporal.contract.item import (
    DeliveryOutcome,
    DeliveryReport,
    ItemProjection,
    ItemStatus,
    Recipient,
    RecipientStatus,
    apply_delivery_report,
)
from sqlalchemy import Engine

from readmodel import delivery_reports, erasure, store
from readmodel.delivery_reports import record_late_report
from tests.readmodel.conftest import EngineFactory
from tests.readmodel.test_store import ACCEPTED, ENQUEUED, SENT, T0, view

ITEM = "outbox/o/k"
MESSAGE = "message-1"
LATER = T0 + timedelta(days=4)


def sent_item(engine: Engine, status: ItemStatus = ItemStatus.SENT) -> None:
    recipients = [
        Recipient("ada@example.com", RecipientStatus.DELIVERED, "Delivered", T0),
        Recipient("bob@example.com"),
    ]
    store.apply_projection(
        engine,
        ItemProjection(
            view(
                "k",
                3,
                status,
                provider_message_id=MESSAGE,
                recipients=recipients,
                delivery=DeliveryOutcome.PENDING,
                finished_at=T0,
            ),
            [ENQUEUED, ACCEPTED, SENT],
        ),
    )


def report(recipient: str, status: RecipientStatus, at_s: int = 10) -> DeliveryReport:
    return DeliveryReport(
        MESSAGE, recipient, status, T0 + timedelta(seconds=at_s), f"{status.value} late"
    )


def test_a_late_bounce_is_recorded_once(engine: Engine) -> None:
    sent_item(engine)

    assert record_late_report(
        engine, "d", ITEM, report("Bob@example.com", RecipientStatus.BOUNCED), LATER
    )
    # The same report again, and an older one: nothing changes.
    assert not record_late_report(
        engine, "d", ITEM, report("bob@example.com", RecipientStatus.BOUNCED), LATER
    )
    assert not record_late_report(
        engine, "d", ITEM, report("bob@example.com", RecipientStatus.DELIVERED, at_s=5), LATER
    )

    record = store.get_item(engine, ITEM)
    assert record is not None
    item = record.view
    assert [(r.address, r.status, r.detail) for r in item.recipients] == [
        ("ada@example.com", RecipientStatus.DELIVERED, "Delivered"),
        ("bob@example.com", RecipientStatus.BOUNCED, "bounced late"),
    ]
    assert item.delivery is DeliveryOutcome.BOUNCED
    assert item.last_event_seq == 4 and item.updated_at == LATER
    assert item.status is ItemStatus.SENT and item.finished_at == T0
    events = store.item_events(engine, ITEM)
    assert [(e.seq, e.type.value, e.detail) for e in events][-1] == (
        4,
        "delivery-report",
        "bob@example.com: bounced (bounced late)",
    )
    assert len(events) == 4


@pytest.mark.parametrize(
    ("destination", "late"),
    [
        ("other", report("bob@example.com", RecipientStatus.BOUNCED)),
        ("d", report("eve@example.com", RecipientStatus.BOUNCED)),
        (
            "d",
            DeliveryReport("message-0", "bob@example.com", RecipientStatus.BOUNCED, LATER),
        ),
    ],
    ids=["another-destination", "another-recipient", "another-message"],
)
def test_a_report_not_the_items_changes_nothing(
    engine: Engine, destination: str, late: DeliveryReport
) -> None:
    sent_item(engine)

    assert not record_late_report(engine, destination, ITEM, late, LATER)
    assert not record_late_report(engine, "d", "outbox/o/none", late, LATER)

    record = store.get_item(engine, ITEM)
    assert record is not None and record.view.last_event_seq == 3
    assert [r.address for r in record.view.recipients] == ["ada@example.com", "bob@example.com"]


def test_only_a_sent_items_row_takes_one(engine: Engine) -> None:
    # A failed item's row is a redrive's to continue: a seq taken here would meet the new run's.
    sent_item(engine, ItemStatus.FAILED)

    assert not record_late_report(
        engine, "d", ITEM, report("bob@example.com", RecipientStatus.BOUNCED), LATER
    )

    record = store.get_item(engine, ITEM)
    assert record is not None and record.view.last_event_seq == 3


def test_an_erased_item_takes_none_and_gets_no_address_back(engine: Engine) -> None:
    sent_item(engine)
    assert erasure.erase_item(engine, ITEM, ["sent"]) is not None

    for address in ("bob@example.com", erasure.ERASED):
        assert not record_late_report(
            engine, "d", ITEM, report(address, RecipientStatus.BOUNCED), LATER
        )

    record = store.get_item(engine, ITEM)
    assert record is not None and record.view.last_event_seq == 3
    assert {r.address for r in record.view.recipients} == {erasure.ERASED}


def test_late_reports_on_one_item_at_once_are_each_recorded(
    engine_factory: EngineFactory, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reports on two recipients racing from several API processes: both recorded, each with
    its own event, the seq dense. Each write takes a while between its read of the row and its
    write (as on a loaded machine), so writers that did not wait for each other would read the
    same seq and all but one would find it taken."""
    sent_item(engine)

    def slowly(recipients: list[Recipient], report: DeliveryReport) -> Recipient | None:
        time.sleep(0.2)
        return apply_delivery_report(recipients, report)

    monkeypatch.setattr(delivery_reports, "apply_delivery_report", slowly)
    engines = [engine_factory("readmodel") for _ in range(4)]
    barrier = threading.Barrier(len(engines))
    results: list[bool] = []

    def deliver(index: int) -> None:
        address = "ada@example.com" if index % 2 else "bob@example.com"
        barrier.wait()
        results.append(
            record_late_report(
                engines[index], "d", ITEM, report(address, RecipientStatus.BOUNCED, 20), LATER
            )
        )

    threads = [threading.Thread(target=deliver, args=(i,)) for i in range(len(engines))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sorted(results) == [False, False, True, True]
    record = store.get_item(engine, ITEM)
    assert record is not None
    assert {r.status for r in record.view.recipients} == {RecipientStatus.BOUNCED}
    assert [e.seq for e in store.item_events(engine, ITEM)] == [1, 2, 3, 4, 5]
    assert record.view.last_event_seq == 5
