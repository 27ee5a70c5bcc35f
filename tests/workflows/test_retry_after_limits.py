"""A provider's `Retry-After` beyond the destination's `max_retry_after_s` fails the item with
an error that says so: no overflowing timer, no silent wait of decades, no undercut wait."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from durable_outbox_temporal import OutboxError
from durable_outbox_temporal.contract.item import DeliveryErrorDetails, ItemErrorType, ItemStatus
from temporalio.api.enums.v1 import EventType
from temporalio.exceptions import ActivityError, ApplicationError, RetryState

from configuration.providers import RETRY_AFTER_LIMIT_S
from tests.conftest import email_destination, webhook_destination
from tests.fakes import submits
from workflows.delivery import _failure

EMAIL = {
    "senderAddress": "noreply@example.com",
    "recipients": {"to": [{"address": "ada@example.com"}]},
    "content": {"subject": "Hello", "plainText": "Hi Ada"},
}
# The year 9999's last second: the furthest date an HTTP-date can name.
END_OF_CALENDAR = "Fri, 31 Dec 9999 23:59:59 GMT"


async def timer_durations(stack: Any, item_id: str) -> list[float]:
    handle = stack.client.get_workflow_handle(item_id)
    return [
        event.timer_started_event_attributes.start_to_fire_timeout.ToTimedelta().total_seconds()
        async for event in handle.fetch_history_events()
        if event.event_type == EventType.EVENT_TYPE_TIMER_STARTED
    ]


@pytest.mark.parametrize("retry_after", ["300000000000", "999999999", END_OF_CALENDAR])
async def test_retry_after_beyond_the_maximum_fails_the_item_with_a_clear_error(
    stack_factory, fake_provider, retry_after: str
) -> None:
    destination = email_destination(fake_provider)
    stack = await stack_factory(destination)
    item = await stack.enqueue(
        destination, EMAIL, script=[{"status": 429, "retry_after": retry_after}]
    )

    failure = await stack.failure(item.item_id)

    assert failure.type == "PermanentDeliveryError"
    assert "provider asked to retry after" in failure.message
    assert "beyond max_retry_after_s (3600 s)" in failure.message
    # The item reads as failed, not queued until 2058, and answers its status and a cancel.
    view = await stack.outbox.status("tests", item.key)
    assert view.status is ItemStatus.FAILED and view.attempts == 1
    assert view.next_attempt_at is None
    assert view.last_error and "beyond max_retry_after_s" in view.last_error
    with pytest.raises(OutboxError):
        await stack.outbox.cancel("tests", item.key)
    assert await submits(fake_provider, item.item_id) == 1
    assert await timer_durations(stack, item.item_id) == []


async def test_a_webhooks_retry_after_beyond_its_own_maximum_fails_the_item(
    stack_factory, fake_provider
) -> None:
    destination = webhook_destination(fake_provider, settings={"max_retry_after_s": 60})
    stack = await stack_factory(destination)
    item = await stack.enqueue(
        destination, {"event": "x"}, script=[{"status": 503, "retry_after": "61"}]
    )

    failure = await stack.failure(item.item_id)

    assert "provider asked to retry after 61 s, beyond max_retry_after_s (60 s)" in (
        failure.message
    )


async def test_retry_after_up_to_the_maximum_is_waited_exactly(
    stack_factory, fake_provider, own_time_skipping_env
) -> None:
    destination = email_destination(fake_provider, settings={"max_retry_after_s": 7200})
    # Two hours skipped: on a server of its own, or every other test's leftovers run out too.
    stack = await stack_factory(destination, env=own_time_skipping_env)
    item = await stack.enqueue(destination, EMAIL, script=[{"status": 429, "retry_after": "7200"}])

    view = await stack.result(item.item_id)

    assert view.status is ItemStatus.SENT and view.attempts == 2
    assert (await timer_durations(stack, item.item_id))[0] == 7200.0


def failed_activity(details: DeliveryErrorDetails, error_type: str) -> ActivityError:
    """A submit activity's failure as the workflow receives it."""
    error = ActivityError(
        "activity failed",
        scheduled_event_id=5,
        started_event_id=6,
        identity="worker",
        activity_type="submit_item",
        activity_id="1",
        retry_state=RetryState.NON_RETRYABLE_FAILURE,
    )
    # Details arrive decoded as plain JSON values.
    error.__cause__ = ApplicationError(
        "HTTP 429", dataclasses.asdict(details), type=error_type, non_retryable=True
    )
    return error


@pytest.mark.parametrize("wait_s", [RETRY_AFTER_LIMIT_S + 1, 3e11, float("inf"), float("nan")])
@pytest.mark.parametrize("error_type", [ItemErrorType.TRANSIENT, ItemErrorType.HELD])
def test_a_wait_no_destination_allows_ends_the_item_rather_than_overflow_its_timer(
    wait_s: float, error_type: ItemErrorType
) -> None:
    # However it got past the provider (an older worker, a cap's own wait), a wait whose date
    # could overflow `workflow.now() + timedelta` fails the item instead.
    err = failed_activity(DeliveryErrorDetails(retry_after_s=wait_s, status_code=429), error_type)

    kind, message, details = _failure(err)

    assert kind is ItemErrorType.PERMANENT
    assert "asked to retry after" in message and f"{RETRY_AFTER_LIMIT_S:g} s" in message
    assert details.retry_after_s is None and details.status_code == 429
    # Every wait it still allows is a date a timer can reach.
    assert datetime.now(UTC) + timedelta(seconds=RETRY_AFTER_LIMIT_S) < datetime.max.replace(
        tzinfo=UTC
    )


def test_a_wait_within_the_limit_is_kept() -> None:
    err = failed_activity(
        DeliveryErrorDetails(retry_after_s=RETRY_AFTER_LIMIT_S), ItemErrorType.TRANSIENT
    )

    kind, _, details = _failure(err)

    assert kind is ItemErrorType.TRANSIENT and details.retry_after_s == RETRY_AFTER_LIMIT_S
