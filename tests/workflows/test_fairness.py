"""Fairness between outboxes sharing a destination (dev server with task queue fairness on)."""

from __future__ import annotations

import asyncio
from datetime import UTC
from typing import Any

import pytest
from durable_outbox_temporal.contract.ids import provider_idempotency_key
from durable_outbox_temporal.contract.item import ItemStatus
from durable_outbox_temporal.contract.limits import MAX_OUTBOX_LENGTH
from temporalio.api.enums.v1 import EventType

from tests.conftest import Stack, webhook_destination


async def test_a_small_outbox_is_not_starved_by_a_big_backlog(
    dev_env, stack_factory, fake_provider
) -> None:
    # 16 s of submits for the big outbox: on a loaded machine the small item's submit was
    # queued 7 s after its enqueue, with 29 of 120 left, too few for the last check's bar.
    rate, backlog = 10.0, 160
    destination = webhook_destination(fake_provider, submit_rate=rate)
    stack = await stack_factory(destination, env=dev_env)
    big = await asyncio.gather(
        *(
            stack.outbox.enqueue("big", destination.name, {"n": n}, key=f"b{n}")
            for n in range(backlog)
        )
    )
    # The backlog is draining at the rate before the small outbox's item arrives.
    await delivered(stack, destination.name, at_least=15)

    small = await stack.outbox.enqueue("small", destination.name, {"n": 0}, key="s0")
    small_view = await stack.result(small.item_id)
    big_views = [await stack.result(item.item_id) for item in big]
    log = await delivered(stack, destination.name, at_least=backlog + 1)
    small_key = provider_idempotency_key(small.item_id)
    [position] = [index for index, entry in enumerate(log) if entry["key"] == small_key]
    # From the moment its submit waits in the queue: fairness orders the queue, not the workflow
    # tasks before it (which a loaded machine delays).
    queued_at = await submit_scheduled_at(stack, small.item_id)

    assert small_view.status is ItemStatus.SENT
    assert all(view.status is ItemStatus.SENT for view in big_views)
    # First come, first served, it would have waited for the rest of the backlog (about 130
    # items); shared fairly, it goes within the next few one-second rate windows (four: a full
    # run's load once saw 31 go first, in 3.2 s). Counted in deliveries, not seconds, so a
    # loaded machine that drains slower does not change the bar.
    bar = 4 * rate
    overtaken_by = [entry for entry in log[:position] if entry["at"] >= queued_at]
    assert len(overtaken_by) <= bar, (len(overtaken_by), log[position]["at"] - queued_at)
    # The bar meant something: first come, first served, it would have waited for every one
    # still waiting when its submit was queued (counted from then: a loaded machine queues it
    # later, with less of the backlog left), and those were more than the bar. A full run's
    # load once queued it 10 s late, with 38 left: then this run cannot tell fair from not.
    waiting_then = [e for e in log if e["at"] >= queued_at and e is not log[position]]
    if len(waiting_then) <= bar:
        pytest.skip(f"its submit was queued with {len(waiting_then)} left: too late to tell")


async def test_an_outbox_name_too_long_for_a_fairness_key_is_delivered(
    dev_env, stack_factory, fake_provider
) -> None:
    # The server refuses fairness keys over 64 bytes, and the workflow task scheduling the submit
    # would fail for ever: the key is shortened, so the longest outbox name still delivers.
    destination = webhook_destination(fake_provider)
    stack = await stack_factory(destination, env=dev_env)
    item = await stack.outbox.enqueue("o" * MAX_OUTBOX_LENGTH, destination.name, {"n": 1})

    view = await asyncio.wait_for(stack.result(item.item_id), timeout=20)

    assert view.status is ItemStatus.SENT


async def submit_scheduled_at(stack: Stack, item_id: str) -> float:
    """When the item's first submit activity was put on the destination's queue (epoch s)."""
    history = await stack.client.get_workflow_handle(item_id).fetch_history()
    for event in history.events:
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            return event.event_time.ToDatetime(tzinfo=UTC).timestamp()
    raise AssertionError(f"{item_id} scheduled no activity")


async def delivered(stack: Stack, endpoint: str, *, at_least: int) -> list[dict[str, Any]]:
    """The fake's first deliveries to `endpoint`, in arrival order, once there are `at_least`."""
    for _ in range(400):
        log = await stack.fake.admin.deliveries(endpoint)
        if len(log) >= at_least:
            return log
        await asyncio.sleep(0.05)
    raise AssertionError(f"fewer than {at_least} deliveries to {endpoint} after 20 s")
