"""The item use cases beyond what the client does alone: the read model as memory and sequence."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from durable_outbox_temporal import IdempotencyConflict, ItemFailedUseRedrive, ItemNotFound
from durable_outbox_temporal.contract.ids import (
    item_workflow_id,
    payload_hash,
    provider_idempotency_key,
)
from durable_outbox_temporal.contract.item import (
    ItemProjection,
    ItemStatus,
    NewItem,
    OutboxItemView,
)
from temporalio.client import WorkflowExecutionStatus

from readmodel import store
from service.items import ItemService
from tests.conftest import email_destination
from tests.fakes import deliveries, submits
from tests.workflows.test_outbox_item import EMAIL, wait_for_status


def remembered_item(key: str, status: ItemStatus, destination: str) -> ItemProjection:
    """A settled item the read model holds while Temporal has forgotten it (retention)."""
    at = datetime(2025, 11, 1, tzinfo=UTC)
    view = OutboxItemView(
        id=item_workflow_id("tests", key),
        outbox="tests",
        key=key,
        destination=destination,
        status=status,
        attempts=1,
        max_attempts=8,
        created_at=at,
        updated_at=at,
        finished_at=at,
        payload_hash=payload_hash(destination, EMAIL),
        last_event_seq=5,
    )
    return ItemProjection(view=view, events=[], payload=EMAIL)


async def test_a_key_sent_before_retention_is_never_sent_again(stack_factory, fake_provider):
    destination = email_destination(fake_provider)
    stack = await stack_factory(destination)
    service = ItemService(stack.outbox, stack.engine)
    store.apply_projection(stack.engine, remembered_item("old", ItemStatus.SENT, destination.name))

    enqueued = await service.enqueue("tests", NewItem(destination.name, EMAIL, key="old"))

    assert not enqueued.result.created and enqueued.status is ItemStatus.SENT
    with pytest.raises(ItemNotFound):  # no workflow was started for it
        await stack.outbox.status("tests", "old")
    assert await submits(fake_provider, item_workflow_id("tests", "old")) == 0
    with pytest.raises(IdempotencyConflict):
        await service.enqueue("tests", NewItem(destination.name, {"other": 1}, key="old"))


async def test_a_key_failed_before_retention_must_be_redriven(stack_factory, fake_provider):
    destination = email_destination(fake_provider)
    stack = await stack_factory(destination)
    service = ItemService(stack.outbox, stack.engine)
    failed = remembered_item("gone", ItemStatus.FAILED, destination.name)
    store.apply_projection(stack.engine, failed)

    with pytest.raises(ItemFailedUseRedrive):
        await service.enqueue("tests", NewItem(destination.name, EMAIL, key="gone"))
    assert await submits(fake_provider, item_workflow_id("tests", "gone")) == 0


async def test_redrive_after_a_terminated_run_continues_the_sequence(stack_factory, fake_provider):
    destination = email_destination(fake_provider)
    stack = await stack_factory(destination)
    service = ItemService(stack.outbox, stack.engine)
    # The item waits an hour for its next attempt: terminate it there, as an operator would.
    item = await stack.enqueue(
        destination, EMAIL, key="killed", script=[{"status": 503, "retry_after": "3600"}]
    )
    await wait_for_status(stack, "killed", attempts=1)
    handle = stack.client.get_workflow_handle(item.item_id)
    await handle.terminate(reason="operator")
    assert (await handle.describe()).status == WorkflowExecutionStatus.TERMINATED
    before = [e.seq for e in store.item_events(stack.engine, item.item_id)]

    redriven = await service.redrive("tests", "killed")
    view = await stack.result(redriven.item_id)

    assert view.status is ItemStatus.SENT
    events = store.item_events(stack.engine, item.item_id)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert len(events) > len(before) and events[len(before)].type == "redriven"
    record = store.get_item(stack.engine, item.item_id)
    assert record is not None and record.view.status is ItemStatus.SENT


async def test_redrive_after_a_failed_operation_uses_a_new_provider_key(
    stack_factory, fake_provider
):
    destination = email_destination(fake_provider)
    stack = await stack_factory(destination)
    service = ItemService(stack.outbox, stack.engine)
    item = await stack.enqueue(
        destination, EMAIL, key="acs-failed", script=[{"operation_result": "Failed"}]
    )
    await stack.failure(item.item_id)

    redriven = await service.redrive("tests", "acs-failed")
    view = await stack.result(redriven.item_id)

    # The fake dedupes by Operation-Id as ACS does: the old key would get the failed operation.
    assert view.status is ItemStatus.SENT
    assert provider_idempotency_key(item.item_id, 1) != provider_idempotency_key(item.item_id)
    first_generation = item.item_id
    assert await deliveries(fake_provider, first_generation) == 1
    assert await deliveries(fake_provider, first_generation, generation=1) == 1
