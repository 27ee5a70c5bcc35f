"""Paths of the item workflow no other test walked: Retry-After on polls and on the accept, a
`not_before` honoured on time, and `last_error` readable while the item still retries."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

from durable_outbox_temporal.contract.item import SUBMIT_ACTIVITY, ItemStatus
from temporalio.api.enums.v1 import EventType
from temporalio.testing import WorkflowEnvironment

from devstack.fake_provider import create_app
from devstack.serving import serve_in_background
from readmodel import store
from tests.conftest import email_destination, webhook_destination
from tests.fakes import submits
from tests.workflows.test_outbox_item import EMAIL, wait_for_status


def poll_gaps(stack: Any, item_id: str) -> list[float]:
    """Seconds (on the server's clock) from the accept to the first poll, and between polls,
    as the item's events recorded them: each poll records `polled`, and the last one `sent`."""
    events = store.item_events(stack.engine, item_id)
    times = [event.at for event in events if event.type in ("accepted", "polled", "sent")]
    return [(later - earlier).total_seconds() for earlier, later in itertools.pairwise(times)]


# How much longer than asked a wait may be: the poll's own run time, and on a loaded machine its
# dispatch (a fresh-clone CI run measured a 45 s wait as 47.2). Every wait these tests tell apart
# differs by more (1 s against 37 or 45, 37 against the backoff's 1.5 and 2.25).
WAIT_SLACK_S = 5.0


def assert_waits(gaps: list[float], expected: list[float]) -> None:
    """Each wait is the expected one, never shorter, longer only by the poll's own run time."""
    assert len(gaps) == len(expected), gaps
    assert all(
        want <= gap < want + WAIT_SLACK_S for gap, want in zip(gaps, expected, strict=True)
    ), gaps


async def test_polls_retry_after_replaces_the_poll_interval(stack_factory, fake_provider) -> None:
    # Without Retry-After the polls would come 1s, 1.5s, 2.25s, ... apart.
    destination = email_destination(fake_provider, poll_interval_s=1, poll_backoff_multiplier=1.5)
    stack = await stack_factory(destination)
    await fake_provider.admin.set_faults(poll_retry_after="37")
    try:
        item = await stack.enqueue(destination, EMAIL, script=[{"running_polls": 3}])
        view = await stack.result(item.item_id)
    finally:
        await fake_provider.admin.set_faults()

    assert view.status is ItemStatus.SENT and view.poll_count == 4
    # The first poll follows the accept, which had no Retry-After; each later one the poll's.
    assert_waits(poll_gaps(stack, item.item_id), [1, 37, 37, 37])


def _with_retry_after_on_accept(app: Any, seconds: str) -> Any:
    """The ASGI `app`, adding `Retry-After` to its 202s: the fake sends none on an accept."""

    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        async def send_with_header(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start" and message["status"] == 202:
                headers = [*message.get("headers", []), (b"retry-after", seconds.encode())]
                message = {**message, "headers": headers}
            await send(message)

        await app(scope, receive, send_with_header)

    return wrapped


async def test_retry_after_on_the_accept_sets_the_first_polls_delay(
    stack_factory, fake_provider
) -> None:
    # The fake's own state behind a second port, so counters and operations stay shared.
    app = _with_retry_after_on_accept(create_app(fake_provider.state), "45")
    async with serve_in_background(app) as url:
        destination = email_destination(
            fake_provider, poll_interval_s=1, settings={"endpoint": url}
        )
        stack = await stack_factory(destination)
        item = await stack.enqueue(destination, EMAIL, script=[{"running_polls": 1}])
        view = await stack.result(item.item_id)

    assert view.status is ItemStatus.SENT and view.poll_count == 2
    # 45s before the first poll (not the 1s interval); the poll interval after it.
    assert_waits(poll_gaps(stack, item.item_id), [45, 1])


async def _server_minus_local_clock(env: WorkflowEnvironment) -> timedelta:
    """How far the time-skipping server's clock is ahead of ours: it grows with every skip."""
    return await env.get_current_time() - datetime.now(UTC)


async def _submit_started_at(stack: Any, item_id: str) -> datetime:
    """When (on the server's clock) the worker picked up the item's one submit activity."""
    scheduled_id = None
    async for event in stack.client.get_workflow_handle(item_id).fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            scheduled = event.activity_task_scheduled_event_attributes
            assert scheduled.activity_type.name == SUBMIT_ACTIVITY
            scheduled_id = event.event_id
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            assert event.activity_task_started_event_attributes.scheduled_event_id == scheduled_id
            return event.event_time.ToDatetime(tzinfo=UTC)
    raise AssertionError(f"{item_id} never started a submit")


async def test_an_item_is_submitted_at_its_due_time_not_before(
    stack_factory, fake_provider
) -> None:
    destination = webhook_destination(fake_provider)
    stack = await stack_factory(destination)
    # The client delays the start by `not_before` minus its own clock, so on the server's clock
    # the item is due at `not_before + skew`. The fake stamps arrivals with our clock, and the
    # server's jumps (up to years) once an item ends, so only Temporal's own record of the
    # submit can be set against the due time.
    skew = await _server_minus_local_clock(stack.env)
    not_before = datetime.now(UTC) + timedelta(hours=2)
    item = await stack.enqueue(destination, {"due": "later"}, not_before=not_before)

    view = await stack.result(item.item_id)

    assert view.status is ItemStatus.SENT
    assert await submits(fake_provider, item.item_id) == 1
    submitted, due = await _submit_started_at(stack, item.item_id), not_before + skew
    assert due <= submitted < due + timedelta(seconds=5), (submitted, due)


async def test_last_error_is_readable_while_the_item_retries(stack_factory, fake_provider) -> None:
    destination = email_destination(
        fake_provider, backoff_initial_s=600, backoff_max_s=3600, backoff_jitter=0
    )
    stack = await stack_factory(destination)
    item = await stack.enqueue(destination, EMAIL, script=[{"status": 503, "body": "busy"}] * 2)
    await wait_for_status(stack, item.key, attempts=1)

    waiting = await stack.outbox.status("tests", item.key)
    now = await stack.env.get_current_time()

    assert waiting.status is ItemStatus.QUEUED
    assert waiting.attempts == 1
    assert waiting.last_error and "503" in waiting.last_error and "busy" in waiting.last_error
    assert waiting.next_attempt_at is not None
    # The backoff's 600s, counted from the failure, not from now or from the enqueue.
    assert now + timedelta(seconds=590) < waiting.next_attempt_at <= now + timedelta(seconds=600)
    view = await stack.result(item.item_id)
    assert view.status is ItemStatus.SENT and view.attempts == 3
