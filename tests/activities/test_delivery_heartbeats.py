"""Submits and polls heartbeat while they run when their workflow gave them a heartbeat timeout,
so a task the server recorded as started that reached no worker is tried again after that
timeout instead of its start-to-close minute (temporalio/temporal#11733; full bench runs lost a
few submits a round that way). The cancels heartbeats bring back act only before any request
went: after, the activity's outcome stands, so no request's fate is left unknown."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
from durable_outbox_temporal.codec import data_converter
from durable_outbox_temporal.contract.ids import provider_idempotency_key
from durable_outbox_temporal.contract.item import (
    BatchProgress,
    SubmitOutcome,
    SubmitRequest,
    SubmitResult,
)
from temporalio import activity, workflow
from temporalio.common import RetryPolicy
from temporalio.converter import DataConverter
from temporalio.testing import ActivityEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from activities.delivery import (
    HEARTBEAT_TIMEOUT as WORKFLOWS_HEARTBEAT_TIMEOUT,
)
from activities.delivery import (
    DeliveryActivities,
    _request_goes,
    _to_the_end,
    recorded_by_the_last_attempt,
)
from activities.delivery_projection import LeftToWorkflow
from activities.providers import build_provider
from tests.conftest import unique_name, webhook_destination
from tests.fakes import submits
from tests.workflows.test_activity_projection import no_flow_rules

HEARTBEAT_TIMEOUT = timedelta(seconds=0.6)


def environment(heartbeat_timeout: timedelta | None = HEARTBEAT_TIMEOUT) -> ActivityEnvironment:
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, heartbeat_timeout=heartbeat_timeout)
    return env


@contextlib.asynccontextmanager
async def submitting(
    fake_provider: Any, *, held_s: float = 0.0
) -> AsyncIterator[tuple[DeliveryActivities, SubmitRequest]]:
    """The submit activity over a webhook at the fake provider, its guard holding each request
    `held_s` (as pacing or a cap would) before it goes."""
    destination = webhook_destination(fake_provider)
    guard = no_flow_rules()

    @contextlib.asynccontextmanager
    async def held(request: SubmitRequest) -> AsyncIterator[None]:
        await asyncio.sleep(held_s)
        yield

    item_id = f"tests/{unique_name('beats')}"
    request = SubmitRequest(
        destination=destination.name,
        item_id=item_id,
        idempotency_key=provider_idempotency_key(item_id),
        payload={"event": "order.paid"},
        attempt=1,
    )
    async with httpx.AsyncClient() as http:
        activities = DeliveryActivities(
            {destination.name: build_provider(destination, http)}, guard, LeftToWorkflow()
        )
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(guard, "submit", held)
            yield activities, request


async def slow_answer(fake_provider: Any, request: SubmitRequest, seconds: float) -> None:
    await fake_provider.admin.script(request.idempotency_key, [{"latency_ms": seconds * 1000}])


async def submit_counting_heartbeats(
    fake_provider: Any, heartbeat_timeout: timedelta | None, answer_s: float
) -> tuple[SubmitResult, list[tuple[Any, ...]], SubmitRequest]:
    """A submit whose provider answers after `answer_s`: its result and its heartbeats."""
    env = environment(heartbeat_timeout)
    beats: list[tuple[Any, ...]] = []
    env.on_heartbeat = lambda *details: beats.append(details)
    async with submitting(fake_provider) as (activities, request):
        await slow_answer(fake_provider, request, answer_s)
        result: SubmitResult = await env.run(activities.submit_item, request)
    return result, beats, request


async def test_a_request_longer_than_the_heartbeat_timeout_heartbeats_and_ends_sent(
    fake_provider,
) -> None:
    result, beats, request = await submit_counting_heartbeats(
        fake_provider, HEARTBEAT_TIMEOUT, answer_s=1.5
    )

    assert result.delivered
    # A heartbeat every 0.2 s from 0.2 s on, through a 1.5 s request: the server hears from it
    # well within each 0.6 s.
    assert len(beats) >= 4, beats
    assert await submits(fake_provider, request.item_id) == 1


async def test_a_short_request_sends_no_heartbeat(fake_provider) -> None:
    # The workflows' timeout (a first heartbeat after 3.3 s), not this module's 0.6 s: a request
    # the provider answers at once took over 0.2 s on a loaded machine (a fresh clone's CI) and
    # sent one.
    result, beats, _ = await submit_counting_heartbeats(
        fake_provider, WORKFLOWS_HEARTBEAT_TIMEOUT, 0.0
    )

    assert result.delivered
    assert beats == []


async def test_without_a_heartbeat_timeout_a_long_request_sends_none(fake_provider) -> None:
    # A workflow from before scheduled its submits without one (so did an aggregate's effect).
    result, beats, _ = await submit_counting_heartbeats(fake_provider, None, answer_s=1.0)

    assert result.delivered
    assert beats == []


async def test_a_cancel_once_the_request_went_leaves_the_submit_to_its_end(fake_provider) -> None:
    env = environment()
    async with submitting(fake_provider) as (activities, request):
        await slow_answer(fake_provider, request, 1.0)
        running = asyncio.create_task(env.run(activities.submit_item, request))
        await asyncio.sleep(0.5)  # the request is at the provider
        env.cancel()
        result: SubmitResult = await running

    # The provider took it: the workflow learns so, rather than a cancel of unknown fate.
    assert result.delivered
    assert await submits(fake_provider, request.item_id) == 1


async def test_a_cancel_before_any_request_went_cancels_the_submit(fake_provider) -> None:
    env = environment()
    async with submitting(fake_provider, held_s=2.0) as (activities, request):
        running = asyncio.create_task(env.run(activities.submit_item, request))
        await asyncio.sleep(0.3)  # held in the guard
        env.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running

    assert await submits(fake_provider, request.item_id) == 0


async def test_a_worker_shutting_down_cancels_even_a_request_in_flight(fake_provider) -> None:
    env = environment()
    async with submitting(fake_provider) as (activities, request):
        await slow_answer(fake_provider, request, 2.0)
        running = asyncio.create_task(env.run(activities.submit_item, request))
        await asyncio.sleep(0.5)
        env.worker_shutdown()
        env.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(running, 1.0)


async def test_a_cancel_landing_as_the_request_ends_returns_its_outcome() -> None:
    async def run() -> str:
        activity_task = asyncio.current_task()
        assert activity_task is not None

        async def body() -> str:
            _request_goes()
            # The cancel arrives in the very step the body ends: it has its outcome already.
            activity_task.cancel()
            return "sent"

        return await _to_the_end(body())

    assert await environment().run(run) == "sent"


async def test_a_retried_batch_returns_what_went_before_its_last_heartbeat_without_sending_it(
    fake_provider,
) -> None:
    # A lane's run of three submits, each answered after 0.5 s, heartbeating every 0.2 s. A
    # worker killed mid-run leaves its last heartbeat: the next attempt must not send again what
    # that heartbeat recorded (a webhook's receiver would get it twice), only the rest.
    env = environment()
    beats: list[tuple[Any, ...]] = []
    env.on_heartbeat = lambda *details: beats.append(details)
    async with submitting(fake_provider) as (activities, first):
        run = [
            dataclasses.replace(
                first,
                item_id=(item_id := f"tests/{unique_name('run')}"),
                idempotency_key=provider_idempotency_key(item_id),
                sequence="lane",
            )
            for _ in range(3)
        ]
        for request in run:
            await slow_answer(fake_provider, request, 0.5)
        outcomes: list[SubmitOutcome] = await env.run(activities.submit_items, run)
        assert [outcome.result and outcome.result.delivered for outcome in outcomes] == [True] * 3
        # The heartbeat the server last heard from before the third submit had its answer.
        [progress] = next(details for details in reversed(beats) if len(details[0].outcomes) == 2)
        converter = DataConverter.default.payload_converter
        retry = environment()
        retry.info = dataclasses.replace(
            retry.info,
            attempt=2,
            # As the SDK hands them to the next attempt: decoded, without their type.
            heartbeat_details=converter.from_payloads(converter.to_payloads([progress])),
        )
        again: list[SubmitOutcome] = await retry.run(activities.submit_items, run)

    assert again[:2] == outcomes[:2]
    assert again[2].result is not None and again[2].result.delivered
    assert [await submits(fake_provider, request.item_id) for request in run] == [1, 1, 2]


async def test_a_first_attempt_ignores_heartbeat_details(fake_provider) -> None:
    # Only a retry reads them; and details of another shape send every request again.
    async with submitting(fake_provider) as (activities, request):
        for attempt, details in ((1, [{"outcomes": {"0": {}}}]), (2, ["not progress"])):
            env = environment()
            env.info = dataclasses.replace(env.info, attempt=attempt, heartbeat_details=details)
            [outcome] = await env.run(activities.submit_items, [request])
            assert outcome.result is not None and outcome.result.delivered

    assert await submits(fake_provider, request.item_id) == 2


@activity.defn(name="heartbeat_then_fail_once")
async def heartbeat_then_fail_once(count: int) -> list[int]:
    """Attempt 1 records an outcome for request 1 and fails; attempt 2 answers what it reads."""
    if activity.info().attempt == 1:
        outcome = SubmitOutcome(SubmitResult(delivered=True, provider_message_id="m-1"))
        activity.heartbeat(BatchProgress({"1": outcome}))
        await asyncio.sleep(0.5)  # the heartbeat reaches the server
        raise RuntimeError("killed mid-batch")
    recorded = recorded_by_the_last_attempt(count)
    assert recorded[1].result is not None and recorded[1].result.provider_message_id == "m-1"
    return sorted(recorded)


@workflow.defn(name="HeartbeatThenFailOnce")
class HeartbeatThenFailOnce:
    @workflow.run
    async def run(self) -> list[int]:
        return await workflow.execute_activity(
            heartbeat_then_fail_once,
            3,
            start_to_close_timeout=timedelta(seconds=10),
            retry_policy=RetryPolicy(initial_interval=timedelta(milliseconds=100)),
        )


async def test_the_next_attempt_reads_the_progress_the_server_kept(dev_env) -> None:
    # Through a real server and the SDK's own decoding: the details come back without their
    # type, and `recorded_by_the_last_attempt` reads them.
    client = dev_env.client
    queue = unique_name("progress")
    async with Worker(
        client,
        task_queue=queue,
        workflows=[HeartbeatThenFailOnce],
        activities=[heartbeat_then_fail_once],
        workflow_runner=UnsandboxedWorkflowRunner(),
    ):
        answer = await client.execute_workflow(
            HeartbeatThenFailOnce.run, id=unique_name("progress"), task_queue=queue
        )

    assert answer == [1]


async def test_a_cancel_of_a_retried_submit_leaves_it_to_its_end(fake_provider) -> None:
    # Its first attempt may have reached the provider before its worker died: withdrawn now, the
    # item would be recorded cancelled while the provider has it.
    env = environment()
    env.info = dataclasses.replace(env.info, attempt=2)
    async with submitting(fake_provider, held_s=1.0) as (activities, request):
        running = asyncio.create_task(env.run(activities.submit_item, request))
        await asyncio.sleep(0.3)  # held in the guard, nothing sent by this attempt yet
        env.cancel()
        result: SubmitResult = await running

    assert result.delivered
    assert await submits(fake_provider, request.item_id) == 1


@pytest.mark.parametrize(
    "details",
    [[None], ["text"], [7], [[1, 2]], [{"outcomes": None}], [{"outcomes": {"0": "bad"}}], []],
)
def test_details_of_another_shape_record_nothing(details: list[Any]) -> None:
    # Read by a shard's workflow too (a batch it tries again): raising there would fail its
    # task again and again.
    converter = data_converter(None).payload_converter

    assert BatchProgress.read(details, 3, converter) == {}
