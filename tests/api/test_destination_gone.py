"""A webhook endpoint answering 410 Gone pauses its destination (dev server: queue config); the
item neither fails nor uses an attempt, and is delivered once an operator resumes."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest_asyncio

from devstack.fake_provider import FakeProvider
from tests.api.conftest import api_settings, open_api, read_destination
from tests.conftest import Stack, webhook_destination
from tests.fakes import deliveries, submits


@dataclass
class GoneApi:
    http: httpx.AsyncClient
    stack: Stack
    fake: FakeProvider
    webhook: str


@pytest_asyncio.fixture(loop_scope="session")
async def gone_api(stack_factory, fake_provider, dev_env) -> AsyncIterator[GoneApi]:
    # One attempt only: a 410 that used it up would fail the item.
    webhook = webhook_destination(
        fake_provider, submit_rate=50.0, max_attempts=1, backoff_initial_s=0.2
    )
    stack = await stack_factory(webhook, env=dev_env)
    settings = api_settings(workflow_task_queue=stack.task_queue)
    try:
        async for http in open_api(stack, settings):
            yield GoneApi(http=http, stack=stack, fake=fake_provider, webhook=webhook.name)
    finally:
        await fake_provider.admin.clear_endpoint_fault(webhook.name)


async def eventually(
    read: Callable[[], Awaitable[Any]],
    done: Callable[[Any], bool],
    tries: int = 100,
    interval_s: float = 0.1,
) -> Any:
    """`read()` until `done` holds for what it returns (`tries` reads `interval_s` apart)."""
    for _ in range(tries):
        value = await read()
        if done(value):
            return value
        await asyncio.sleep(interval_s)
    raise AssertionError(f"never happened; last: {value!r}")


async def test_410_pauses_the_destination_and_the_item_waits_for_the_resume(
    gone_api: GoneApi,
) -> None:
    http, fake, name = gone_api.http, gone_api.fake, gone_api.webhook
    await fake.admin.set_endpoint_fault(name, status=410)
    await http.patch(f"/v1/destinations/{name}", json={"submit_rate": 20})

    enqueued = await http.post(
        "/v1/outboxes/tests/items",
        json={"destination": name, "payload": {"order": 7}},
        headers={"Idempotency-Key": "gone-1"},
    )
    item_id = enqueued.json()["id"]

    async def destination() -> Any:
        return await read_destination(http, f"/v1/destinations/{name}")

    async def events() -> list[Any]:
        return list((await http.get("/v1/outboxes/tests/items/gone-1/events")).json())

    # The item records the 410 once the activity has paused both queues.
    history = await eventually(events, lambda found: len(found) >= 2)
    paused = await destination()
    # The next submit has had time to be scheduled (after 0.2 s): the paused queue holds it.
    await asyncio.sleep(1.5)
    held = (await http.get("/v1/outboxes/tests/items/gone-1")).json()
    submits_while_paused = await submits(fake, item_id)

    await fake.admin.clear_endpoint_fault(name)
    resumed = await http.patch(f"/v1/destinations/{name}", json={"paused": False})
    view = await gone_api.stack.result(item_id)
    final_events = await events()

    assert enqueued.status_code == 202, enqueued.text
    endpoint = re.escape(f"{fake.url}/webhook/{name}")
    when = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"
    assert re.fullmatch(f"410 Gone from {endpoint} at {when}", paused["pause_reason"]), paused
    assert paused["submit"]["rate"] == 0 and paused["poll"]["rate"] == 0
    # The run-time rate in force when the 410 paused it is the one a resume restores.
    assert paused["resume_submit_rate"] == 20 and paused["resume_poll_rate"] is None
    gone = history[1]
    assert (gone["type"], gone["status"]) == ("destination_gone", "queued")
    assert "410 Gone" in gone["detail"] and "paused" in gone["detail"]
    assert held["status"] == "queued" and "410 Gone" in held["last_error"]
    assert submits_while_paused == 1
    assert resumed.json()["paused"] is False
    assert resumed.json()["submit"] == {"rate": 20.0, "source": "api"}
    assert resumed.json()["poll"]["source"] == "worker"
    assert view.status == "sent"
    assert view.attempts == 1  # the 410 gave its attempt back
    assert await deliveries(fake, item_id) == 1 and await submits(fake, item_id) == 2
    assert [event["type"] for event in final_events] == ["enqueued", "destination_gone", "sent"]


async def test_a_410_during_an_operators_pause_keeps_the_operators_reason(
    gone_api: GoneApi,
) -> None:
    http, fake, name = gone_api.http, gone_api.fake, gone_api.webhook
    url = f"/v1/destinations/{name}"
    # The receiver takes 4 s to say 410: the operator pauses while the submit is in flight
    # (1.5 s was too short for the pause to land under a full suite's load).
    await fake.admin.set_endpoint_fault(name, status=410, latency_ms=4000)
    enqueued = await http.post(
        "/v1/outboxes/tests/items",
        json={"destination": name, "payload": {"order": 8}},
        headers={"Idempotency-Key": "gone-2"},
    )
    item_id = enqueued.json()["id"]
    await eventually(lambda: submits(fake, item_id), lambda count: count == 1)
    await http.patch(url, json={"paused": True, "reason": "receiver migrating"})

    history = await eventually(
        lambda: http.get("/v1/outboxes/tests/items/gone-2/events"),
        lambda answer: len(answer.json()) >= 2,
    )
    during = (await http.get(url)).json()
    await fake.admin.clear_endpoint_fault(name)
    await http.patch(url, json={"paused": False})
    view = await gone_api.stack.result(item_id)

    assert during["paused"] is True and during["pause_reason"] == "receiver migrating"
    gone = history.json()[1]
    assert gone["type"] == "destination_gone" and "already paused" in gone["detail"]
    assert view.status == "sent" and view.attempts == 1
