"""`poll_in_submit`: the submit activity makes the operation's first poll, so an operation that
is done by then costs one activity (and no timer) instead of two activities and a timer."""

from __future__ import annotations

from typing import Any

from durable_outbox_temporal.contract.item import (
    SUBMIT_ACTIVITY,
    ItemStatus,
    SubmitRequest,
    SubmitResult,
)
from temporalio.api.enums.v1 import EventType

from activities.delivery import _poll_follows
from readmodel import store
from tests.conftest import email_destination
from tests.fakes import deliveries
from tests.workflows.test_activity_projection import LoseFirstReport

EMAIL = {
    "senderAddress": "noreply@example.com",
    "recipients": {"to": [{"address": "ada@example.com"}]},
    "content": {"subject": "Hello", "plainText": "Hi Ada"},
}


def poll_in_submit_destination(fake_provider: Any, **overrides: Any) -> Any:
    settings = {"submit_rate": 50.0, "poll_rate": 100.0, "poll_interval_s": 0.2, **overrides}
    return email_destination(fake_provider, poll_in_submit=True, **settings)


async def history_counts(stack: Any, item_id: str) -> dict[str, int]:
    """Activities scheduled (by type) and timers started in the item's history."""
    counts: dict[str, int] = {}
    async for event in stack.client.get_workflow_handle(item_id).fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            name = event.activity_task_scheduled_event_attributes.activity_type.name
            counts[name] = counts.get(name, 0) + 1
        elif event.event_type == EventType.EVENT_TYPE_TIMER_STARTED:
            counts["timers"] = counts.get("timers", 0) + 1
    return counts


def event_types(stack: Any, item_id: str) -> list[str]:
    return [str(event.type) for event in store.item_events(stack.engine, item_id)]


async def test_an_operation_done_by_the_first_poll_takes_one_activity(
    stack_factory, fake_provider
) -> None:
    destination = poll_in_submit_destination(fake_provider)
    stack = await stack_factory(destination)
    item = await stack.enqueue(destination, EMAIL, key="one-activity")

    view = await stack.result(item.item_id)

    assert view.status is ItemStatus.SENT
    assert view.attempts == 1 and view.poll_count == 1
    assert await history_counts(stack, item.item_id) == {"submit_item": 1}
    assert event_types(stack, item.item_id) == ["enqueued", "accepted", "sent"]
    assert await deliveries(fake_provider, item.item_id) == 1
    row = store.get_item(stack.engine, item.item_id)
    assert row is not None and row.view.status is ItemStatus.SENT and row.view.poll_count == 1


async def test_a_running_operation_is_polled_on_by_poll_activities(
    stack_factory, fake_provider
) -> None:
    destination = poll_in_submit_destination(fake_provider)
    stack = await stack_factory(destination)
    item = await stack.enqueue(
        destination, EMAIL, key="still-running", script=[{"running_polls": 2}]
    )

    view = await stack.result(item.item_id)

    assert view.status is ItemStatus.SENT and view.poll_count == 3
    counts = await history_counts(stack, item.item_id)
    assert counts["submit_item"] == 1 and counts["poll_operation"] == 2
    assert event_types(stack, item.item_id) == ["enqueued", "accepted", "polled", "polled", "sent"]


async def test_an_operation_failed_at_the_first_poll_fails_the_item(
    stack_factory, fake_provider
) -> None:
    destination = poll_in_submit_destination(fake_provider)
    stack = await stack_factory(destination)
    item = await stack.enqueue(
        destination, EMAIL, key="failed-op", script=[{"operation_result": "Failed"}]
    )

    failure = await stack.failure(item.item_id)

    assert failure.type == "DeliveryFailed"
    view = await stack.outbox.status("tests", item.key)
    assert view.status is ItemStatus.FAILED and view.poll_count == 1
    assert await history_counts(stack, item.item_id) == {"submit_item": 1}
    assert event_types(stack, item.item_id)[-1] == "failed"


async def test_without_poll_in_submit_the_poll_is_its_own_activity(
    stack_factory, fake_provider
) -> None:
    destination = email_destination(fake_provider, poll_interval_s=0.2)
    stack = await stack_factory(destination)
    item = await stack.enqueue(destination, EMAIL, key="two-activities")

    view = await stack.result(item.item_id)

    assert view.status is ItemStatus.SENT and view.poll_count == 1
    counts = await history_counts(stack, item.item_id)
    assert counts["submit_item"] == 1 and counts["poll_operation"] == 1


async def test_a_submit_retried_after_its_poll_sends_once_and_numbers_on(
    stack_factory, fake_provider
) -> None:
    destination = poll_in_submit_destination(fake_provider)
    stack = await stack_factory(destination, interceptors=[LoseFirstReport(SUBMIT_ACTIVITY)])
    item = await stack.enqueue(destination, EMAIL, key="lost-report", script=[{"running_polls": 1}])

    view = await stack.result(item.item_id)

    assert view.status is ItemStatus.SENT
    # The provider dedupes the second submit by the item's key: one message.
    assert await deliveries(fake_provider, item.item_id) == 1
    events = store.item_events(stack.engine, item.item_id)
    # What each lost attempt wrote stays as what the provider answered then: the first activity's
    # (its one attempt: `accepted`, its first poll's `polled`), then the workflow's retry's first
    # attempt (lost as well, after the operation had succeeded); the server's retry of that
    # follows, and the workflow's view counts them as its row does. Each numbers its rows after
    # the ones before, so none is dropped over another.
    assert [(event.seq, str(event.type)) for event in events] == [
        (1, "enqueued"),
        (2, "accepted"),
        (3, "polled"),
        (4, "accepted"),
        (5, "sent"),
        (6, "accepted"),
        (7, "sent"),
    ]
    row = store.get_item(stack.engine, item.item_id)
    assert row is not None and row.view.last_event_seq == view.last_event_seq == 7


def submit_request(first_poll_after_s: float | None) -> SubmitRequest:
    return SubmitRequest("d", "item", "key", {}, 1, first_poll_after_s=first_poll_after_s)


def test_the_submit_polls_only_an_operation_it_may_poll_now() -> None:
    accepted = SubmitResult(delivered=False, operation_url="https://p/op/1")

    assert _poll_follows(accepted, submit_request(0.5))
    # The provider asked for a longer wait than planned: the workflow's timer waits it out.
    longer = SubmitResult(delivered=False, operation_url="https://p/op/1", retry_after_s=5)
    assert not _poll_follows(longer, submit_request(0.5))
    assert _poll_follows(
        SubmitResult(delivered=False, operation_url="https://p/op/1", retry_after_s=0.2),
        submit_request(0.5),
    )
    # Nothing to poll: delivered at once.
    assert not _poll_follows(SubmitResult(delivered=True), submit_request(0.5))
