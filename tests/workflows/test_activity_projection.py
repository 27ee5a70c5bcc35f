"""Projections written where the I/O already happens: the enqueuer writes the `queued` row, the
submit and poll activities write the transitions they cause, and the item workflow runs no local
activity on its happy path. An activities-only worker (no read model) leaves them to the
workflow, and the read model ends the same either way."""

from __future__ import annotations

import copy
import dataclasses
from contextlib import AsyncExitStack
from typing import Any

import httpx
import pytest
from durable_outbox_temporal import OutboxClient
from durable_outbox_temporal.contract import transitions
from durable_outbox_temporal.contract.ids import item_workflow_id, provider_idempotency_key
from durable_outbox_temporal.contract.item import (
    POLL_ACTIVITY,
    ItemStatus,
    OperationStatus,
    OutboxItemInput,
    OutboxItemState,
    OutboxItemView,
    PollRequest,
    SubmitRequest,
)
from durable_outbox_temporal.destinations import DestinationRegistry
from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.testing import ActivityEnvironment
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

from activities.delivery import DeliveryActivities
from activities.delivery_projection import ProjectedHere
from activities.providers import build_provider
from flowcontrol.adaptive import AdaptiveMeter
from flowcontrol.breaker import BreakerGate
from flowcontrol.caps import NoCapsGate
from flowcontrol.guard import FlowGuard, NoAttemptLog
from flowcontrol.pacing import RequestPacer
from flowcontrol.throttle import ThrottleGate
from readmodel import store
from readmodel.db import create_schema, make_engine
from readmodel.writer import ProjectionWriter
from tests.conftest import email_destination, unique_name, webhook_destination, workflow_result
from tests.workflows.test_outbox_item import EMAIL
from worker import build_workers


async def local_activities(client: Client, item_id: str) -> int:
    return len(
        [
            event
            async for event in client.get_workflow_handle(item_id).fetch_history_events()
            if event.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
        ]
    )


def no_flow_rules() -> FlowGuard:
    """A guard with no rule for any destination: each request goes straight through."""
    return FlowGuard(
        RequestPacer({}),
        ThrottleGate({}),
        BreakerGate({}),
        NoCapsGate({}),
        attempt_log=NoAttemptLog(),
        adaptive=AdaptiveMeter({}),
        flow_task_queue="flows",
        events_task_queue="events",
    )


def same_view(row: OutboxItemView, live: OutboxItemView) -> None:
    """The read model's row is the workflow's final view, field for field."""
    assert dataclasses.asdict(row) == dataclasses.asdict(live)


async def test_a_polled_item_runs_no_local_activity_and_its_row_is_its_view(
    stack_factory, fake_provider
) -> None:
    destination = email_destination(fake_provider)
    stack = await stack_factory(destination)
    writer = ProjectionWriter(stack.engine)

    async def record_queued(item_id: str, item: OutboxItemInput) -> None:
        await writer.write(transitions.enqueued(item_id, item))
        # Written right after the start, before the worker has done anything.
        queued = store.get_item(stack.engine, item_id)
        assert queued is not None and queued.view.status is ItemStatus.QUEUED

    key = unique_name("k")
    await stack.fake.admin.script(
        provider_idempotency_key(item_workflow_id("tests", key)), [{"running_polls": 1}]
    )
    item = await stack.outbox.enqueue(
        "tests", destination.name, EMAIL, key=key, record_queued=record_queued
    )
    view = await stack.result(item.item_id)

    assert view.status is ItemStatus.SENT
    assert await local_activities(stack.client, item.item_id) == 0
    row = store.get_item(stack.engine, item.item_id)
    assert row is not None
    same_view(row.view, view)
    events = store.item_events(stack.engine, item.item_id)
    assert [event.type for event in events] == ["enqueued", "accepted", "polled", "sent"]
    assert [event.seq for event in events] == [1, 2, 3, 4]
    assert events[0].at == view.created_at
    assert events[-1].at == view.finished_at == view.updated_at


async def test_an_item_enqueued_without_its_row_gets_it_from_its_first_submit(
    stack_factory, fake_provider
) -> None:
    destination = webhook_destination(fake_provider)
    stack = await stack_factory(destination)

    item = await stack.enqueue(destination, {"event": "order.paid"})
    view = await stack.result(item.item_id)

    # The workflow projects `enqueued` itself (the one local activity); the submit writes `sent`.
    assert await local_activities(stack.client, item.item_id) == 1
    row = store.get_item(stack.engine, item.item_id)
    assert row is not None
    same_view(row.view, view)
    events = store.item_events(stack.engine, item.item_id)
    assert [event.type for event in events] == ["enqueued", "sent"]


async def test_an_activities_only_worker_leaves_the_projections_to_the_workflow(
    time_skipping_env, fake_provider, engine
) -> None:
    destination = email_destination(fake_provider)
    client = time_skipping_env.client
    task_queue = unique_name("workflows")
    async with AsyncExitStack() as stack, httpx.AsyncClient() as http:
        # The workflows' process has the read model; the destination's activities run in a
        # process without one (`worker.py --no-workflows`).
        for worker in [
            *build_workers(
                client,
                destinations=[],
                http_client=http,
                engine=engine,
                workflow_task_queue=task_queue,
                sandboxed=True,
            ),
            *build_workers(
                client,
                destinations=[destination],
                http_client=http,
                engine=None,
                workflow_task_queue=task_queue,
                run_workflows=False,
            ),
        ]:
            await stack.enter_async_context(worker)
        outbox = OutboxClient(
            client, DestinationRegistry({destination.name: destination}), task_queue
        )
        item = await outbox.enqueue("tests", destination.name, EMAIL, key=unique_name("k"))
        async with time_skipping_env.time_skipping_unlocked():
            view: Any = await workflow_result(
                client.get_workflow_handle(item.item_id, result_type=OutboxItemView)
            )

    assert view.status is ItemStatus.SENT
    # enqueued, accepted, sent: each by the workflow's local activity.
    assert await local_activities(client, item.item_id) == 3
    row = store.get_item(engine, item.item_id)
    assert row is not None
    same_view(row.view, view)
    assert [e.type for e in store.item_events(engine, item.item_id)] == [
        "enqueued",
        "accepted",
        "sent",
    ]


async def test_a_failed_write_leaves_the_transition_to_the_workflow(
    fake_provider, tmp_path
) -> None:
    destination = webhook_destination(fake_provider)
    # A read model the activity cannot write (its directory does not exist).
    broken = ProjectionWriter(make_engine(f"sqlite:///{tmp_path / 'gone' / 'readmodel.db'}"))
    item = OutboxItemInput(
        outbox="tests",
        key="k",
        destination=destination.name,
        payload={"event": "order.paid"},
        payload_hash="h",
        policy=destination.policy(),
        activities_project=True,
    )
    state = OutboxItemState(started=True, attempts=1)
    async with httpx.AsyncClient() as http:
        activities = DeliveryActivities(
            {destination.name: build_provider(destination, http)},
            no_flow_rules(),
            ProjectedHere(broken),
        )
        result = await ActivityEnvironment().run(
            activities.submit_item,
            SubmitRequest(
                destination=destination.name,
                item_id="tests/k",
                idempotency_key=unique_name("idem"),
                payload=item.payload,
                attempt=1,
                projection=transitions.for_activity(item, state),
            ),
        )

    # Delivered all the same; the workflow writes the `sent` row with its local activity.
    assert result.delivered and result.projected_at is None


@pytest.mark.parametrize("again", ["retried", "taken-back"])
async def test_a_retried_poll_numbers_its_outcome_after_a_killed_attempt_that_projected(
    fake_provider, tmp_path, again: str
) -> None:
    """Attempt 1 of a poll saw Running and wrote it, then its worker died before reporting;
    attempt 2 sees Succeeded. Rows are idempotent by (item, seq): had the retry reused seq 2,
    the read model would keep `sending` for ever (seen in a full bulk `make chaos`).

    `taken-back`: the server's retry never ran, its host took the poll back at a hand-over
    while the retry waited out its backoff (`workflows.delivery.Delivery._poll_once`); the
    next run's poll is a first attempt, told by the item's state that rows may lead."""
    destination = email_destination(fake_provider)
    engine = make_engine(f"sqlite:///{tmp_path / 'readmodel.db'}")
    create_schema(engine)
    writer = ProjectionWriter(engine)
    item = OutboxItemInput(
        outbox="tests",
        key=unique_name("k"),
        destination=destination.name,
        payload=EMAIL,
        payload_hash="h",
        policy=destination.policy(),
        activities_project=True,
    )
    item_id = item_workflow_id(item.outbox, item.key)
    key = provider_idempotency_key(item_id)
    # The operation answers Running once, then Succeeded.
    await fake_provider.admin.script(key, [{"running_polls": 1}])
    state = OutboxItemState(started=True, attempts=1)
    first, retry = ActivityEnvironment(), ActivityEnvironment()
    if again == "retried":
        retry.info = dataclasses.replace(retry.info, attempt=2)
    async with httpx.AsyncClient() as http:
        activities = DeliveryActivities(
            {destination.name: build_provider(destination, http)},
            no_flow_rules(),
            ProjectedHere(writer),
        )
        submitted = await first.run(
            activities.submit_item,
            SubmitRequest(
                destination=destination.name,
                item_id=item_id,
                idempotency_key=key,
                payload=item.payload,
                attempt=1,
                projection=transitions.for_activity(item, state),
            ),
        )
        # As the workflow does with an answer its activity projected.
        transitions.apply_submit_result(item, state, submitted, submitted.projected_at)
        state.events.clear()
        request = PollRequest(
            destination=destination.name,
            item_id=item_id,
            operation_url=state.operation_url or "",
            projection=transitions.for_activity(item, state),
        )
        # The server retries with the request it scheduled (the activity changes its copy).
        same_request = copy.deepcopy(request)
        if again == "taken-back":
            assert same_request.projection is not None
            same_request.projection.state.rows_may_lead = True
        lost = await first.run(activities.poll_operation, request)
        assert lost.status is OperationStatus.RUNNING and lost.projected_at is not None
        assert lost.projected_seq is None
        retried = await retry.run(activities.poll_operation, same_request)

    assert retried.status is OperationStatus.SUCCEEDED
    assert retried.projected_at is not None and retried.projected_seq == 3
    row = store.get_item(engine, item_id)
    assert row is not None and row.view.status is ItemStatus.SENT
    assert [(e.seq, e.type.value) for e in store.item_events(engine, item_id)] == [
        (1, "accepted"),
        (2, "polled"),
        (3, "sent"),
    ]
    engine.dispose()


class LoseFirstReport(Interceptor):
    """The first attempt of each activity of `activity_type` does its work (calls the provider,
    writes its rows) and then fails as a worker killed before reporting would: the server
    retries it."""

    def __init__(self, activity_type: str) -> None:
        self.activity_type = activity_type

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _LoseReport(next, self.activity_type)


class _LoseReport(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, activity_type: str) -> None:
        super().__init__(next)
        self.activity_type = activity_type

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        result = await super().execute_activity(input)
        info = activity.info()
        if info.activity_type == self.activity_type and info.attempt == 1:
            raise RuntimeError(f"worker lost before it reported {self.activity_type}")
        return result


async def test_the_workflow_numbers_a_retried_polls_outcome_as_the_activity_did(
    stack_factory, fake_provider
) -> None:
    destination = email_destination(fake_provider)
    stack = await stack_factory(destination, interceptors=[LoseFirstReport(POLL_ACTIVITY)])
    key = unique_name("k")
    await stack.fake.admin.script(
        provider_idempotency_key(item_workflow_id("tests", key)), [{"running_polls": 1}]
    )
    item = await stack.enqueue(destination, EMAIL, key=key)
    view = await stack.result(item.item_id)

    assert view.status is ItemStatus.SENT
    events = store.item_events(stack.engine, item.item_id)
    # The lost attempt's Running stays as what the provider answered; the retry's outcome
    # follows it, and the workflow's view counts it too (a workflow that kept its own numbering
    # would end one event behind its row, and number its next events over the row's).
    assert [(event.seq, event.type) for event in events] == [
        (1, "enqueued"),
        (2, "accepted"),
        (3, "polled"),
        (4, "sent"),
    ]
    row = store.get_item(stack.engine, item.item_id)
    assert row is not None
    same_view(row.view, view)
