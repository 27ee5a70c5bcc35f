"""A host hands over (continues as new) while its destination is paused: the submits and polls it
has out wait on the paused queue, so after `HAND_OVER_GRACE` it takes back what no worker has
taken, and each such item is carried as it was, its attempt not spent
(docs/decisions/hand-over-while-paused.md). Runs before this waited for the resume, their
histories growing with every enqueue.

On the dev server: it suggests continuing as new at 40 events, and holds a paused queue's tasks
as a real server does."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import pytest
from durable_outbox_temporal.contract.bulk import shard_workflow_id
from durable_outbox_temporal.contract.ids import item_workflow_id
from durable_outbox_temporal.contract.item import ItemStatus
from durable_outbox_temporal.destinations import Destination
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client

from flowcontrol.queue_rates import set_queue_rate
from readmodel import store
from tests.conftest import email_destination, record_history, unique_name, webhook_destination
from tests.fakes import deliveries, script
from tests.workflows.test_bulk import until_settled
from tests.workflows.test_lane import arrivals
from tests.workflows.test_outbox_item import EMAIL
from workflows import host

# Enqueues, 50 ms apart, at most: a shard goes past the 40 events at which the dev server
# suggests continuing as new every 15 or so.
MAX_ITEMS = 90
CONTINUED_AS_NEW = EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW
ACTIVITY_CANCELED = EventType.EVENT_TYPE_ACTIVITY_TASK_CANCELED


@pytest.fixture(autouse=True)
def short_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host, "HAND_OVER_GRACE", timedelta(seconds=1))


async def run_events(client: Client, workflow_id: str, run_id: str) -> list[HistoryEvent]:
    handle = client.get_workflow_handle(workflow_id, run_id=run_id)
    return [event async for event in handle.fetch_history_events()]


def count(events: list[HistoryEvent], event_type: EventType.ValueType) -> int:
    return sum(1 for event in events if event.event_type == event_type)


async def handed_over_runs(
    client: Client, workflow_id: str, run_id: str
) -> list[tuple[str, list[HistoryEvent]]]:
    """Each run of the chain from `run_id` that has continued as new, with its events."""
    runs = []
    while True:
        events = await run_events(client, workflow_id, run_id)
        last = events[-1] if events else None
        if last is None or last.event_type != CONTINUED_AS_NEW:
            return runs
        runs.append((run_id, events))
        run_id = last.workflow_execution_continued_as_new_event_attributes.new_execution_run_id


async def paused_through_a_hand_over(
    stack: Any,
    destination: Destination,
    queue: str,
    enqueue: Callable[[int], Awaitable[str]],
) -> tuple[list[str], list[HistoryEvent]]:
    """Pause `queue` and enqueue items one by one until a run of the shard has continued as new
    with what it had out on that queue taken back, then resume: the items' ids and that run's
    events. (A hand-over with nothing out yet takes nothing back: the items keep coming until
    one comes while some wait.)"""
    client = stack.client
    await set_queue_rate(client, queue, 0.0, "paused; tests", identity="tests")
    shard = client.get_workflow_handle(shard_workflow_id(destination.name, 0))
    item_ids = [await enqueue(0)]
    first_run = (await shard.describe()).run_id
    deadline = time.monotonic() + 60
    while True:
        runs = await handed_over_runs(client, shard.id, first_run)
        withdrew = [(run, events) for run, events in runs if count(events, ACTIVITY_CANCELED)]
        if withdrew:
            break
        assert time.monotonic() < deadline, (
            f"no run of the shard continued as new while paused ({len(runs)} did, none"
            f" taking back what waited; {len(item_ids)} items enqueued)"
        )
        if len(item_ids) < MAX_ITEMS:
            item_ids.append(await enqueue(len(item_ids)))
        await asyncio.sleep(0.05)
    await set_queue_rate(client, queue, None, "resumed; tests", identity="tests")
    run_id, events = withdrew[0]
    await record_history(client, shard.id, run_id=run_id)
    return item_ids, events


async def each_sent_once_on_its_first_attempt(
    stack: Any, fake_provider: Any, item_ids: list[str]
) -> None:
    """Once resumed, every item is sent, once, on one attempt: one taken back never went, so it
    spent none."""
    await until_settled(stack, item_ids, timeout_s=90, skip_time=False)
    for item_id in item_ids:
        row = store.get_item(stack.engine, item_id)
        assert row is not None and row.view.status is ItemStatus.SENT, row
        assert row.view.attempts == 1, row.view
        assert await deliveries(fake_provider, item_id) == 1, item_id


@pytest.mark.parametrize("submit_batch", [1, 4], ids=["own-submits", "shared-batches"])
async def test_a_shard_hands_over_while_its_submits_wait_on_a_paused_queue(
    dev_env, stack_factory, fake_provider, submit_batch: int
) -> None:
    destination = webhook_destination(
        fake_provider, mode="bulk", shards=1, submit_batch=submit_batch
    )
    stack = await stack_factory(destination, env=dev_env)

    async def enqueue(n: int) -> str:
        result = await stack.enqueue(destination, {"n": n}, key=unique_name("paused"))
        return str(result.item_id)

    item_ids, _ = await paused_through_a_hand_over(
        stack, destination, destination.submit_task_queue, enqueue
    )

    await each_sent_once_on_its_first_attempt(stack, fake_provider, item_ids)


@pytest.mark.parametrize("poll_batch", [1, 4], ids=["own-polls", "shared-polls"])
async def test_a_shard_hands_over_while_its_polls_wait_on_a_paused_queue(
    dev_env, stack_factory, fake_provider, poll_batch: int
) -> None:
    # Submits share activities (no first poll in them): every poll waits on the poll queue.
    destination = email_destination(
        fake_provider,
        mode="bulk",
        shards=1,
        poll_interval_s=0.2,
        submit_batch=2,
        poll_batch=poll_batch,
    )
    stack = await stack_factory(destination, env=dev_env)

    async def enqueue(n: int) -> str:
        key = unique_name("polled")
        await script(fake_provider, item_workflow_id("tests", key), [{"running_polls": 1}])
        result = await stack.enqueue(destination, EMAIL, key=key)
        return str(result.item_id)

    item_ids, _ = await paused_through_a_hand_over(
        stack, destination, destination.poll_task_queue, enqueue
    )

    await each_sent_once_on_its_first_attempt(stack, fake_provider, item_ids)
    for item_id in item_ids:
        events = store.item_events(stack.engine, item_id)
        # A poll taken back is no failed poll, and the item's story ends once.
        assert not [e for e in events if (e.detail or "").startswith("poll failed")], events
        assert [e.type.value for e in events].count("sent") == 1, events


async def test_a_lanes_run_taken_back_at_a_hand_over_keeps_its_order(
    dev_env, stack_factory, fake_provider
) -> None:
    destination = webhook_destination(fake_provider, mode="bulk", shards=1, submit_batch=4)
    stack = await stack_factory(destination, env=dev_env)
    ordering_key = unique_name("paused-lane")

    async def enqueue(n: int) -> str:
        result = await stack.enqueue(
            destination, {"n": n}, key=unique_name("in-lane"), ordering_key=ordering_key
        )
        return str(result.item_id)

    item_ids, handed_over = await paused_through_a_hand_over(
        stack, destination, destination.submit_task_queue, enqueue
    )

    await each_sent_once_on_its_first_attempt(stack, fake_provider, item_ids)
    assert await arrivals(fake_provider, destination) == list(range(len(item_ids)))
    # What the lane had out when the hand-over came was one batch of its run, cancelled whole.
    assert count(handed_over, EventType.EVENT_TYPE_ACTIVITY_TASK_CANCEL_REQUESTED) == 1
