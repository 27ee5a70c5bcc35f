"""Pauses and resumes at once from several API processes, on the dev server: a destination's two
queues end paused together or running together, and a change the server refuses halfway is
completed or put back, never left half made (defect D3)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
import pytest_asyncio
from durable_outbox_temporal.destinations import Destination, DestinationRegistry
from sqlalchemy import create_engine
from sqlalchemy.exc import DBAPIError
from temporalio.api.workflowservice.v1 import UpdateTaskQueueConfigRequest
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment

import service.destinations
from api.errors import known_problem
from devstack.fake_provider import FakeProvider
from flowcontrol.queue_rates import QueueRate, read_queue_rate
from service.destinations import DestinationControls
from tests.api.conftest import api_settings, open_api
from tests.api.test_items import assert_problem
from tests.conftest import Stack, webhook_destination
from worker import default_operations_task_queue

# Concurrent PATCHes per round, and rounds; spread over SPREAD_S, with each update of the poll
# queue slowed by up to SECOND_UPDATE_LATENCY_S. How often this found the split before the fix:
# docs/decisions/destination-controls-lease.md. Five rounds keep the suite fast (each round's
# PATCHes take turns); the split showed in 1-2 rounds of 10 on the old code.
PATCHES = 10
ROUNDS = 5
SPREAD_S = 0.1
SECOND_UPDATE_LATENCY_S = 0.4


@dataclass
class TwoApis:
    """Two API apps (as two processes would be) over one stack and one read model."""

    first: httpx.AsyncClient
    second: httpx.AsyncClient
    stack: Stack
    webhook: Destination


@pytest_asyncio.fixture(loop_scope="session")
async def two_apis(
    stack_factory: Any, fake_provider: FakeProvider, dev_env: WorkflowEnvironment
) -> AsyncIterator[TwoApis]:
    webhook = webhook_destination(fake_provider, submit_rate=50.0)
    stack = await stack_factory(webhook, env=dev_env)
    settings = api_settings(
        workflow_task_queue=stack.task_queue,
        operations_task_queue=default_operations_task_queue(stack.task_queue),
    )
    first, second = (
        cast(AsyncGenerator[httpx.AsyncClient, None], open_api(stack, settings)) for _ in range(2)
    )
    try:
        yield TwoApis(
            first=await anext(first), second=await anext(second), stack=stack, webhook=webhook
        )
    finally:
        await first.aclose()
        await second.aclose()


async def both_queues(stack: Stack, webhook: Destination) -> tuple[QueueRate, QueueRate]:
    """The submit and poll queues as the server holds them."""
    return (
        await read_queue_rate(stack.client, webhook.submit_task_queue),
        await read_queue_rate(stack.client, webhook.poll_task_queue),
    )


def alternating(n: int) -> dict[str, Any]:
    return {"paused": True, "reason": f"r{n}"} if n % 2 == 0 else {"paused": False}


async def spread(change: Awaitable[Any]) -> Any:
    """`change`, sent a moment later than its neighbours: a round's changes then overlap
    unevenly, as requests from several processes do (sent at once from one event loop, they
    read and write in the same order)."""
    await asyncio.sleep(random.uniform(0, SPREAD_S))
    return await change


def slow_second_updates(monkeypatch: pytest.MonkeyPatch, stack: Stack, task_queue: str) -> None:
    """Give each update of `task_queue`'s config (a change's second) a latency of its own, as a
    loaded server does: another change then reads, and updates the first queue, between a
    change's two updates, now and then."""
    service_client = stack.client.workflow_service
    update: Callable[..., Awaitable[Any]] = service_client.update_task_queue_config

    async def slow(request: UpdateTaskQueueConfigRequest, *args: Any, **kwargs: Any) -> Any:
        if request.task_queue == task_queue:
            await asyncio.sleep(random.uniform(0, SECOND_UPDATE_LATENCY_S))
        return await update(request, *args, **kwargs)

    monkeypatch.setattr(service_client, "update_task_queue_config", slow)


async def test_concurrent_pauses_and_resumes_leave_both_queues_alike(
    two_apis: TwoApis, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"/v1/destinations/{two_apis.webhook.name}"
    slow_second_updates(monkeypatch, two_apis.stack, two_apis.webhook.poll_task_queue)
    splits = []
    for round_ in range(ROUNDS):
        answers = await asyncio.gather(
            *(
                spread(
                    (two_apis.first if n % 2 == 0 else two_apis.second).patch(
                        url, json=alternating(n)
                    )
                )
                for n in range(PATCHES)
            )
        )
        shown = (await two_apis.first.get(url)).json()
        submit, poll = await both_queues(two_apis.stack, two_apis.webhook)
        if (
            submit.paused != poll.paused
            or submit.pause_reason != poll.pause_reason
            or shown["paused"] != submit.paused
        ):
            splits.append((round_, shown, submit, poll))
        assert all(answer.status_code == 200 for answer in answers), [
            answer.text for answer in answers if answer.status_code != 200
        ]

    assert splits == []


async def test_one_process_without_the_read_model_keeps_both_queues_alike(
    stack_factory: Any,
    fake_provider: FakeProvider,
    dev_env: WorkflowEnvironment,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without the read model the API must run as one process; within it, changes to one
    destination still take turns."""
    webhook = webhook_destination(fake_provider, submit_rate=50.0)
    stack = await stack_factory(webhook, env=dev_env)
    slow_second_updates(monkeypatch, stack, webhook.poll_task_queue)
    controls = DestinationControls(
        stack.outbox, DestinationRegistry({webhook.name: webhook}), engine=None
    )
    splits = []
    for round_ in range(ROUNDS):
        await asyncio.gather(
            *(spread(controls.update(webhook.name, **alternating(n))) for n in range(PATCHES))
        )
        submit, poll = await both_queues(stack, webhook)
        if submit.paused != poll.paused or submit.pause_reason != poll.pause_reason:
            splits.append((round_, submit, poll))

    assert splits == []


@dataclass
class OneApi:
    http: httpx.AsyncClient
    stack: Stack
    webhook: Destination


@pytest_asyncio.fixture(loop_scope="session")
async def one_api(
    stack_factory: Any, fake_provider: FakeProvider, dev_env: WorkflowEnvironment
) -> AsyncIterator[OneApi]:
    webhook = webhook_destination(fake_provider, submit_rate=50.0)
    stack = await stack_factory(webhook, env=dev_env)
    settings = api_settings(
        workflow_task_queue=stack.task_queue,
        operations_task_queue=default_operations_task_queue(stack.task_queue),
    )
    async for http in open_api(stack, settings):
        yield OneApi(http=http, stack=stack, webhook=webhook)


def fail_calls(
    monkeypatch: pytest.MonkeyPatch,
    stack: Stack,
    call: str,
    error: RPCError,
    times: int,
    task_queue: str | None = None,
) -> list[str]:
    """Make the server answer the next `times` calls of `call` (a workflow service method on a
    task queue) with `error`, only those of `task_queue` if given; returns the queues of every
    call asked for, failed or not."""
    service_client = stack.client.workflow_service
    real: Callable[..., Awaitable[Any]] = getattr(service_client, call)
    asked: list[str] = []
    failures = [times]

    async def failing(request: Any, *args: Any, **kwargs: Any) -> Any:
        queue = (
            request.task_queue if isinstance(request.task_queue, str) else request.task_queue.name
        )
        asked.append(queue)
        if task_queue in (None, queue) and failures[0] > 0:
            failures[0] -= 1
            raise error
        return await real(request, *args, **kwargs)

    monkeypatch.setattr(service_client, call, failing)
    return asked


def refuse_updates_of(
    monkeypatch: pytest.MonkeyPatch, stack: Stack, task_queue: str, times: int
) -> list[str]:
    """Make the server refuse (RESOURCE_EXHAUSTED, as under load) the next `times` updates of
    `task_queue`'s config; returns the queues of every update asked for, refused or not."""
    refused = RPCError("namespace rate limit exceeded", RPCStatusCode.RESOURCE_EXHAUSTED, b"")
    return fail_calls(monkeypatch, stack, "update_task_queue_config", refused, times, task_queue)


async def test_a_second_queue_refused_once_is_asked_again(
    one_api: OneApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"/v1/destinations/{one_api.webhook.name}"
    asked = refuse_updates_of(monkeypatch, one_api.stack, one_api.webhook.poll_task_queue, 1)

    paused = await one_api.http.patch(url, json={"paused": True, "reason": "maintenance"})
    submit, poll = await both_queues(one_api.stack, one_api.webhook)

    assert paused.status_code == 200, paused.text
    assert paused.json()["paused"] is True
    assert submit.paused and poll.paused
    assert submit.pause_reason == poll.pause_reason == "maintenance"
    poll_queue = one_api.webhook.poll_task_queue
    assert asked == [one_api.webhook.submit_task_queue, poll_queue, poll_queue]


async def test_a_second_queue_refused_for_good_puts_the_first_back(
    one_api: OneApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"/v1/destinations/{one_api.webhook.name}"
    set_rate = await one_api.http.patch(url, json={"submit_rate": 20})
    assert set_rate.status_code == 200, set_rate.text
    monkeypatch.setattr(service.destinations, "_RETRY_FOR_S", 1.0)
    refuse_updates_of(monkeypatch, one_api.stack, one_api.webhook.poll_task_queue, 1_000)

    refused = await one_api.http.patch(url, json={"paused": True, "reason": "maintenance"})
    shown = (await one_api.http.get(url)).json()
    submit, poll = await both_queues(one_api.stack, one_api.webhook)

    assert_problem(refused, 503)
    assert refused.headers["Retry-After"]
    # Nothing changed: the submit queue, paused first, runs again at the rate it had.
    assert not submit.paused and not poll.paused
    assert submit.rate == 20.0 and submit.source == "api"
    assert shown["paused"] is False and shown["submit"] == {"rate": 20.0, "source": "api"}


def cancel_describes(monkeypatch: pytest.MonkeyPatch, stack: Stack, times: int) -> list[str]:
    """Make the server cancel (as it does under load: "operation was canceled") the next `times`
    reads of any queue's rate; returns the queues of every read asked for, cancelled or not."""
    cancelled = RPCError("operation was canceled", RPCStatusCode.CANCELLED, b"")
    return fail_calls(monkeypatch, stack, "describe_task_queue", cancelled, times)


async def test_a_read_of_a_queues_rate_the_server_cancelled_is_asked_again(
    one_api: OneApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"/v1/destinations/{one_api.webhook.name}"
    asked = cancel_describes(monkeypatch, one_api.stack, 2)

    paused = await one_api.http.patch(url, json={"paused": True, "reason": "maintenance"})
    resumed = await one_api.http.patch(url, json={"paused": False})

    assert paused.status_code == 200, paused.text
    assert paused.json()["paused"] is True
    assert resumed.status_code == 200 and resumed.json()["paused"] is False
    # Both queues are read at once first: each read cancelled was asked again.
    queues = [one_api.webhook.submit_task_queue, one_api.webhook.poll_task_queue]
    assert sorted(asked[:4]) == sorted(queues * 2)


async def test_a_read_the_server_keeps_cancelling_answers_503(
    one_api: OneApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    cancel_describes(monkeypatch, one_api.stack, 1_000)

    refused = await one_api.http.patch(
        f"/v1/destinations/{one_api.webhook.name}", json={"paused": True, "reason": "maintenance"}
    )

    assert_problem(refused, 503)
    assert refused.headers["Retry-After"]


async def test_a_flow_query_the_server_cancelled_leaves_the_flow_out_of_a_read(
    one_api: OneApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As for a flow workflow too busy to answer in time: the read answers without it."""
    service_client = one_api.stack.client.workflow_service
    asked: list[Any] = []

    async def cancelled(request: Any, *args: Any, **kwargs: Any) -> Any:
        asked.append(request)
        raise RPCError("operation was canceled", RPCStatusCode.CANCELLED, b"")

    monkeypatch.setattr(service_client, "query_workflow", cancelled)

    shown = await one_api.http.get(f"/v1/destinations/{one_api.webhook.name}")

    assert shown.status_code == 200, shown.text
    assert shown.json()["flow"] is None
    assert len(asked) == 1


async def test_a_read_model_that_does_not_answer_refuses_the_change(
    stack_factory: Any, fake_provider: FakeProvider, dev_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """Without the lease a change could interleave with another process's: it is refused (the
    API answers 503) and changes nothing."""
    webhook = webhook_destination(fake_provider, submit_rate=50.0)
    stack = await stack_factory(webhook, env=dev_env)
    unreachable = create_engine(f"sqlite:///{tmp_path / 'missing' / 'readmodel.db'}")
    controls = DestinationControls(
        stack.outbox, DestinationRegistry({webhook.name: webhook}), engine=unreachable
    )

    with pytest.raises(DBAPIError) as refused:
        await controls.update(webhook.name, paused=True, reason="maintenance")
    submit, poll = await both_queues(stack, webhook)

    problem = known_problem(refused.value)
    assert problem is not None and problem.status == 503
    assert not submit.paused and not poll.paused
