"""A submit the server recorded as started that never reached the activity's code (under load,
its start can commit after the matching service stopped waiting: temporalio/temporal#11733) is
tried again after the submit's heartbeat timeout, not after its start-to-close minute, and the
item (or an aggregate's provider call) is sent once. Full bench runs lost a few submits a round
that way (docs/benchmarks.md)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from durable_outbox_temporal.contract.aggregate import aggregate_workflow_id
from durable_outbox_temporal.contract.bulk import shard_workflow_id
from durable_outbox_temporal.contract.ids import provider_idempotency_key
from durable_outbox_temporal.contract.item import (
    SUBMIT_ACTIVITY,
    SUBMIT_BATCH_ACTIVITY,
    ItemStatus,
)
from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

from activities.delivery import HEARTBEAT_TIMEOUT
from readmodel import store
from tests.conftest import email_destination, unique_name
from tests.fakes import deliveries
from tests.workflows.test_bulk import enqueue_in_one_signal, until_settled
from tests.workflows.test_effects import SEATS, PingingFlight, eventually, pinging_flight, settled
from tests.workflows.test_outbox_item import EMAIL

Execute = Callable[[ExecuteActivityInput], Awaitable[Any]]


class FirstRunOf(Interceptor):
    """Each workflow's first run of an activity of `activity_type` on this worker is
    `instead(input, execute)` (`execute` runs the activity itself); every other run is the
    activity's own (the server's retry, or a workflow's own retry in a new activity)."""

    def __init__(
        self, activity_type: str, instead: Callable[[ExecuteActivityInput, Execute], Awaitable[Any]]
    ) -> None:
        self.activity_type = activity_type
        self.instead = instead
        self.taken: set[str] = set()

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _FirstRunOf(next, self)


class _FirstRunOf(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, outer: FirstRunOf) -> None:
        super().__init__(next)
        self.outer = outer

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        outer, info = self.outer, activity.info()
        if info.activity_type != outer.activity_type or info.workflow_id in outer.taken:
            return await super().execute_activity(input)
        outer.taken.add(info.workflow_id or "")
        return await outer.instead(input, super().execute_activity)


class FirstAttemptNeverRuns(FirstRunOf):
    """Each workflow's first activity of `activity_type` is taken by the worker and never
    reaches the activity's code, nor heartbeats, nor answers (as a start no worker received):
    only a worker's shutdown ends it."""

    def __init__(self, activity_type: str) -> None:
        super().__init__(activity_type, self._never_runs)

    async def _never_runs(self, input: ExecuteActivityInput, execute: Execute) -> Any:
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                if activity.is_worker_shutdown():
                    raise


async def retried_within(client: Client, workflow_id: str, activity_type: str) -> list[bool]:
    """For each activity of `activity_type` tried again (by the server, or by the workflow in a
    new activity once one timed out): whether the retry started after the heartbeat timeout
    (and any back-off) and before the start-to-close timeout, which is what a first attempt that
    never answered would have waited for without heartbeats. (The time-skipping server records
    no `last_failure` to tell the timeout by.)"""
    handle = client.get_workflow_handle(workflow_id)
    events = [event async for event in handle.fetch_history_events()]
    scheduled = {
        event.event_id: event
        for event in events
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and event.activity_task_scheduled_event_attributes.activity_type.name == activity_type
    }
    found = []
    timed_out: Any = None  # the schedule of the last activity of the type that timed out
    for event in events:
        if (
            event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT
            and event.activity_task_timed_out_event_attributes.scheduled_event_id in scheduled
        ):
            timed_out = scheduled[event.activity_task_timed_out_event_attributes.scheduled_event_id]
            continue
        started = event.activity_task_started_event_attributes
        if (
            event.event_type != EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
            or started.scheduled_event_id not in scheduled
        ):
            continue
        if started.attempt > 1:
            schedule = scheduled[started.scheduled_event_id]
        elif timed_out is not None:
            schedule, timed_out = timed_out, None
        else:
            continue
        waited = event.event_time.ToDatetime() - schedule.event_time.ToDatetime()
        attributes = schedule.activity_task_scheduled_event_attributes
        assert attributes.heartbeat_timeout.ToTimedelta() == HEARTBEAT_TIMEOUT
        found.append(HEARTBEAT_TIMEOUT <= waited < attributes.start_to_close_timeout.ToTimedelta())
    return found


async def test_a_submit_that_never_ran_is_tried_again_after_its_heartbeat_timeout(
    stack_factory, fake_provider
) -> None:
    destination = email_destination(fake_provider)
    stack = await stack_factory(destination, interceptors=[FirstAttemptNeverRuns(SUBMIT_ACTIVITY)])
    item = await stack.enqueue(destination, EMAIL, key=unique_name("lost"))

    view = await stack.result(item.item_id)

    assert view.status is ItemStatus.SENT
    assert await deliveries(fake_provider, item.item_id) == 1
    assert await retried_within(stack.client, item.item_id, SUBMIT_ACTIVITY) == [True]


async def test_a_shared_submit_that_never_ran_is_tried_again_after_its_heartbeat_timeout(
    stack_factory, fake_provider
) -> None:
    destination = email_destination(fake_provider, mode="bulk", shards=1, submit_batch=5)
    stack = await stack_factory(
        destination, interceptors=[FirstAttemptNeverRuns(SUBMIT_BATCH_ACTIVITY)]
    )
    # Together, in one signal, so that they share one batch whatever the hand-overs' timing.
    item_ids = await enqueue_in_one_signal(
        stack, destination, [unique_name("lost") for _ in range(3)]
    )

    await until_settled(stack, item_ids)

    for item_id in item_ids:
        row = store.get_item(stack.engine, item_id)
        assert row is not None and row.view.status is ItemStatus.SENT, row
        assert await deliveries(fake_provider, item_id) == 1
    shard = shard_workflow_id(destination.name, 0)
    assert await retried_within(stack.client, shard, SUBMIT_BATCH_ACTIVITY) == [True]


async def test_an_effects_provider_call_that_never_ran_is_tried_again_after_its_heartbeat_timeout(
    stack_factory, fake_provider, monkeypatch
) -> None:
    stack, client, flight = await pinging_flight(
        stack_factory, fake_provider, monkeypatch, [FirstAttemptNeverRuns(SUBMIT_ACTIVITY)]
    )
    await client.command(PingingFlight.type_name, flight, "open", SEATS)

    await client.command(
        PingingFlight.type_name, flight, "assign_seat", {"seat": "1B", "passenger_id": "p"}
    )
    [effect] = await eventually(settled(client, PingingFlight.type_name, flight, 1))

    assert effect.status == "done", effect
    stats = await fake_provider.admin.key_stats(provider_idempotency_key(f"effect/{effect.key}"))
    assert stats["deliveries"] == 1, stats
    workflow_id = aggregate_workflow_id(PingingFlight.type_name, flight)
    assert await retried_within(stack.client, workflow_id, SUBMIT_ACTIVITY) == [True]
