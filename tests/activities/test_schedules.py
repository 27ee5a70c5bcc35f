"""Scheduled fan-out's enqueue activity: retried, it finds its items instead of adding more."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from durable_outbox_temporal.contract.ids import item_workflow_id
from durable_outbox_temporal.contract.schedule import (
    FireRequest,
    ItemTemplate,
    ScheduledBatchInput,
    item_key,
)
from temporalio.testing import ActivityEnvironment

from activities.schedules import ScheduleActivities
from devstack.fake_provider import FakeProvider
from tests.conftest import Stack, unique_name, webhook_destination
from tests.fakes import script

FIRE = datetime(2025, 3, 1, 6, 0, tzinfo=UTC)


async def test_a_retried_enqueue_finds_its_items_instead_of_adding_more(
    stack_factory: Any, fake_provider: FakeProvider
) -> None:
    destination = webhook_destination(fake_provider)
    stack: Stack = await stack_factory(destination)
    batch = ScheduledBatchInput(
        schedule_id=unique_name("retry"),
        outbox="tests",
        items=[ItemTemplate(destination.name, {"n": n}) for n in range(3)],
        operations_task_queue="unused: the activity runs in this test",
    )
    activities = ScheduleActivities(stack.outbox)
    request = FireRequest(batch=batch, scheduled_at=FIRE)

    first = await ActivityEnvironment().run(activities.enqueue_batch, request)
    retried = await ActivityEnvironment().run(activities.enqueue_batch, request)
    for key in first.keys:
        await stack.result(item_workflow_id("tests", key))

    assert (first.created, first.existing, retried.created, retried.existing) == (3, 0, 0, 3)
    assert len(await fake_provider.admin.deliveries(destination.name)) == 3


async def test_an_item_that_failed_since_counts_as_existing_on_a_retry(
    stack_factory: Any, fake_provider: FakeProvider
) -> None:
    destination = webhook_destination(fake_provider)
    stack: Stack = await stack_factory(destination)
    schedule_id = unique_name("failed")
    batch = ScheduledBatchInput(
        schedule_id=schedule_id,
        outbox="tests",
        items=[ItemTemplate(destination.name, {"n": 0})],
        operations_task_queue="unused",
    )
    key = item_key(schedule_id, FIRE, "0")
    await script(fake_provider, item_workflow_id("tests", key), [{"status": 400}])
    activities = ScheduleActivities(stack.outbox)
    request = FireRequest(batch=batch, scheduled_at=FIRE)

    first = await ActivityEnvironment().run(activities.enqueue_batch, request)
    await stack.failure(item_workflow_id("tests", key))
    retried = await ActivityEnvironment().run(activities.enqueue_batch, request)

    assert (first.created, retried.created, retried.existing, retried.failed) == (1, 0, 1, [])
