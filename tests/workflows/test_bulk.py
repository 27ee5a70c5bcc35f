"""Bulk mode: a destination's items held by shard workflows that run the item's own delivery
state machine; no workflow per item, shared timers, the same events in the read model."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from durable_outbox_temporal import EnqueueResult
from durable_outbox_temporal.contract import transitions
from durable_outbox_temporal.contract.bulk import SHARD_QUERY, ShardView, shard_workflow_id
from durable_outbox_temporal.contract.ids import item_workflow_id, provider_idempotency_key
from durable_outbox_temporal.contract.item import (
    DeliveryOutcome,
    DeliveryReport,
    ItemStatus,
    NewItem,
    OutboxItemInput,
    OutboxItemView,
    RecipientStatus,
)
from temporalio.api.enums.v1 import EventType
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import Client
from temporalio.service import RPCError

from bench.actions import LOCAL_ACTIVITY_MARKER, billable_actions
from readmodel import store
from readmodel.writer import ProjectionWriter
from service.reports import DeliveryReportService
from tests.conftest import email_destination, unique_name
from tests.fakes import deliveries, script
from tests.workflows.test_delivery_reports import (
    TWO_RECIPIENTS,
    report_events,
    reported,
    without_reports,
)
from tests.workflows.test_outbox_item import EMAIL


async def until_settled(
    stack: Any,
    item_ids: list[str],
    timeout_s: float = 60,
    settled: Callable[[OutboxItemView], bool] = lambda view: view.status.is_final,
    skip_time: bool = True,
) -> None:
    """Wait (letting the server skip time, unless not `skip_time`) until the read model has
    every item settled."""
    deadline = time.monotonic() + timeout_s
    unlocked = (
        stack.env.time_skipping_unlocked()
        if skip_time and stack.env.supports_time_skipping
        else None
    )
    if unlocked is not None:
        await unlocked.__aenter__()
    try:
        while True:
            rows = [store.get_item(stack.engine, item_id) for item_id in item_ids]
            if all(row is not None and settled(row.view) for row in rows):
                return
            if time.monotonic() > deadline:
                unsettled = [
                    (item_id, row.view.status if row else None)
                    for item_id, row in zip(item_ids, rows, strict=True)
                    if row is None or not settled(row.view)
                ]
                raise AssertionError(f"not settled: {unsettled[:5]} ({len(unsettled)} in all)")
            await asyncio.sleep(0.2)
    finally:
        if unlocked is not None:
            await unlocked.__aexit__(None, None, None)


async def enqueue_all(stack: Any, destination: Any, keys: list[str]) -> list[str]:
    writer = ProjectionWriter(stack.engine)

    async def record_queued(item_id: str, item: OutboxItemInput) -> None:
        await writer.write(transitions.enqueued(item_id, item))

    results = await asyncio.gather(
        *(
            stack.outbox.enqueue(
                "tests", destination.name, EMAIL, key=key, record_queued=record_queued
            )
            for key in keys
        )
    )
    return [result.item_id for result in results]


async def enqueue_in_one_signal(stack: Any, destination: Any, keys: list[str]) -> list[str]:
    """As a batch enqueue does: the items reach their shard together, in one signal."""
    writer = ProjectionWriter(stack.engine)
    items = [
        stack.outbox.new_item("tests", NewItem(destination.name, EMAIL, key), projected=True)
        for key in keys
    ]
    await stack.outbox.hand_over(items, strict=True)
    item_ids = [item_workflow_id(item.outbox, item.key) for item in items]
    for item_id, item in zip(item_ids, items, strict=True):
        await writer.write(transitions.enqueued(item_id, item))
    return item_ids


async def no_item_workflow(client: Client, item_id: str) -> bool:
    try:
        await client.get_workflow_handle(item_id).describe()
    except RPCError:
        return True
    return False


async def scheduled_activities(client: Client, destination: str, shard: int = 0) -> list[str]:
    """The activity types the shard's latest run scheduled, in order."""
    return [
        event.activity_task_scheduled_event_attributes.activity_type.name
        for event in await shard_history(client, destination, shard)
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]


async def shard_history(client: Client, destination: str, shard: int) -> list[Any]:
    """The events of the shard's latest run."""
    handle = client.get_workflow_handle(shard_workflow_id(destination, shard))
    return [event async for event in handle.fetch_history_events()]


async def long_lived_shard(
    dev_env: Any, stack_factory: Any, fake_provider: Any
) -> tuple[Any, Any, list[str]]:
    """One shard of 25 items, each polled three times: the dev server suggests continue-as-new
    after 40 events, so it runs through several. It batches submits and polls, which the next
    runs must go on doing. The destination, the stack and the items' keys."""
    destination = email_destination(
        fake_provider, mode="bulk", shards=1, poll_interval_s=0.5, submit_batch=5, poll_batch=5
    )
    stack = await stack_factory(destination, env=dev_env)
    keys = [unique_name("long") for _ in range(25)]
    for key in keys:
        await script(fake_provider, item_workflow_id("tests", key), [{"running_polls": 2}])
    return destination, stack, keys


async def test_bulk_items_are_delivered_once_each_with_the_items_events(
    stack_factory, fake_provider
) -> None:
    destination = email_destination(fake_provider, mode="bulk", shards=2)
    stack = await stack_factory(destination)
    keys = [unique_name("bulk") for _ in range(20)]
    for key in keys[:5]:
        await script(fake_provider, item_workflow_id("tests", key), [{"running_polls": 2}])

    item_ids = await enqueue_all(stack, destination, keys)
    await until_settled(stack, item_ids)

    for item_id, key in zip(item_ids, keys, strict=True):
        row = store.get_item(stack.engine, item_id)
        assert row is not None and row.view.status is ItemStatus.SENT, row
        assert await deliveries(fake_provider, item_id) == 1
        assert await no_item_workflow(stack.client, item_id)
        types = [event.type for event in store.item_events(stack.engine, item_id)]
        polls = ["polled", "polled"] if key in keys[:5] else []
        assert types == ["enqueued", "accepted", *polls, "sent"], (key, types)


async def test_bulk_items_share_their_timers_and_write_no_projection_per_item(
    stack_factory, fake_provider
) -> None:
    destination = email_destination(fake_provider, mode="bulk", shards=1)
    stack = await stack_factory(destination)
    item_ids = await enqueue_all(stack, destination, [unique_name("bulk") for _ in range(30)])
    await until_settled(stack, item_ids)

    # One run: 30 items are far from a suggested continue-as-new.
    events = await shard_history(stack.client, destination.name, 0)
    timers = sum(1 for e in events if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED)
    local_activities = sum(
        1
        for e in events
        if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
        and e.marker_recorded_event_attributes.marker_name == LOCAL_ACTIVITY_MARKER
    )
    # 30 polls waited on far fewer timers; the projections were all the activities' (the run's
    # one other marker is a patch's: its polls can be taken back at a hand-over).
    assert timers < 10, timers
    assert local_activities == 0
    # Signals + submits + polls + timers: about 3 billable actions per item.
    assert billable_actions(events) / 30 <= 3.5


async def test_retry_after_holds_for_a_bulk_item(stack_factory, fake_provider) -> None:
    destination = email_destination(fake_provider, mode="bulk", shards=1, backoff_initial_s=1)
    stack = await stack_factory(destination)
    key = unique_name("bulk")
    await script(
        fake_provider, item_workflow_id("tests", key), [{"status": 429, "retry_after": "120"}]
    )

    [item_id] = await enqueue_all(stack, destination, [key])
    await until_settled(stack, [item_id])

    events = store.item_events(stack.engine, item_id)
    assert [e.type for e in events] == ["enqueued", "submit_failed", "accepted", "sent"]
    # The second attempt came no earlier than the provider's Retry-After.
    assert (events[2].at - events[1].at).total_seconds() >= 120
    assert await deliveries(fake_provider, item_id) == 1


async def test_a_shard_continues_as_new_carrying_its_items_where_they_were(
    dev_env, stack_factory, fake_provider, caplog: pytest.LogCaptureFixture
) -> None:
    destination, stack, keys = await long_lived_shard(dev_env, stack_factory, fake_provider)
    retried = keys[0]
    await script(
        fake_provider,
        item_workflow_id("tests", retried),
        [{"status": 429, "retry_after": "2"}, {"running_polls": 2}],
    )

    item_ids = await enqueue_all(stack, destination, keys)
    await until_settled(stack, item_ids, timeout_s=90)

    for key, item_id in zip(keys, item_ids, strict=True):
        assert await deliveries(fake_provider, item_id) == 1
        events = store.item_events(stack.engine, item_id)
        types = [event.type for event in events]
        expected = ["enqueued", "accepted", "polled", "polled", "sent"]
        if key == retried:
            expected = ["enqueued", "submit_failed", *expected[1:]]
            # Retry-After held across whatever runs came between.
            assert (events[2].at - events[1].at).total_seconds() >= 2
        assert types == expected, (key, types)
        assert [event.seq for event in events] == list(range(1, len(events) + 1))
    runs = [
        execution
        async for execution in stack.client.list_workflows(
            f"WorkflowId = '{shard_workflow_id(destination.name, 0)}'"
        )
    ]
    assert len(runs) > 2, "the shard should have continued as new"
    for run in runs:
        history = stack.client.get_workflow_handle(run.id, run_id=run.run_id)
        scheduled = {
            event.activity_task_scheduled_event_attributes.activity_type.name
            async for event in history.fetch_history_events()
            if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        }
        assert {"submit_item", "poll_operation"}.isdisjoint(scheduled), (run.run_id, scheduled)
    # The Web UI's current details of the (lingering) shard: its counts.
    metadata = await stack.client.get_workflow_handle(shard_workflow_id(destination.name, 0)).query(
        "__temporal_workflow_metadata", result_type=WorkflowMetadata
    )
    assert metadata.current_details.startswith(f"Bulk shard 0 of **{destination.name}**")
    # Each run handed over with deliveries in flight, and the worker evicted it from its cache:
    # an eviction cancels every task, and one that then waited to record a cancel never ended
    # (the worker retried that eviction for ever, holding a slot).
    stuck = [r.getMessage() for r in caplog.records if "eviction" in r.getMessage().lower()]
    assert not stuck, stuck[:1]


async def sent_bulk_item(
    stack: Any, destination: str, payload: dict[str, Any], key: str
) -> EnqueueResult:
    """An item enqueued as the API does (its `queued` row written), once its row says `sent`
    (in real time: skipped time would run out the shard's report window, and end the shard)."""
    writer = ProjectionWriter(stack.engine)

    async def record_queued(item_id: str, item: OutboxItemInput) -> None:
        await writer.write(transitions.enqueued(item_id, item))

    item = await stack.outbox.enqueue(
        "tests", destination, payload, key=key, record_queued=record_queued
    )
    await until_settled(
        stack, [item.item_id], settled=lambda view: view.status is ItemStatus.SENT, skip_time=False
    )
    return item


async def test_delivery_reports_reach_a_bulk_item_through_its_shard(
    stack_factory, fake_provider
) -> None:
    destination = email_destination(fake_provider, mode="bulk", shards=2, report_window_s=3600)
    stack = await stack_factory(destination)
    two = {
        **EMAIL,
        "recipients": {"to": [{"address": "ada@example.com"}], "cc": [{"address": "bob@x.org"}]},
    }
    item = await sent_bulk_item(stack, destination.name, two, unique_name("reported"))
    reports = DeliveryReportService(stack.outbox, stack.engine)
    at = datetime(2026, 11, 23, tzinfo=UTC)
    tally = await reports.receive(
        destination.name,
        [
            DeliveryReport(provider_idempotency_key(item.item_id), address, status, at)
            for address, status in (
                ("ada@example.com", RecipientStatus.DELIVERED),
                ("bob@x.org", RecipientStatus.BOUNCED),
            )
        ],
    )
    assert tally.applied == 2

    def bounced(view: OutboxItemView) -> bool:
        return view.delivery is DeliveryOutcome.BOUNCED and all(
            r.status is not RecipientStatus.PENDING for r in view.recipients
        )

    await until_settled(stack, [item.item_id], settled=bounced, skip_time=False)
    types = [event.type for event in store.item_events(stack.engine, item.item_id)]
    assert types == ["enqueued", "accepted", "sent", "delivery-report", "delivery-report"]


async def test_a_report_after_a_bulk_items_window_is_recorded_in_its_row(
    dev_env, stack_factory, fake_provider
) -> None:
    """The shard lets a sent item go once its report window is over; a report on it then still
    reaches the shard (it runs on), which records it in the item's read-model row (it dropped it
    before), and the report is counted late. On the dev server: the API counts by the row's
    time of sending, the server's, which the time-skipping server's skips put ahead of the
    clock."""
    destination = email_destination(fake_provider, mode="bulk", shards=1, report_window_s=1)
    stack = await stack_factory(destination, env=dev_env)
    [item_id] = await enqueue_all(stack, destination, [unique_name("late")])
    await until_settled(
        stack, [item_id], settled=lambda view: view.status is ItemStatus.SENT, skip_time=False
    )
    shard = stack.client.get_workflow_handle(shard_workflow_id(destination.name, 0))
    deadline = time.monotonic() + 10
    while (view := await shard.query(SHARD_QUERY, result_type=ShardView)).held:
        assert time.monotonic() < deadline, f"the shard still holds {view.by_status}"
        await asyncio.sleep(0.1)

    reports = DeliveryReportService(stack.outbox, stack.engine)
    at = datetime(2026, 11, 23, tzinfo=UTC)
    bounce = DeliveryReport(
        provider_idempotency_key(item_id), "ada@example.com", RecipientStatus.BOUNCED, at
    )
    for _ in range(2):  # a repeat changes nothing
        tally = await reports.receive(destination.name, [bounce])
        assert (tally.applied, tally.late) == (0, 1)

    def bounced(view: OutboxItemView) -> bool:
        return view.delivery is DeliveryOutcome.BOUNCED

    await until_settled(stack, [item_id], settled=bounced, skip_time=False)
    types = [event.type for event in store.item_events(stack.engine, item_id)]
    assert types == ["enqueued", "accepted", "sent", "delivery-report"]
    await stack.record_history(shard_workflow_id(destination.name, 0), "_shard")


@pytest.mark.parametrize("batch", [1, 5], ids=["own-activities", "batched"])
async def test_a_shard_runs_the_items_lifecycle_paths(stack_factory, fake_provider, batch) -> None:
    """The paths the item workflow's tests cover, each one item of one shard: the same
    machine, so the same events and ends, whether each submit and poll is its own activity or
    shares one with the others (a retry, a refusal or a failed operation of one item leaves
    the others' outcomes alone)."""
    destination = email_destination(
        fake_provider,
        mode="bulk",
        shards=1,
        max_attempts=3,
        backoff_initial_s=1,
        poll_deadline_s=30,
        submit_batch=batch,
        poll_batch=batch,
    )
    stack = await stack_factory(destination)
    cases: dict[str, tuple[list[dict[str, Any]], str, list[str] | None]] = {
        "two-polls": ([{"running_polls": 2}], "sent", ["accepted", "polled", "polled", "sent"]),
        "transient": (
            [{"status": 503}, {"status": 500}],
            "sent",
            ["submit_failed", "submit_failed", "accepted", "sent"],
        ),
        "gave-up": (
            [{"status": 503}] * 3,
            "failed",
            ["submit_failed", "submit_failed", "failed"],
        ),
        "refused": ([{"status": 400}], "failed", ["failed"]),
        "op-failed": (
            [{"running_polls": 1, "operation_result": "Failed"}],
            "failed",
            ["accepted", "polled", "failed"],
        ),
        "stuck": ([{"running_polls": 10_000}], "failed", None),
    }
    keys = {name: unique_name(name) for name in cases}
    for name, (steps, _, _) in cases.items():
        await script(fake_provider, item_workflow_id("tests", keys[name]), steps)

    item_ids = await enqueue_in_one_signal(stack, destination, list(keys.values()))
    await until_settled(stack, item_ids)

    for name, (_, status, expected) in cases.items():
        item_id = item_workflow_id("tests", keys[name])
        row = store.get_item(stack.engine, item_id)
        assert row is not None and row.view.status.value == status, (name, row)
        types = [event.type for event in store.item_events(stack.engine, item_id)]
        assert types[0] == "enqueued", (name, types)
        if expected is not None:
            assert types[1:] == expected, (name, types)
    stuck = store.get_item(stack.engine, item_workflow_id("tests", keys["stuck"]))
    assert stuck is not None and "operation timed out" in (stuck.view.last_error or "")
    gave_up = store.get_item(stack.engine, item_workflow_id("tests", keys["gave-up"]))
    assert gave_up is not None and gave_up.view.attempts == 3
    await stack.record_history(shard_workflow_id(destination.name, 0), "_shard")
    scheduled = await scheduled_activities(stack.client, destination.name)
    if batch > 1:
        # Six items submitted in the same step go out in two activities (5 + 1); then at most
        # the two retried items' four retries (backoff jitter may part them).
        assert {"submit_item", "poll_operation"}.isdisjoint(scheduled), scheduled
        assert scheduled[:2] == ["submit_items"] * 2, scheduled
        assert scheduled.count("submit_items") <= 6, scheduled
    else:
        assert {"submit_items", "poll_operations"}.isdisjoint(scheduled), scheduled


async def test_polls_falling_due_together_share_an_activity(stack_factory, fake_provider) -> None:
    destination = email_destination(
        fake_provider, mode="bulk", shards=1, poll_batch=10, poll_rate=100
    )
    stack = await stack_factory(destination)
    keys = [unique_name("batched") for _ in range(20)]
    for key in keys:
        await script(fake_provider, item_workflow_id("tests", key), [{"running_polls": 2}])

    item_ids = await enqueue_all(stack, destination, keys)
    await until_settled(stack, item_ids)

    for item_id in item_ids:
        row = store.get_item(stack.engine, item_id)
        assert row is not None and row.view.status is ItemStatus.SENT, row
        assert row.view.poll_count >= 3
        types = [event.type for event in store.item_events(stack.engine, item_id)]
        assert types[:2] == ["enqueued", "accepted"] and types[-1] == "sent", types
    scheduled = await scheduled_activities(stack.client, destination.name)
    polls = scheduled.count("poll_operations")
    # 20 items polled three times each: 60 polls, in far fewer activities, none alone.
    assert "poll_operation" not in scheduled
    assert 0 < polls <= 30, polls


async def test_a_shard_holds_no_sent_item_for_a_destination_that_takes_no_reports(
    stack_factory, fake_provider
) -> None:
    # No `events_secret`, no window set: its sent items would each stay held for 72 h, for
    # reports that cannot come, in a shard whose continue-as-new writes every item it holds.
    destination = without_reports(fake_provider, mode="bulk", shards=1)
    stack = await stack_factory(destination)
    [item_id] = await enqueue_all(stack, destination, [unique_name("unreported")])
    await until_settled(stack, [item_id], skip_time=False)
    shard = stack.client.get_workflow_handle(shard_workflow_id(destination.name, 0))

    deadline = time.monotonic() + 10
    while (view := await shard.query(SHARD_QUERY, result_type=ShardView)).held:
        assert time.monotonic() < deadline, f"the shard still holds {view.by_status}"
        await asyncio.sleep(0.2)
    row = store.get_item(stack.engine, item_id)
    assert row is not None and row.view.recipients == []


async def test_a_report_as_the_window_closes_while_another_is_projected_is_applied(
    dev_env, stack_factory, fake_provider
) -> None:
    """In a shard, the window's end comes while ada's report is being projected (the read model
    held by this test): the delivery closes its window and waits for that handler (any of the
    shard's) before it is let go. Bob's report, arriving then, is applied as one within the
    window; it was dropped, and bob stayed pending for good. On the dev server: real time, real
    workflow-task heartbeats. (An item workflow of its own does not drop it: its completion,
    refused for the new signal, replays the timer and the signal in one activation, the signal
    first.)"""
    destination = email_destination(fake_provider, mode="bulk", shards=1, report_window_s=2)
    stack = await stack_factory(destination, env=dev_env)
    item = await sent_bulk_item(stack, destination.name, TWO_RECIPIENTS, unique_name("closing"))
    shard = stack.client.get_workflow_handle(shard_workflow_id(destination.name, 0))
    ada = reported(item.item_id, "ada@example.com", RecipientStatus.DELIVERED)
    bob = reported(item.item_id, "bob@example.com", RecipientStatus.BOUNCED)

    held = stack.engine.connect()
    held.exec_driver_sql("BEGIN IMMEDIATE")  # ada's projection waits for it
    try:
        assert await stack.outbox.report_delivery(item.item_id, ada, destination.name)
        # The task that closed the window is completed (the worker's heartbeat of a task whose
        # local activity runs on): bob's report comes in a task of its own.
        await task_after(shard, EventType.EVENT_TYPE_TIMER_FIRED, last_timer=True)
        signals = sum(
            e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
            for e in (await shard.fetch_history()).events
        )
        assert await stack.outbox.report_delivery(item.item_id, bob, destination.name)
        # Buffered while the task runs on, it comes with the next one (ada's projection still
        # held): the delivery is closed and still held then.
        await task_after(
            shard,
            EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED,
            count=signals + 1,
            completed=False,
        )
    finally:
        held.rollback()
        held.close()

    def both_reported(view: OutboxItemView) -> bool:
        return all(r.status is not RecipientStatus.PENDING for r in view.recipients)

    await until_settled(stack, [item.item_id], settled=both_reported, skip_time=False)
    row = store.get_item(stack.engine, item.item_id)
    assert row is not None
    assert {r.address: r.status for r in row.view.recipients} == {
        "ada@example.com": RecipientStatus.DELIVERED,
        "bob@example.com": RecipientStatus.BOUNCED,
    }
    assert len(report_events(stack, item.item_id)) == 2
    await stack.record_history(shard_workflow_id(destination.name, 0), "_shard")


async def task_after(
    handle: Any,
    event_type: int,
    *,
    last_timer: bool = False,
    count: int = 1,
    completed: bool = True,
) -> None:
    """Once a workflow task that holds the `count`th event of `event_type` (with `last_timer`:
    the firing of the last timer started) was started, or `completed`; then a moment more for
    the worker to apply it."""
    done = (
        EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
        if completed
        else EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED
    )
    for _ in range(600):
        events = (await handle.fetch_history()).events
        timers = [e for e in events if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED]
        found = [
            i
            for i, e in enumerate(events)
            if e.event_type == event_type
            and not (
                last_timer
                and timers
                and e.timer_fired_event_attributes.started_event_id != timers[-1].event_id
            )
        ]
        if len(found) >= count:
            later = events[found[count - 1] :]
            started = next(
                (
                    i
                    for i, e in enumerate(later)
                    if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED
                ),
                None,
            )
            if started is not None and any(e.event_type == done for e in later[started:]):
                await asyncio.sleep(0.5)
                return
        await asyncio.sleep(0.1)
    raise AssertionError(f"no workflow task took {EventType.Name(event_type)}")
