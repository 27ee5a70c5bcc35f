"""What only the real dev server has: visibility, server-side rate limits, continue-as-new."""

from __future__ import annotations

import asyncio
import math

from durable_outbox_temporal.contract.item import ItemStatus

from tests.conftest import email_destination, separate_process_client, webhook_destination
from tests.fakes import deliveries, max_requests_in_window, submits
from tests.workflows.test_outbox_item import EMAIL, wait_for_status


async def test_search_attributes_find_exactly_the_failed_items(
    dev_env, stack_factory, fake_provider
) -> None:
    destination = webhook_destination(fake_provider)
    stack = await stack_factory(destination, env=dev_env)
    sent = await stack.enqueue(destination, {"n": 1})
    failing = [await stack.enqueue(destination, {"n": n}, script=[{"status": 400}]) for n in (2, 3)]
    await stack.result(sent.item_id)
    for item in failing:
        await stack.failure(item.item_id)

    query = (
        f"OutboxName = 'tests' AND Destination = '{destination.name}' AND OutboxStatus = 'failed'"
    )
    found: set[str] = set()
    for _ in range(100):  # visibility is eventually consistent
        found = {wf.id async for wf in dev_env.client.list_workflows(query)}
        if len(found) >= 2:
            break
        await asyncio.sleep(0.1)

    assert found == {item.item_id for item in failing}


async def test_submit_rate_holds_across_two_workers(dev_env, stack_factory, fake_provider) -> None:
    rate, items = 2.0, 16
    destination = webhook_destination(fake_provider, submit_rate=rate)
    first = await stack_factory(destination, env=dev_env)
    # A second process's worth of workers on the same task queues: the limit is the server's.
    await stack_factory(
        destination,
        env=dev_env,
        task_queue=first.task_queue,
        client=await separate_process_client(dev_env),
    )
    enqueued = [await first.enqueue(destination, {"n": n}) for n in range(items)]
    await asyncio.gather(*(first.result(item.item_id) for item in enqueued))

    window_s = 4.0
    seen = await max_requests_in_window(fake_provider, f"/webhook/{destination.name}", window_s)
    # The server's token bucket may burst about one second's worth on top of the steady rate.
    assert seen <= rate * window_s + 2 * math.ceil(rate)
    assert sum([await deliveries(fake_provider, item.item_id) for item in enqueued]) == items


async def test_long_polling_continues_as_new_and_keeps_state(
    dev_env, stack_factory, fake_provider
) -> None:
    destination = email_destination(fake_provider, poll_interval_s=0.1, poll_backoff_multiplier=1)
    stack = await stack_factory(destination, env=dev_env)
    # The dev server suggests continue-as-new at 40 events (tests/conftest.py `dev_env`), about
    # three polls' worth of an item's history: seven polls continue it as new at least once. Each
    # poll waits about a second there, whatever the interval (its timers fire late by up to
    # `history.timerProcessorMaxTimeShift`, 1 s by default).
    item = await stack.enqueue(
        destination,
        EMAIL,
        script=[{"running_polls": 6}],
    )

    view = await stack.result(item.item_id)

    description = await stack.client.get_workflow_handle(item.item_id).describe()
    assert description.run_id != description.raw_description.workflow_execution_info.first_run_id
    assert view.status is ItemStatus.SENT
    assert view.poll_count == 6 + 1  # every poll counted, across the runs
    assert await deliveries(fake_provider, item.item_id) == 1


async def test_new_worker_finishes_an_item_a_stopped_worker_began(
    dev_env, stack_factory, fake_provider
) -> None:
    destination = email_destination(fake_provider, poll_interval_s=1, poll_backoff_multiplier=1)
    first = await stack_factory(destination, env=dev_env)
    item = await first.enqueue(destination, EMAIL, script=[{"running_polls": 3}])
    await wait_for_status(first, item.key, status=ItemStatus.SENDING)
    # Stop every worker of the first stack, then bring up a new set on the same task queues.
    await first.shutdown()
    second = await stack_factory(destination, env=dev_env, task_queue=first.task_queue)

    view = await second.result(item.item_id)

    assert view.status is ItemStatus.SENT
    assert await deliveries(fake_provider, item.item_id) == 1
    assert await submits(fake_provider, item.item_id) == 1
