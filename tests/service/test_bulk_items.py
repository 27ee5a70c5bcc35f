"""Bulk mode through the item use cases: a batch goes to its shards in one signal each, and
repeats, conflicts and redrive behave as they do for item workflows (cancel and purge:
`tests/activities/test_purge.py`)."""

from __future__ import annotations

import pytest
from durable_outbox_temporal import IdempotencyConflict
from durable_outbox_temporal.contract.bulk import shard_workflow_id
from durable_outbox_temporal.contract.ids import item_workflow_id
from durable_outbox_temporal.contract.item import ItemStatus, NewItem
from temporalio.api.enums.v1 import EventType

from readmodel import store
from service.items import Enqueued, ItemService
from tests.conftest import email_destination, unique_name
from tests.fakes import deliveries, script
from tests.workflows.test_bulk import until_settled
from tests.workflows.test_outbox_item import EMAIL


async def test_a_batch_is_one_signal_per_shard_and_repeats_are_answered_by_the_read_model(
    stack_factory, fake_provider
) -> None:
    destination = email_destination(fake_provider, mode="bulk", shards=1)
    stack = await stack_factory(destination)
    service = ItemService(stack.outbox, stack.engine)
    keys = [unique_name("bulk") for _ in range(12)]

    outcomes = await service.enqueue_many(
        "tests", [NewItem(destination.name, EMAIL, k) for k in keys]
    )
    assert all(isinstance(o, Enqueued) and o.result.created for o in outcomes), outcomes
    await until_settled(stack, [item_workflow_id("tests", k) for k in keys])

    history = stack.client.get_workflow_handle(shard_workflow_id(destination.name, 0))
    signals = [
        e
        async for e in history.fetch_history_events()
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
    ]
    assert len(signals) == 1
    again = await service.enqueue("tests", NewItem(destination.name, EMAIL, keys[0]))
    assert not again.result.created and again.status is ItemStatus.SENT
    with pytest.raises(IdempotencyConflict):
        await service.enqueue("tests", NewItem(destination.name, {"other": 1}, keys[0]))
    for key in keys:
        assert await deliveries(fake_provider, item_workflow_id("tests", key)) == 1


async def test_a_failed_bulk_item_is_redriven_as_a_new_generation(
    stack_factory, fake_provider
) -> None:
    destination = email_destination(fake_provider, mode="bulk", shards=1)
    stack = await stack_factory(destination)
    service = ItemService(stack.outbox, stack.engine)
    key = unique_name("refused")
    item_id = item_workflow_id("tests", key)
    await script(fake_provider, item_id, [{"status": 400}])
    await service.enqueue("tests", NewItem(destination.name, EMAIL, key))
    await until_settled(stack, [item_id])
    failed = store.get_item(stack.engine, item_id)
    assert failed is not None and failed.view.status is ItemStatus.FAILED

    redriven = await service.redrive("tests", key)
    assert redriven.created
    await until_settled(stack, [item_id], settled=lambda view: view.status is ItemStatus.SENT)
    types = [e.type for e in store.item_events(stack.engine, item_id)]
    assert types == ["enqueued", "failed", "redriven", "accepted", "sent"], types
    assert await deliveries(fake_provider, item_id, generation=1) == 1
