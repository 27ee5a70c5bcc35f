"""Delivery reports signalled to the item workflow (time-skipping server, real fake provider)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from durable_outbox_temporal.contract.ids import provider_idempotency_key
from durable_outbox_temporal.contract.item import (
    DeliveryOutcome,
    DeliveryReport,
    ItemStatus,
    RecipientStatus,
)
from durable_outbox_temporal.destinations import Destination

from readmodel import store
from tests.conftest import ACS_ACCESS_KEY, email_destination, unique_name
from tests.workflows.test_outbox_item import wait_for_status

TWO_RECIPIENTS = {
    "senderAddress": "noreply@example.com",
    "recipients": {
        "to": [{"address": "ada@example.com"}],
        "cc": [{"address": "bob@example.com"}],
    },
    "content": {"subject": "Hello", "plainText": "Hi"},
}
HOUR = 3600


def reported(
    item_id: str, recipient: str, status: RecipientStatus, seconds: float = 0
) -> DeliveryReport:
    return DeliveryReport(
        message_id=provider_idempotency_key(item_id),
        recipient=recipient,
        status=status,
        at=datetime(2026, 11, 23, tzinfo=UTC) + timedelta(seconds=seconds),
        detail=f"{status.value} (test)",
    )


async def sent_and_listening(stack_factory: Any, fake_provider: Any, key: str) -> tuple[Any, Any]:
    """An email to ada and bob, sent and listening an hour for their reports."""
    destination = email_destination(fake_provider, report_window_s=HOUR)
    stack = await stack_factory(destination)
    item = await stack.enqueue(destination, TWO_RECIPIENTS, key=key)
    await wait_for_status(stack, key, status=ItemStatus.SENT)
    return stack, item


def report_events(stack: Any, item_id: str) -> list[str]:
    return [
        event.detail or ""
        for event in store.item_events(stack.engine, item_id)
        if event.type == "delivery-report"
    ]


async def test_sent_item_records_each_recipients_report_and_ends_when_all_settle(
    stack_factory, fake_provider
) -> None:
    stack, item = await sent_and_listening(stack_factory, fake_provider, "reports-1")

    listening = await stack.outbox.status("tests", "reports-1")
    assert [(r.address, r.status) for r in listening.recipients] == [
        ("ada@example.com", RecipientStatus.PENDING),
        ("bob@example.com", RecipientStatus.PENDING),
    ]
    assert listening.delivery is DeliveryOutcome.PENDING

    ada = reported(item.item_id, "ada@example.com", RecipientStatus.DELIVERED)
    assert await stack.outbox.report_delivery(item.item_id, ada)
    assert await stack.outbox.report_delivery(item.item_id, ada)  # a duplicate
    bob = reported(item.item_id, "bob@example.com", RecipientStatus.BOUNCED)
    assert await stack.outbox.report_delivery(item.item_id, bob)
    view = await stack.result(item.item_id)

    assert view.status is ItemStatus.SENT
    assert [(r.address, r.status, r.detail) for r in view.recipients] == [
        ("ada@example.com", RecipientStatus.DELIVERED, "delivered (test)"),
        ("bob@example.com", RecipientStatus.BOUNCED, "bounced (test)"),
    ]
    assert view.delivery is DeliveryOutcome.BOUNCED
    # Ended on the last report, not at the window's end an hour later.
    closed = (await stack.client.get_workflow_handle(item.item_id).describe()).close_time
    assert view.finished_at is not None and closed is not None
    assert closed - view.finished_at < timedelta(minutes=5)
    assert report_events(stack, item.item_id) == [
        "ada@example.com: delivered (delivered (test))",
        "bob@example.com: bounced (bounced (test))",
    ]
    row = store.get_item(stack.engine, item.item_id)
    assert row is not None and row.view.recipients == view.recipients
    assert row.view.delivery is DeliveryOutcome.BOUNCED
    # Once the workflow has ended, a report is refused as late rather than lost silently.
    assert not await stack.outbox.report_delivery(item.item_id, ada)


async def test_reports_out_of_order_end_at_the_newest(stack_factory, fake_provider) -> None:
    stack, item = await sent_and_listening(stack_factory, fake_provider, "reports-order")

    for each in (
        reported(item.item_id, "ada@example.com", RecipientStatus.DELIVERED, seconds=10),
        reported(item.item_id, "ada@example.com", RecipientStatus.QUARANTINED, seconds=5),
        reported(item.item_id, "bob@example.com", RecipientStatus.DELIVERED, seconds=7),
    ):
        await stack.outbox.report_delivery(item.item_id, each)
    view = await stack.result(item.item_id)

    assert {r.address: r.status for r in view.recipients} == {
        "ada@example.com": RecipientStatus.DELIVERED,
        "bob@example.com": RecipientStatus.DELIVERED,
    }
    assert view.delivery is DeliveryOutcome.DELIVERED
    assert len(report_events(stack, item.item_id)) == 2


async def test_report_before_the_poll_sees_success_is_kept(stack_factory, fake_provider) -> None:
    destination = email_destination(fake_provider, report_window_s=HOUR, poll_interval_s=30)
    stack = await stack_factory(destination)
    item = await stack.enqueue(
        destination, TWO_RECIPIENTS, key="reports-early", script=[{"running_polls": 3}]
    )
    await wait_for_status(stack, "reports-early", status=ItemStatus.SENDING)

    for address in ("ada@example.com", "bob@example.com"):
        report = reported(item.item_id, address, RecipientStatus.DELIVERED)
        await stack.outbox.report_delivery(item.item_id, report)
    sending = await stack.outbox.status("tests", "reports-early")
    view = await stack.result(item.item_id)

    assert sending.status is ItemStatus.SENDING
    assert sending.delivery is DeliveryOutcome.DELIVERED
    assert view.status is ItemStatus.SENT and view.poll_count == 4
    assert view.delivery is DeliveryOutcome.DELIVERED


async def test_report_before_the_accept_is_applied_once_accepted(
    stack_factory, fake_provider
) -> None:
    destination = email_destination(fake_provider, report_window_s=HOUR)
    stack = await stack_factory(destination)
    # The first submit is throttled for a minute: the report arrives while the item is queued.
    item = await stack.enqueue(
        destination,
        TWO_RECIPIENTS,
        key="reports-before-accept",
        script=[{"status": 429, "retry_after": "60"}],
    )
    await wait_for_status(stack, "reports-before-accept", attempts=1, status=ItemStatus.QUEUED)

    early = reported(item.item_id, "ada@example.com", RecipientStatus.BOUNCED)
    await stack.outbox.report_delivery(item.item_id, early)
    late = reported(item.item_id, "bob@example.com", RecipientStatus.DELIVERED)
    await stack.outbox.report_delivery(item.item_id, late)
    view = await stack.result(item.item_id)

    assert view.attempts == 2
    assert {r.address: r.status for r in view.recipients} == {
        "ada@example.com": RecipientStatus.BOUNCED,
        "bob@example.com": RecipientStatus.DELIVERED,
    }


async def test_pending_recipients_stop_being_awaited_when_the_window_ends(
    stack_factory, fake_provider
) -> None:
    destination = email_destination(fake_provider, report_window_s=72 * HOUR)
    stack = await stack_factory(destination)
    item = await stack.enqueue(destination, TWO_RECIPIENTS, key="reports-window")
    await wait_for_status(stack, "reports-window", status=ItemStatus.SENT)
    ada = reported(item.item_id, "ada@example.com", RecipientStatus.DELIVERED)
    await stack.outbox.report_delivery(item.item_id, ada)

    view = await stack.result(item.item_id)  # the server skips the 72 h timer

    closed = (await stack.client.get_workflow_handle(item.item_id).describe()).close_time
    assert view.finished_at is not None and closed is not None
    assert closed - view.finished_at >= timedelta(hours=72)
    assert {r.address: r.status for r in view.recipients} == {
        "ada@example.com": RecipientStatus.DELIVERED,
        "bob@example.com": RecipientStatus.PENDING,
    }
    assert view.delivery is DeliveryOutcome.PENDING


async def test_a_report_for_another_message_changes_nothing(stack_factory, fake_provider) -> None:
    stack, item = await sent_and_listening(stack_factory, fake_provider, "reports-stray")

    stray = reported(item.item_id, "ada@example.com", RecipientStatus.BOUNCED)
    stray.message_id = provider_idempotency_key(item.item_id, generation=1)
    await stack.outbox.report_delivery(item.item_id, stray)
    view = await stack.outbox.status("tests", "reports-stray")

    assert view.delivery is DeliveryOutcome.PENDING
    assert report_events(stack, item.item_id) == []


@pytest.mark.parametrize("window", ["zero", "unset-without-events-secret"])
async def test_no_window_tracks_no_recipients(stack_factory, fake_provider, window) -> None:
    # Unset on a destination no report can reach (no `events_secret`): nothing listens either.
    destination = (
        email_destination(fake_provider, report_window_s=0)
        if window == "zero"
        else without_reports(fake_provider)
    )
    stack = await stack_factory(destination)
    item = await stack.enqueue(destination, TWO_RECIPIENTS, key=unique_name("reports-off"))

    view = await stack.result(item.item_id)

    assert view.status is ItemStatus.SENT
    assert view.recipients == [] and view.delivery is None


async def test_delivery_report_signal_sent_as_raw_json_by_any_client(
    stack_factory, fake_provider
) -> None:
    stack, item = await sent_and_listening(stack_factory, fake_provider, "reports-raw")
    handle = stack.client.get_workflow_handle(item.item_id)

    # Plain JSON, as a Go or TypeScript service would send it: no Python types involved.
    for address in ("ada@example.com", "bob@example.com"):
        await handle.signal(
            "delivery_report",
            {
                "message_id": provider_idempotency_key(item.item_id),
                "recipient": address,
                "status": "delivered",
                "at": "2026-11-23T10:00:00Z",
                "detail": "250 OK",
            },
        )
    view = await stack.result(item.item_id)

    assert view.delivery is DeliveryOutcome.DELIVERED


def without_reports(fake_provider: Any, **fields: Any) -> Destination:
    """An email destination with no `events_secret` and no `report_window_s` set (the
    tests' `email_destination` sets the window to 0 itself)."""
    settings = {"endpoint": fake_provider.url, "access_key": ACS_ACCESS_KEY}
    return Destination(
        name=unique_name("no-reports"),
        provider="acs-email",
        settings=settings,
        submit_rate=100.0,
        poll_rate=100.0,
        poll_interval_s=1.0,
        **fields,
    )
