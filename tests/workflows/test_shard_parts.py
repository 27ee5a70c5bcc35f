"""A shard admits about `ADMIT_PER_TASK` items a workflow task: what it carries across
continue-as-new past that comes in parts (`ShardInput.later`), a burst of enqueues past it waits
for later tasks, and its other handlers wait for them: docs/decisions/shard-carry-in-parts.md.

These tests lower `ADMIT_PER_TASK`, or name a lower `admit_per_task` in a run's input: each run
admits what its input names, so their histories replay whatever `ADMIT_PER_TASK` is (checked
here, with another value), and they record them for the replay tests."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from durable_outbox_temporal import OutboxClient
from durable_outbox_temporal.contract import bulk as shard_contract
from durable_outbox_temporal.contract.bulk import (
    CANCEL_ITEM_SIGNAL,
    ENQUEUE_SIGNAL,
    SHARD_WORKFLOW_TYPE,
    CarriedPart,
    ItemCancel,
    ShardEnqueue,
    ShardInput,
    shard_workflow_id,
)
from durable_outbox_temporal.contract.ids import item_workflow_id
from durable_outbox_temporal.contract.item import CancelRequest, ItemStatus, NewItem
from durable_outbox_temporal.destinations import DestinationRegistry
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowHandle
from temporalio.worker import Replayer

from readmodel import store
from tests.conftest import (
    email_destination,
    record_history,
    separate_process_client,
    unique_name,
    webhook_destination,
)
from tests.fakes import deliveries, script, submits
from tests.workflows.test_bulk import enqueue_all, long_lived_shard, until_settled
from tests.workflows.test_outbox_item import EMAIL
from worker import SandboxCheckingOnce
from workflows.bulk_shard import BulkShardWorkflow

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


async def replays_with_another_admit_per_task(
    client: Client, workflow_id: str, run_id: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run replays, its commands the same, with `ADMIT_PER_TASK` unlike the value it ran
    with: a release that changes it can finish the runs of the release before."""
    history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
    for now in (PER_TASK + 3, shard_contract.ADMIT_PER_TASK_UNNAMED):
        monkeypatch.setattr(shard_contract, "ADMIT_PER_TASK", now)
        replayer = Replayer(
            workflows=[BulkShardWorkflow],
            workflow_runner=SandboxCheckingOnce(),
            data_converter=client.data_converter,
        )
        await replayer.replay_workflow(history)


async def eventually(
    probe: Callable[[], Awaitable[int]], at_least: int = 1, timeout_s: float = 20
) -> None:
    """Wait until `probe()` counts `at_least`."""
    deadline = time.monotonic() + timeout_s
    while await probe() < at_least:
        assert time.monotonic() < deadline, f"still below {at_least} after {timeout_s} s"
        await asyncio.sleep(0.05)


async def events_of(handle: WorkflowHandle[Any, Any], *types: EventType.ValueType) -> int:
    """Events of these types in the run's history so far."""
    events = [event async for event in handle.fetch_history_events()]
    return sum(1 for event in events if event.event_type in types)


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
        assert start.admit_per_task == PER_TASK
    # The run that cut what it carried asked the patch (its marker).
    assert any(any(map(_cut_parts, events)) for _, _, events in runs)
    # A run of several parts, each admitted in a task of its own: another `ADMIT_PER_TASK`
    # would admit them otherwise.
    run_id, start, _ = max(carried_in_parts, key=lambda run: len(run[1].later))
    assert len(start.later) > 1
    await record_history(stack.client, workflow_id, "_parts", run_id=run_id)
    await replays_with_another_admit_per_task(stack.client, workflow_id, run_id, monkeypatch)


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
    # Its input names no `admit_per_task`: it admits as every run did before it was carried.
    await stack.record_history(handle.id)


# 0: a run admits at least one item a task, whatever its input names.
@pytest.mark.parametrize("per_task", [PER_TASK, 0])
async def test_a_burst_of_enqueues_is_admitted_over_several_tasks_in_order(
    time_skipping_env, stack_factory, fake_provider, monkeypatch: pytest.MonkeyPatch, per_task: int
) -> None:
    # Every signal reaches the shard in its first workflow task (no worker polls its queue until
    # they are all sent): those past PER_TASK items wait for later tasks, in order, and a cancel
    # of one of them waits for it (else it would find nothing and the item would go). The run's
    # input names PER_TASK; `ADMIT_PER_TASK` stays as it is.
    destination = webhook_destination(fake_provider, mode="bulk", shards=1)
    task_queue = unique_name("burst")
    client = time_skipping_env.client
    lane = unique_name("lane")
    keys = [unique_name("burst") for _ in range(9)]
    outbox = OutboxClient(client, DestinationRegistry({destination.name: destination}), task_queue)
    items = [
        outbox.new_item(
            "tests",
            NewItem(destination.name, {"n": n}, key, ordering_key=lane if n >= 6 else None),
            projected=True,
        )
        for n, key in enumerate(keys)
    ]
    handle = await client.start_workflow(
        SHARD_WORKFLOW_TYPE,
        ShardInput(destination=destination.name, shard=0, linger_s=1, admit_per_task=per_task),
        id=shard_workflow_id(destination.name, 0),
        task_queue=task_queue,
        start_signal=ENQUEUE_SIGNAL,
        start_signal_args=[ShardEnqueue(items=items[:3])],
    )
    for batch in (items[3:6], items[6:7], items[7:8], items[8:9]):
        await handle.signal(ENQUEUE_SIGNAL, ShardEnqueue(items=batch))
    # One item admitted in the first task, still queued; one in the lane, admitted later.
    cancelled = {item_workflow_id("tests", keys[n]) for n in (4, 7)}
    for item_id in sorted(cancelled):
        await handle.signal(CANCEL_ITEM_SIGNAL, ItemCancel(item_id, CancelRequest(reason="late")))

    stack = await stack_factory(destination, task_queue=task_queue)
    # Without skipping time: the shard ends by itself a second after its last item.
    await handle.result()

    events = [event async for event in handle.fetch_history_events()]
    assert admit_timers(events) >= 1
    for n, key in enumerate(keys):
        item_id = item_workflow_id("tests", key)
        row = store.get_item(stack.engine, item_id)
        assert row is not None, key
        if item_id in cancelled:
            assert row.view.status is ItemStatus.CANCELLED
            assert await submits(fake_provider, item_id) == 0
        else:
            assert row.view.status is ItemStatus.SENT, (n, row.view.status)
            assert await deliveries(fake_provider, item_id) == 1
    in_lane = [e["payload"]["n"] for e in await fake_provider.admin.deliveries(destination.name)]
    assert [n for n in in_lane if n >= 6] == [6, 8]
    await stack.record_history(handle.id)
    await replays_with_another_admit_per_task(client, handle.id, handle.result_run_id, monkeypatch)


async def test_enqueues_deferred_while_a_continue_as_new_drains_go_into_the_next_run(
    dev_env, stack_factory, fake_provider
) -> None:
    # A continue-as-new waits for the submits out to finish. When the last one's result comes in
    # the same workflow task as two enqueues, the second past what the task admits, the run must
    # admit it before it continues as new: it carried only what it held, and dropped it.
    destination = webhook_destination(fake_provider, mode="bulk", shards=1)
    stack = await stack_factory(destination, env=dev_env)
    keys = [unique_name("drain") for _ in range(5)]
    head, first, deferred, *admitted = (
        stack.outbox.new_item("tests", NewItem(destination.name, {"n": n}, key), projected=True)
        for n, key in enumerate(keys)
    )
    item_ids = [item_workflow_id("tests", key) for key in keys]
    # The head's submit is out for a while: long enough to stop the workflows' worker meanwhile.
    await script(fake_provider, item_ids[0], [{"hang_s": 4}])
    handle = await stack.client.start_workflow(
        SHARD_WORKFLOW_TYPE,
        # Two items a task; past six events (its second task on) it continues as new.
        ShardInput(
            destination=destination.name,
            shard=0,
            linger_s=1,
            admit_per_task=2,
            continue_after_events=6,
        ),
        id=shard_workflow_id(destination.name, 0),
        task_queue=stack.task_queue,
        start_signal=ENQUEUE_SIGNAL,
        start_signal_args=[ShardEnqueue(items=[head])],
    )
    await eventually(lambda: submits(fake_provider, item_ids[0]))
    # Its second task begins the drain, with the head's submit out.
    await handle.signal(ENQUEUE_SIGNAL, ShardEnqueue(items=[first]))
    await eventually(
        lambda: events_of(handle, EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED), at_least=2
    )
    await stack.running[0].shutdown()  # the workflows' worker; the activities' go on
    await handle.signal(ENQUEUE_SIGNAL, ShardEnqueue(items=admitted))
    await handle.signal(ENQUEUE_SIGNAL, ShardEnqueue(items=[deferred]))
    # The first's submit and the head's have answered (the head's hung past its timeout).
    answered = (
        EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED,
        EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED,
        EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT,
    )
    await eventually(lambda: events_of(handle, *answered), at_least=2)
    # One task now holds the head's result and both enqueues.
    await stack_factory(
        destination,
        env=dev_env,
        task_queue=stack.task_queue,
        client=await separate_process_client(dev_env),
    )
    await until_settled(stack, item_ids, timeout_s=30)

    for item_id in item_ids:
        assert await deliveries(fake_provider, item_id) == 1, item_id
    runs = await run_inputs(stack, handle.id)
    assert len(runs) > 1, "the shard should have continued as new"
    # The first run left the second enqueue for a later task.
    first_run = next(
        events for run_id, _, events in runs if run_id == handle.first_execution_run_id
    )
    assert admit_timers(first_run) == 1
    await record_history(stack.client, handle.id, run_id=handle.first_execution_run_id)
