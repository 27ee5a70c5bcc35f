"""The `ScheduledBatch` workflow on the time-skipping server: one fire enqueues its items once.

The time-skipping test server implements none of the schedule RPCs (CreateSchedule,
ListSchedules, DescribeSchedule... answer UNIMPLEMENTED), so these tests start the workflow the
way a schedule does: with the fire time in `TemporalScheduledStartTime`, which they register on
that server first. Schedules that really fire are tested on the dev server (`tests/api`).
"""

from __future__ import annotations

import contextlib
import dataclasses
from datetime import UTC, datetime
from typing import Any

import pytest
from durable_outbox_temporal.contract.ids import item_workflow_id, scheduled_batch_workflow_id
from durable_outbox_temporal.contract.schedule import (
    BATCH_INCOMPLETE_ERROR,
    NOT_SCHEDULED_ERROR,
    SCHEDULED_START_TIME,
    FireResult,
    ItemTemplate,
    ScheduledBatchInput,
    item_key,
)
from durable_outbox_temporal.destinations import Destination
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError

from devstack.fake_provider import FakeProvider
from tests.conftest import Stack, unique_name, webhook_destination, workflow_result
from tests.workflows.test_batch_retries import until_closed, until_retrying
from worker import default_operations_task_queue
from workflows.redrive_batch import BATCH_FAILED_ERROR, PAGE_RETRIES
from workflows.scheduled_batch import ScheduledBatchWorkflow

FIRE = datetime(2025, 1, 31, 23, 30, tzinfo=UTC)


async def allow_fire_times(client: Client) -> None:
    """The real server sets `TemporalScheduledStartTime` itself; the test server must be told
    the attribute exists before a start may carry it."""
    with contextlib.suppress(RPCError):  # registered by an earlier test of the session
        await client.operator_service.add_search_attributes(
            AddSearchAttributesRequest(
                namespace=client.namespace,
                search_attributes={
                    SCHEDULED_START_TIME.name: IndexedValueType.INDEXED_VALUE_TYPE_DATETIME
                },
            )
        )


def digest_batch(stack: Stack, destination: Destination, *extra: ItemTemplate) -> Any:
    """Two webhook items with placeholders, for a schedule of its own."""
    items = [
        ItemTemplate(
            destination=destination.name,
            payload={
                "n": 0,
                "text": "digest for {{fire_date}}",
                "meta": {"at": "{{scheduled_at}}", "key": "{{item_key}}"},
            },
        ),
        ItemTemplate(
            destination=destination.name, payload={"n": 1, "s": "{{schedule_id}}"}, key_suffix="b"
        ),
        *extra,
    ]
    return ScheduledBatchInput(
        schedule_id=unique_name("digest"),
        outbox="tests",
        items=items,
        operations_task_queue=default_operations_task_queue(stack.task_queue),
        timezone="Europe/Paris",
    )


async def start_fire(
    stack: Stack, batch: ScheduledBatchInput, fire: datetime | None, suffix: str = ""
) -> WorkflowHandle[Any, FireResult]:
    """Start the workflow as the schedule would for `fire` (None: as no schedule would)."""
    pairs = [SearchAttributePair(SCHEDULED_START_TIME, fire)] if fire is not None else []
    stamp = fire.strftime("%Y-%m-%dT%H:%M:%SZ") if fire is not None else "manual"
    return await stack.client.start_workflow(
        ScheduledBatchWorkflow.run,
        batch,
        id=f"{scheduled_batch_workflow_id(batch.schedule_id)}-{stamp}{suffix}",
        task_queue=stack.task_queue,
        search_attributes=TypedSearchAttributes(pairs),
    )


async def delivered(fake: FakeProvider, destination: Destination) -> list[dict[str, Any]]:
    return [entry["payload"] for entry in await fake.admin.deliveries(destination.name)]


async def finish_items(stack: Stack, keys: list[str]) -> None:
    for key in keys:
        await stack.result(item_workflow_id("tests", key))


async def test_a_fire_enqueues_each_templated_item_once_and_a_rerun_adds_nothing(
    stack_factory: Any, fake_provider: FakeProvider
) -> None:
    destination = webhook_destination(fake_provider)
    stack: Stack = await stack_factory(destination)
    await allow_fire_times(stack.client)
    batch = digest_batch(stack, destination)

    first = await start_fire(stack, batch, FIRE)
    result = await workflow_result(first)
    await finish_items(stack, result.keys)
    # The same fire run again (a re-run under another id, as after a reset or a manual replay).
    again = await start_fire(stack, batch, FIRE, suffix="-rerun")
    rerun = await workflow_result(again)
    await stack.record_history(first.id)
    await stack.record_history(again.id, "_rerun")

    keys = [item_key(batch.schedule_id, FIRE, "0"), item_key(batch.schedule_id, FIRE, "b")]
    assert (result.created, result.existing, result.keys) == (2, 0, keys)
    assert (rerun.created, rerun.existing, rerun.keys) == (0, 2, keys)
    payloads = sorted(await delivered(fake_provider, destination), key=lambda p: p["n"])
    assert payloads == [
        {
            "n": 0,
            "text": "digest for 2025-02-01",  # Paris is an hour ahead of UTC
            "meta": {"at": "2025-01-31T23:30:00Z", "key": keys[0]},
        },
        {"n": 1, "s": batch.schedule_id},
    ]


async def test_each_fire_time_enqueues_its_own_items(
    stack_factory: Any, fake_provider: FakeProvider
) -> None:
    destination = webhook_destination(fake_provider)
    stack: Stack = await stack_factory(destination)
    await allow_fire_times(stack.client)
    batch = digest_batch(stack, destination)
    later = FIRE.replace(hour=23, minute=31)

    handles = [await start_fire(stack, batch, fire) for fire in (FIRE, later)]
    results = [await workflow_result(handle) for handle in handles]
    for result in results:
        await finish_items(stack, result.keys)
    await stack.record_history(handles[1].id)

    assert [result.created for result in results] == [2, 2]
    assert {
        entry["meta"]["at"]
        for entry in await delivered(fake_provider, destination)
        if "meta" in entry
    } == {
        "2025-01-31T23:30:00Z",
        "2025-01-31T23:31:00Z",
    }
    assert len(await delivered(fake_provider, destination)) == 4


async def test_a_refused_item_fails_the_fire_once_the_others_are_enqueued(
    stack_factory: Any, fake_provider: FakeProvider
) -> None:
    destination = webhook_destination(fake_provider)
    stack: Stack = await stack_factory(destination)
    await allow_fire_times(stack.client)
    # Its destination was removed from the configuration after the schedule was created.
    removed = ItemTemplate(destination="removed-since", payload={"n": 2})
    batch = digest_batch(stack, destination, removed)

    handle = await start_fire(stack, batch, FIRE)
    with pytest.raises(WorkflowFailureError) as failure:
        await workflow_result(handle)
    cause = failure.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == BATCH_INCOMPLETE_ERROR
    result = cause.details[0]
    await finish_items(stack, result["keys"][:2])
    await stack.record_history(handle.id)

    assert (result["created"], result["existing"]) == (2, 0)
    assert [(f["index"], f["error"]) for f in result["failed"]] == [(2, "UnknownDestination")]
    assert "removed-since" in cause.message
    assert len(await delivered(fake_provider, destination)) == 2


async def test_a_run_no_schedule_started_fails_without_enqueueing(
    stack_factory: Any, fake_provider: FakeProvider
) -> None:
    destination = webhook_destination(fake_provider)
    stack: Stack = await stack_factory(destination)
    batch = digest_batch(stack, destination)

    handle = await start_fire(stack, batch, None)
    with pytest.raises(WorkflowFailureError) as failure:
        await workflow_result(handle)

    cause = failure.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == NOT_SCHEDULED_ERROR
    assert await delivered(fake_provider, destination) == []


async def test_a_fire_that_cannot_enqueue_ends_failed_with_the_reason_after_bounded_retries(
    stack_factory: Any, fake_provider: FakeProvider, own_time_skipping_env: Any
) -> None:
    destination = webhook_destination(fake_provider)
    stack: Stack = await stack_factory(destination, env=own_time_skipping_env)
    await allow_fire_times(stack.client)
    # A time zone the worker's tz database does not know (the API checks it; a schedule created
    # on another machine may carry one): every attempt fails the same way.
    batch = dataclasses.replace(digest_batch(stack, destination), timezone="Mars/Olympus_Mons")

    handle = await start_fire(stack, batch, FIRE)
    await until_retrying(handle)
    await until_closed(stack, handle)
    with pytest.raises(WorkflowFailureError) as failure:
        await workflow_result(handle)

    cause = failure.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == BATCH_FAILED_ERROR
    assert cause.message.startswith("enqueue 2 item(s) into tests failed after its retries:")
    assert "Mars/Olympus_Mons" in cause.message
    history = await handle.fetch_history()
    attempts = [
        event.activity_task_started_event_attributes.attempt
        for event in history.events
        if event.HasField("activity_task_started_event_attributes")
    ]
    assert attempts == [PAGE_RETRIES.maximum_attempts]
    assert await delivered(fake_provider, destination) == []
    await stack.record_history(handle.id)
