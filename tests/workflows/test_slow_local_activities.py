"""A workflow whose local activity outlasts its workflow tasks (a shard's or an item's write to a
held read model, a flow's rate change held by the test): each task that takes new events
meanwhile sends a command, so a replay takes each as it ran, never together with the next one
under a later time (`workflows/slow_local_activities.py`, temporalio/sdk-rust#1606). On the dev
server, each workflow started with a short task timeout (a task waiting on a local activity is
completed at four fifths of it)."""

from __future__ import annotations

import asyncio
import itertools
import time
from datetime import UTC, datetime, timedelta

from durable_outbox_temporal.contract.bulk import (
    SHARD_WORKFLOW_TYPE,
    SHARDS_MEMO,
    ShardInput,
    shard_workflow_id,
)
from durable_outbox_temporal.contract.flow import (
    APPLY_RATE_ACTIVITY,
    FAILING_SIGNAL,
    FLOW_WORKFLOW_TYPE,
    Failing,
    FlowState,
)
from durable_outbox_temporal.contract.ids import item_workflow_id
from durable_outbox_temporal.contract.item import (
    DELIVERY_REPORT_SIGNAL,
    PROJECT_ACTIVITY,
    DeliveryOutcome,
    ItemStatus,
    NewItem,
    RecipientStatus,
)
from durable_outbox_temporal.contract.item import WORKFLOW_TYPE as ITEM_WORKFLOW_TYPE
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowHandle, WorkflowHistory
from temporalio.worker import (
    Replayer,
    Worker,
)

from activities.flow import apply_flow_rate
from flowcontrol.queue_rates import read_queue_rate
from tests.conftest import email_destination, unique_name
from tests.fakes import deliveries
from tests.workflows.held_activities import HoldActivities
from tests.workflows.test_bulk import until_settled
from tests.workflows.test_delivery_reports import HOUR, TWO_RECIPIENTS, reported
from tests.workflows.test_destination_flow import failing_report
from tests.workflows.test_outbox_item import EMAIL, wait_for_status
from worker import WORKFLOWS, SandboxCheckingOnce
from workflows.destination_flow import SLOW_CHANGE_TASKS_MEMO, DestinationFlowWorkflow
from workflows.slow_local_activities import SLOW_WRITE_TASKS_MEMO

TASK_TIMEOUT = timedelta(seconds=1.5)
HEARTBEAT = TASK_TIMEOUT * 0.8
COMPLETED = EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
# Events a workflow task is scheduled for (not a heartbeat of a task waiting on its local
# activity, which has none).
NEW_WORK = {
    EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED,
    EventType.EVENT_TYPE_TIMER_FIRED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED,
}


async def test_tasks_that_run_while_a_projection_is_held_each_send_a_command(
    dev_env, stack_factory, fake_provider
) -> None:
    destination = email_destination(fake_provider, mode="bulk", shards=1)
    stack = await stack_factory(destination, env=dev_env)
    shard = await stack.client.start_workflow(
        SHARD_WORKFLOW_TYPE,
        ShardInput(destination=destination.name, shard=0),
        id=shard_workflow_id(destination.name, 0),
        task_queue=stack.task_queue,
        memo={SHARDS_MEMO: 1},
        task_timeout=TASK_TIMEOUT,
    )
    now = datetime.now(UTC)
    # Both wait for their time while the read model is held: the first one's projection
    # before its submit waits for it, and the second one's timer fires while it is out.
    items = [
        await stack.outbox.enqueue(
            "tests", destination.name, EMAIL, key=unique_name("slow"), not_before=now + delay
        )
        for delay in (timedelta(seconds=1), timedelta(seconds=2))
    ]
    held = stack.engine.connect()
    held.exec_driver_sql("BEGIN IMMEDIATE")
    try:
        await _taken(shard, EventType.EVENT_TYPE_TIMER_FIRED, count=2)
    finally:
        held.rollback()
        held.close()
    await until_settled(stack, [item.item_id for item in items], skip_time=False)
    for item in items:
        assert await deliveries(fake_provider, item.item_id) == 1

    # The run started here (the dev server suggests continue-as-new at 40 events: the held
    # stretch's tasks take it past that, and a later run takes the items on).
    first_run = stack.client.get_workflow_handle(shard.id, run_id=shard.result_run_id)
    events = (await first_run.fetch_history()).events
    taken = assert_each_sent_a_command(events, "project_items")
    assert await (await first_run.describe()).memo_value(SLOW_WRITE_TASKS_MEMO) >= taken
    await Replayer(workflows=WORKFLOWS, workflow_runner=SandboxCheckingOnce()).replay_workflow(
        WorkflowHistory(shard.id, events)
    )


async def test_an_items_tasks_while_its_projection_is_held_each_send_a_command(
    dev_env, stack_factory, fake_provider
) -> None:
    """An item-mode item listening for its recipients' reports: the first report's handler
    writes it to a held read model, the second comes in a task after that write's first
    heartbeat and settles nothing. Its event is recorded at that task's `now()`: a replay that
    took the task with the next one would record it later."""
    destination = email_destination(fake_provider, report_window_s=HOUR)
    stack = await stack_factory(destination, env=dev_env)
    key = unique_name("slow-item")
    item = stack.outbox.new_item(
        "tests", NewItem(destination=destination.name, payload=TWO_RECIPIENTS, key=key)
    )
    handle = await stack.client.start_workflow(
        ITEM_WORKFLOW_TYPE,
        item,
        id=item_workflow_id(item.outbox, item.key),
        task_queue=stack.task_queue,
        task_timeout=TASK_TIMEOUT,
    )
    await wait_for_status(stack, key, status=ItemStatus.SENT)
    since = len((await handle.fetch_history()).events)
    held = stack.engine.connect()
    held.exec_driver_sql("BEGIN IMMEDIATE")
    try:
        await handle.signal(
            DELIVERY_REPORT_SIGNAL,
            reported(handle.id, "ada@example.com", RecipientStatus.DELIVERED),
        )
        # Past the first heartbeat of the task whose handler began the held write.
        await asyncio.sleep(HEARTBEAT.total_seconds() * 1.5)
        # Not settled (a quarantined message may still be released): the report window's
        # timer stays, so the task taking it has no command of its own to send.
        await handle.signal(
            DELIVERY_REPORT_SIGNAL,
            reported(handle.id, "bob@example.com", RecipientStatus.QUARANTINED, seconds=1),
        )
        await _taken(handle, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED, count=2, since=since)
    finally:
        held.rollback()
        held.close()
    await handle.signal(
        DELIVERY_REPORT_SIGNAL,
        reported(handle.id, "bob@example.com", RecipientStatus.DELIVERED, seconds=2),
    )
    view = await stack.result(handle.id)

    assert view.status is ItemStatus.SENT and view.delivery is DeliveryOutcome.DELIVERED
    assert await deliveries(fake_provider, handle.id) == 1
    events = list((await handle.fetch_history()).events)
    assert_each_sent_a_command(events, PROJECT_ACTIVITY, since)
    assert await (await handle.describe()).memo_value(SLOW_WRITE_TASKS_MEMO) >= 1
    await Replayer(workflows=WORKFLOWS, workflow_runner=SandboxCheckingOnce()).replay_workflow(
        WorkflowHistory(handle.id, events)
    )
    await stack.record_history(handle.id)


def assert_each_sent_a_command(
    events: list[HistoryEvent], activity_type: str, since: int = 0
) -> int:
    """Each task that took new events while the local activity was out sent a command (its
    completion is not followed at once by the next task's scheduling); how many there were."""
    taken = tasks_with_new_work_while_out(events, activity_type, since)
    assert taken, f"a task took new events while {activity_type} was out"
    for completed in taken:
        assert events[completed + 1].event_type != EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED, (
            f"the task completed at event {events[completed].event_id} sent no command"
        )
    return len(taken)


async def _taken(
    handle: WorkflowHandle, event_type: EventType.ValueType, *, count: int, since: int = 0
) -> None:
    """Until the `count`th event of `event_type` after event index `since` (a timer's firing, a
    signal) was taken by a completed task."""
    deadline = time.monotonic() + 30
    while True:
        events = (await handle.fetch_history()).events
        found = [i for i, e in enumerate(events) if i >= since and e.event_type == event_type]
        if len(found) >= count and any(
            e.event_type == COMPLETED for e in events[found[count - 1] :]
        ):
            return
        assert time.monotonic() < deadline, f"{count} of {EventType.Name(event_type)} never taken"
        await asyncio.sleep(0.05)


def tasks_with_new_work_while_out(
    events: list[HistoryEvent], activity_type: str, since: int = 0
) -> list[int]:
    """The completions of the workflow tasks that took new events while the first local
    activity of `activity_type` recorded after event index `since` was out since an earlier
    task: before its marker, each right after a task completed at its heartbeat (a local
    activity out through it)."""
    marker = next(
        i
        for i, e in enumerate(events)
        if i >= since
        and e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
        and activity_type.encode() in e.SerializeToString()
    )
    started = [
        i
        for i in range(since, marker)
        if events[i].event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED
    ]
    taken = []
    for before, task in itertools.pairwise(started):
        completed = next(i for i in range(task, len(events)) if events[i].event_type == COMPLETED)
        scheduled = max(
            i
            for i in range(task)
            if events[i].event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED
        )
        took_new_work = events[scheduled - 1].event_type in NEW_WORK
        if completed < marker and took_new_work and _at_heartbeat(events, before):
            taken.append(completed)
    return taken


def _at_heartbeat(events: list[HistoryEvent], started: int) -> bool:
    """Whether the task started at `started` was completed by its worker's heartbeat."""
    completed = next(i for i in range(started, len(events)) if events[i].event_type == COMPLETED)
    took = events[completed].event_time.ToDatetime() - events[started].event_time.ToDatetime()
    return took >= HEARTBEAT * 0.9


async def test_a_flows_tasks_while_a_rate_change_is_held_each_send_a_command(dev_env) -> None:
    client = dev_env.client
    name = unique_name("flow")
    queues = {"submit": f"{name}-submit", "poll": f"{name}-poll", "workflows": f"{name}-wf"}
    # The circuit's opening held past two heartbeats of its task (1.2 s and 2.4 s after it
    # started): a report sent meanwhile is taken by the task after the first.
    hold = HoldActivities(APPLY_RATE_ACTIVITY, HEARTBEAT.total_seconds() * 2.5, held=True)

    def report() -> Failing:
        return failing_report(name, queues["submit"], queues["poll"], probe_interval_s=60.0)

    async with Worker(
        client,
        task_queue=queues["workflows"],
        workflows=[DestinationFlowWorkflow],
        activities=[apply_flow_rate],
        interceptors=[hold],
    ):
        handle = await client.start_workflow(
            FLOW_WORKFLOW_TYPE,
            FlowState(
                destination=name,
                task_queue=queues["submit"],
                configured_rate=4.0,
                ramp_step_s=1.0,
                storm_window_s=30.0,
            ),
            id=f"flow/{name}",
            task_queue=queues["workflows"],
            task_timeout=TASK_TIMEOUT,
            start_signal=FAILING_SIGNAL,
            start_signal_args=[report()],
        )
        try:
            await asyncio.sleep(0.3)
            await handle.signal(
                FAILING_SIGNAL, failing_report(name, queues["submit"], queues["poll"])
            )
            await _paused(client, queues["submit"])
            hold.held = False
            events = await _recorded(handle, APPLY_RATE_ACTIVITY)
            assert_each_sent_a_command(events, APPLY_RATE_ACTIVITY)
            memo = await (await handle.describe()).memo_value(SLOW_CHANGE_TASKS_MEMO)
            assert memo >= 1
            await Replayer(workflows=[DestinationFlowWorkflow]).replay_workflow(
                WorkflowHistory(handle.id, events)
            )
        finally:
            await handle.terminate("test over")


async def _recorded(handle: WorkflowHandle, activity_type: str) -> list[HistoryEvent]:
    """The history once it holds the result of a local activity of `activity_type`."""
    deadline = time.monotonic() + 30
    while True:
        events = list((await handle.fetch_history()).events)
        if any(
            e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
            and activity_type.encode() in e.SerializeToString()
            for e in events
        ):
            return events
        assert time.monotonic() < deadline, f"no {activity_type} result recorded"
        await asyncio.sleep(0.1)


async def _paused(client: Client, queue: str) -> None:
    """Until the circuit's opening paused the submit queue (the held change went through)."""
    deadline = time.monotonic() + 30
    while not (await read_queue_rate(client, queue)).paused:
        assert time.monotonic() < deadline, "the circuit never opened"
        await asyncio.sleep(0.1)
