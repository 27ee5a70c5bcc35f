"""A shard that continues as new holding more than one workflow task should read carries the
rest in parts (`ShardInput.later`), admitted one per workflow task, and its handlers wait for
them: docs/decisions/shard-carry-in-parts.md."""

from __future__ import annotations

from typing import Any

import pytest
from durable_outbox_temporal.contract import bulk as shard_contract
from durable_outbox_temporal.contract.bulk import (
    CANCEL_ITEM_SIGNAL,
    SHARD_WORKFLOW_TYPE,
    CarriedPart,
    ItemCancel,
    ShardInput,
    shard_workflow_id,
)
from durable_outbox_temporal.contract.ids import item_workflow_id
from durable_outbox_temporal.contract.item import CancelRequest, ItemStatus, NewItem
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent

from readmodel import store
from tests.conftest import email_destination, record_history, unique_name
from tests.fakes import deliveries, submits
from tests.workflows.test_bulk import enqueue_all, long_lived_shard, until_settled
from tests.workflows.test_outbox_item import EMAIL

PER_TASK = 4


def admit_timers(events: list[HistoryEvent]) -> int:
    return sum(
        1
        for event in events
        if event.event_type == EventType.EVENT_TYPE_TIMER_STARTED
        and b"admit carried items" in event.user_metadata.summary.data
    )


def _cut_parts(event: HistoryEvent) -> bool:
    """The patch marker of a run that cut what it carried into parts."""
    marker = event.marker_recorded_event_attributes
    return marker.marker_name == "core_patch" and any(
        b"shard-carry-in-parts" in payload.data
        for payloads in marker.details.values()
        for payload in payloads.payloads
    )


async def run_inputs(
    stack: Any, workflow_id: str
) -> list[tuple[str, ShardInput, list[HistoryEvent]]]:
    """Each run of the shard: its id, its input and its events."""
    runs = []
    async for execution in stack.client.list_workflows(f"WorkflowId = '{workflow_id}'"):
        handle = stack.client.get_workflow_handle(workflow_id, run_id=execution.run_id)
        events = [event async for event in handle.fetch_history_events()]
        payloads = events[0].workflow_execution_started_event_attributes.input.payloads
        [start] = await stack.client.data_converter.decode(payloads, [ShardInput])
        runs.append((execution.run_id, start, events))
    return runs


async def test_a_shard_carries_what_it_holds_in_parts_admitted_one_per_task(
    dev_env, stack_factory, fake_provider, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Held across several runs, each carrying more than PER_TASK of them.
    monkeypatch.setattr(shard_contract, "ADMIT_PER_TASK", PER_TASK)
    destination, stack, keys = await long_lived_shard(dev_env, stack_factory, fake_provider)

    item_ids = await enqueue_all(stack, destination, keys)
    await until_settled(stack, item_ids, timeout_s=90)

    for item_id in item_ids:
        assert await deliveries(fake_provider, item_id) == 1
        assert await submits(fake_provider, item_id) == 1, item_id
        types = [event.type for event in store.item_events(stack.engine, item_id)]
        assert types == ["enqueued", "accepted", "polled", "polled", "sent"], (item_id, types)
    workflow_id = shard_workflow_id(destination.name, 0)
    runs = await run_inputs(stack, workflow_id)
    carried_in_parts = [run for run in runs if run[1].later]
    assert carried_in_parts, "some run should have carried its items in parts"
    converter = stack.client.data_converter.payload_converter
    for _, start, events in carried_in_parts:
        # The direct part, and each later one, within PER_TASK; each later part its own task.
        assert len(start.items) + sum(1 + len(lane.entries) for lane in start.lanes) <= PER_TASK
        for text in start.later:
            part = converter.from_payload(
                type(events[0].workflow_execution_started_event_attributes.input.payloads[0])(
                    metadata={"encoding": b"json/plain"}, data=text.encode()
                ),
                CarriedPart,
            )
            assert 0 < len(part.items) <= PER_TASK
        assert admit_timers(events) == len(start.later)
    # For the replay tests: a run that admitted parts, and one that cut what it carried.
    await record_history(stack.client, workflow_id, "_admitted", run_id=carried_in_parts[0][0])
    cut = next(run_id for run_id, _, events in runs if any(map(_cut_parts, events)))
    await record_history(stack.client, workflow_id, "_cut", run_id=cut)


async def test_a_cancel_arriving_with_the_first_task_waits_for_the_carried_parts(
    stack_factory, fake_provider
) -> None:
    # The item is in a part the run admits after its first task, and the cancel arrives in that
    # first task: it must find the item, not miss it (the item would then be delivered).
    destination = email_destination(fake_provider, mode="bulk", shards=1)
    stack = await stack_factory(destination)
    key = unique_name("carried")
    item = stack.outbox.new_item("tests", NewItem(destination.name, EMAIL, key), projected=True)
    item_id = item_workflow_id("tests", key)
    part = stack.client.data_converter.payload_converter.to_payload(CarriedPart(items=[item]))
    handle = await stack.client.start_workflow(
        SHARD_WORKFLOW_TYPE,
        ShardInput(destination=destination.name, shard=0, linger_s=1, later=[part.data.decode()]),
        id=shard_workflow_id(destination.name, 0),
        task_queue=stack.task_queue,
        start_signal=CANCEL_ITEM_SIGNAL,
        start_signal_args=[ItemCancel(item_id, CancelRequest(reason="not wanted"))],
    )
    await handle.result()

    assert await submits(fake_provider, item_id) == 0
    row = store.get_item(stack.engine, item_id)
    assert row is not None and row.view.status is ItemStatus.CANCELLED
    events = [event async for event in handle.fetch_history_events()]
    assert admit_timers(events) == 1
    await record_history(stack.client, handle.id)
