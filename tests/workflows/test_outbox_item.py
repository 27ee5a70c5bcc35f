"""The item workflow end to end on the time-skipping server, against the real fake provider."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from durable_outbox_temporal import CannotCancel, IdempotencyConflict, ItemFailedUseRedrive
from durable_outbox_temporal.contract.ids import provider_idempotency_key
from durable_outbox_temporal.contract.item import ItemStatus
from temporalio.api.enums.v1 import EventType

from readmodel import store
from tests.conftest import email_destination, webhook_destination
from tests.fakes import deliveries, submits

EMAIL = {
    "senderAddress": "noreply@example.com",
    "recipients": {"to": [{"address": "ada@example.com"}]},
    "content": {"subject": "Hello", "plainText": "Hi Ada"},
}


async def timer_durations(stack: Any, item_id: str) -> list[float]:
    handle = stack.client.get_workflow_handle(item_id)
    return [
        event.timer_started_event_attributes.start_to_fire_timeout.ToTimedelta().total_seconds()
        async for event in handle.fetch_history_events()
        if event.event_type == EventType.EVENT_TYPE_TIMER_STARTED
    ]


async def test_email_is_submitted_polled_and_sent(stack_factory, fake_provider) -> None:
    destination = email_destination(fake_provider)
    stack = await stack_factory(destination)
    item = await stack.enqueue(destination, EMAIL, key="welcome-ada", script=[{"running_polls": 2}])

    view = await stack.result(item.item_id)

    assert view.status is ItemStatus.SENT
    assert view.attempts == 1
    assert view.poll_count == 3
    assert view.operation_url and "/emails/operations/" in view.operation_url
    assert await deliveries(fake_provider, item.item_id) == 1
    row = store.get_item(stack.engine, item.item_id)
    assert row is not None and row.view.status == ItemStatus.SENT
    types = [event.type for event in store.item_events(stack.engine, item.item_id)]
    assert types == ["enqueued", "accepted", "polled", "polled", "sent"]


async def test_webhook_is_delivered_synchronously(stack_factory, fake_provider) -> None:
    destination = webhook_destination(fake_provider)
    stack = await stack_factory(destination)
    item = await stack.enqueue(destination, {"event": "order.paid", "order": 42})

    view = await stack.result(item.item_id)

    assert view.status is ItemStatus.SENT
    assert view.poll_count == 0 and view.operation_url is None
    assert await deliveries(fake_provider, item.item_id) == 1


async def test_transient_errors_are_retried_with_backoff(stack_factory, fake_provider) -> None:
    destination = email_destination(fake_provider, backoff_initial_s=10, backoff_jitter=0)
    stack = await stack_factory(destination)
    item = await stack.enqueue(destination, EMAIL, script=[{"status": 503}, {"status": 500}])

    view = await stack.result(item.item_id)

    assert view.status is ItemStatus.SENT
    assert view.attempts == 3
    assert await submits(fake_provider, item.item_id) == 3
    assert await deliveries(fake_provider, item.item_id) == 1
    timers = await timer_durations(stack, item.item_id)
    assert timers[:2] == [10.0, 20.0]  # exponential backoff, no jitter configured


async def test_retry_after_seconds_is_honoured_exactly(stack_factory, fake_provider) -> None:
    destination = email_destination(fake_provider, backoff_initial_s=1)
    stack = await stack_factory(destination)
    item = await stack.enqueue(destination, EMAIL, script=[{"status": 429, "retry_after": "120"}])

    view = await stack.result(item.item_id)

    assert view.status is ItemStatus.SENT
    assert (await timer_durations(stack, item.item_id))[0] == 120.0


async def test_retry_after_http_date_is_never_undercut(stack_factory, fake_provider) -> None:
    destination = email_destination(fake_provider, backoff_initial_s=1)
    stack = await stack_factory(destination)
    not_before = datetime.now(UTC) + timedelta(seconds=300)
    http_date = not_before.strftime("%a, %d %b %Y %H:%M:%S GMT")
    date = not_before.replace(microsecond=0)  # what the header says
    sent_at = datetime.now(UTC)
    item = await stack.enqueue(
        destination, EMAIL, script=[{"status": 503, "retry_after": http_date}]
    )
    # The submit read the date somewhere between the enqueue and the retry's timer: reckoned
    # from the latest it could have been, the wait never falls short of the date; from the
    # earliest, it is not much longer. (A loaded machine can take seconds to get there.)
    for _ in range(600):
        if waits := await timer_durations(stack, item.item_id):
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError("no retry timer after 30 s")
    seen_at = datetime.now(UTC)

    await stack.result(item.item_id)

    first_wait = timedelta(seconds=waits[0])
    assert date - seen_at <= first_wait <= date - sent_at + timedelta(seconds=1), (
        first_wait,
        date - seen_at,
        date - sent_at,
    )


async def test_client_error_fails_permanently_and_keeps_the_error(
    stack_factory, fake_provider
) -> None:
    destination = email_destination(fake_provider)
    stack = await stack_factory(destination)
    item = await stack.enqueue(
        destination, EMAIL, script=[{"status": 400, "body": "bad recipients"}]
    )

    failure = await stack.failure(item.item_id)

    assert failure.type == "PermanentDeliveryError"
    assert "400" in failure.message
    view = await stack.outbox.status("tests", item.key)
    assert view.status is ItemStatus.FAILED
    assert view.attempts == 1
    assert view.last_error and "bad recipients" in view.last_error
    assert await submits(fake_provider, item.item_id) == 1


async def test_max_attempts_ends_failed_with_last_error(stack_factory, fake_provider) -> None:
    destination = email_destination(fake_provider, max_attempts=3)
    stack = await stack_factory(destination)
    item = await stack.enqueue(destination, EMAIL, script=[{"status": 503}] * 5)

    failure = await stack.failure(item.item_id)

    assert failure.type == "DeliveryFailed"
    assert "gave up after 3 attempts" in failure.message
    assert await submits(fake_provider, item.item_id) == 3
    row = store.get_item(stack.engine, item.item_id)
    assert row is not None and row.view.status == ItemStatus.FAILED and row.view.attempts == 3


async def test_operation_failed_at_provider_fails_item(stack_factory, fake_provider) -> None:
    destination = email_destination(fake_provider)
    stack = await stack_factory(destination)
    item = await stack.enqueue(
        destination, EMAIL, script=[{"running_polls": 1, "operation_result": "Failed"}]
    )

    failure = await stack.failure(item.item_id)

    assert failure.type == "DeliveryFailed"
    view = await stack.outbox.status("tests", item.key)
    assert view.status is ItemStatus.FAILED and view.poll_count == 2


async def test_poll_deadline_fails_a_stuck_operation(stack_factory, fake_provider) -> None:
    destination = email_destination(
        fake_provider, poll_interval_s=10, poll_backoff_multiplier=1, poll_deadline_s=60
    )
    stack = await stack_factory(destination)
    item = await stack.enqueue(destination, EMAIL, script=[{"running_polls": 10_000}])

    failure = await stack.failure(item.item_id)

    assert "operation timed out" in failure.message
    view = await stack.outbox.status("tests", item.key)
    assert 5 <= view.poll_count <= 7


async def test_cancel_a_delayed_item(stack_factory, fake_provider) -> None:
    destination = email_destination(fake_provider)
    stack = await stack_factory(destination)
    item = await stack.enqueue(
        destination, EMAIL, not_before=datetime.now(UTC) + timedelta(hours=1)
    )

    view = await stack.outbox.cancel("tests", item.key, reason="customer unsubscribed")

    assert view.status is ItemStatus.CANCELLED
    assert await submits(fake_provider, item.item_id) == 0


async def test_cancel_during_backoff_stops_retries(stack_factory, fake_provider) -> None:
    destination = email_destination(fake_provider, backoff_initial_s=3600)
    stack = await stack_factory(destination)
    item = await stack.enqueue(destination, EMAIL, script=[{"status": 503}])
    await wait_for_status(stack, item.key, attempts=1)

    view = await stack.outbox.cancel("tests", item.key)

    assert view.status is ItemStatus.CANCELLED
    assert await submits(fake_provider, item.item_id) == 1


async def test_cancel_after_delivery_is_refused(stack_factory, fake_provider) -> None:
    destination = webhook_destination(fake_provider)
    stack = await stack_factory(destination)
    item = await stack.enqueue(destination, {"n": 1})
    await stack.result(item.item_id)

    with pytest.raises(CannotCancel):
        await stack.outbox.cancel("tests", item.key)


async def test_duplicate_key_starts_one_workflow_and_one_submit(
    stack_factory, fake_provider
) -> None:
    destination = email_destination(fake_provider)
    stack = await stack_factory(destination)
    first = await stack.enqueue(destination, EMAIL, key="order-7")
    again = await stack.enqueue(destination, EMAIL, key="order-7")
    await stack.result(first.item_id)
    after_success = await stack.enqueue(destination, EMAIL, key="order-7")

    assert (first.created, again.created, after_success.created) == (True, False, False)
    assert first.item_id == again.item_id == after_success.item_id
    assert await submits(fake_provider, first.item_id) == 1


async def test_same_key_with_other_payload_conflicts(stack_factory, fake_provider) -> None:
    destination = email_destination(fake_provider)
    stack = await stack_factory(destination)
    await stack.enqueue(destination, EMAIL, key="k")

    with pytest.raises(IdempotencyConflict):
        await stack.enqueue(destination, {**EMAIL, "senderAddress": "x@example.com"}, key="k")


async def test_failed_item_needs_redrive_then_runs_again(stack_factory, fake_provider) -> None:
    destination = email_destination(fake_provider)
    stack = await stack_factory(destination)
    item = await stack.enqueue(destination, EMAIL, key="to-redrive", script=[{"status": 403}])
    await stack.failure(item.item_id)

    with pytest.raises(ItemFailedUseRedrive):
        await stack.enqueue(destination, EMAIL, key="to-redrive")
    redriven = await stack.outbox.redrive("tests", "to-redrive")
    view = await stack.result(redriven.item_id)

    assert view.status is ItemStatus.SENT
    # The first generation was refused (403); the redrive's own key delivered once.
    assert await deliveries(fake_provider, item.item_id) == 0
    assert await deliveries(fake_provider, item.item_id, generation=1) == 1
    events = store.item_events(stack.engine, item.item_id)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert "redriven" in [e.type for e in events]


async def wait_for_status(
    stack: Any, key: str, *, attempts: int | None = None, status: ItemStatus | None = None
) -> None:
    """Poll the status query (not wall-clock sleeps of the workflow) until a condition holds."""
    for _ in range(200):
        view = await stack.outbox.status("tests", key)
        reached_attempts = attempts is None or (
            view.attempts >= attempts and view.next_attempt_at is not None
        )
        if reached_attempts and (status is None or view.status is status):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"item {key} never reached attempts={attempts} status={status}: {view}")


def test_provider_key_is_stable_per_item() -> None:
    assert provider_idempotency_key("outbox/a/k") == provider_idempotency_key("outbox/a/k")
    assert provider_idempotency_key("outbox/a/k") != provider_idempotency_key("outbox/a/k2")
