"""A 429 with `Retry-After` is felt by the whole destination (dev server: queue config): its
submit queue pauses until then for every worker, the destination's flow workflow resumes it,
and a storm costs few submits beyond one per item (`flowcontrol/throttle.py`)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest_asyncio
from durable_outbox_temporal.contract.flow import flow_workflow_id
from durable_outbox_temporal.contract.ids import item_workflow_id
from temporalio.service import RPCError

from devstack.fake_provider import FakeProvider
from tests.api.conftest import api_settings, open_api, read_destination
from tests.api.test_destination_gone import eventually
from tests.conftest import Stack, unique_name, webhook_destination
from tests.fakes import deliveries, submits

ITEMS = 16


@dataclass
class ThrottleApi:
    http: httpx.AsyncClient
    stack: Stack
    fake: FakeProvider
    webhook: str


@pytest_asyncio.fixture(loop_scope="session")
async def throttle_api(stack_factory, fake_provider, dev_env) -> AsyncIterator[ThrottleApi]:
    # A quick ramp: the test waits for the rate to be whole again.
    webhook = webhook_destination(
        fake_provider,
        submit_rate=5.0,
        max_attempts=20,
        backoff_initial_s=0.2,
        flow={"throttle_ramp_step_s": 1.0},
    )
    stack = await stack_factory(webhook, env=dev_env)
    async with api_with_flow(stack, fake_provider, webhook.name) as http:
        yield ThrottleApi(http=http, stack=stack, fake=fake_provider, webhook=webhook.name)


@contextlib.asynccontextmanager
async def api_with_flow(
    stack: Stack, fake: FakeProvider, destination: str
) -> AsyncIterator[httpx.AsyncClient]:
    """The API over `stack`; after it, the destination's fault cleared and its flow workflow
    ended (it would linger for minutes)."""
    settings = api_settings(workflow_task_queue=stack.task_queue)
    try:
        async for http in open_api(stack, settings):
            yield http
    finally:
        await fake.admin.clear_endpoint_fault(destination)
        handle = stack.client.get_workflow_handle(flow_workflow_id(destination))
        with contextlib.suppress(RPCError):  # ended already
            await handle.terminate("test over")


async def test_a_throttle_storm_pauses_the_destination_and_it_resumes_by_itself(
    throttle_api: ThrottleApi,
) -> None:
    http, fake, name = throttle_api.http, throttle_api.fake, throttle_api.webhook
    url = f"/v1/destinations/{name}"
    # A storm: every request answered 429 with Retry-After 2 s, for 3 s.
    await fake.admin.set_endpoint_fault(name, status=429, retry_after="2")
    keys = [unique_name("storm") for _ in range(ITEMS)]
    batch = await http.post(
        "/v1/outboxes/tests/items:batch",
        json={
            "items": [
                {"destination": name, "payload": {"n": n}, "idempotency_key": k}
                for n, k in enumerate(keys)
            ]
        },
    )
    assert batch.status_code in (200, 207) and batch.json()["created"] == ITEMS, batch.text

    async def destination() -> Any:
        return await read_destination(http, url)

    # The first submit meets the 429 once a worker takes it: on a loaded machine, seconds.
    # A destination's read queries its flow workflow (a worker answers): four reads a second.
    paused = await eventually(
        destination,
        lambda found: found.get("paused_until") is not None,
        tries=120,
        interval_s=0.25,
    )
    storm_seen = asyncio.get_running_loop().time()
    # An item not yet out says why it waits, and until when.
    waiting = await eventually(
        lambda: _item(http, keys[-1]),
        lambda item: (
            item["status"] != "queued"
            or any(reason["reason"] == "throttled" for reason in item["waiting_on"] or [])
        ),
        tries=300,
    )
    # The storm outlasts the first pause (Retry-After 2 s) by a second, counted from the pause,
    # not from the slower reads of a loaded machine: each pause that ends inside the storm lets
    # a few submits meet it again.
    await asyncio.sleep(max(0.0, 3 - (asyncio.get_running_loop().time() - storm_seen)))
    await fake.admin.clear_endpoint_fault(name)
    item_ids = [item_workflow_id("tests", key) for key in keys]
    views = [await throttle_api.stack.result(item_id) for item_id in item_ids]
    resumed = await eventually(
        destination,
        lambda found: (
            found["paused"] is False
            and found["submit"]["source"] == "worker"
            # The flow's state comes from a query, left out when no worker answers within 2 s.
            and found["flow"] is not None
            and found["flow"]["events"][-1]["kind"] == "recovered"
        ),
        # The ramp back takes a few 2 s steps, each a workflow task and a local activity: on a
        # loaded machine (the fresh-clone suite) more than 10 s.
        tries=240,
        interval_s=0.5,
    )

    assert paused["paused"] is True and paused["submit"]["rate"] == 0
    if waiting["status"] == "queued":
        throttled = [r for r in waiting["waiting_on"] if r["reason"] == "throttled"]
        assert throttled[0]["until"] is not None and name in throttled[0]["detail"]
    assert paused["pause_reason"].startswith("throttled until ")
    assert "HTTP 429" in paused["pause_reason"]
    assert all(view.status == "sent" for view in views)
    assert [await deliveries(fake, item_id) for item_id in item_ids] == [1] * ITEMS
    # Felt by the destination, not by each item: without the rule every item meets the storm
    # at least once (2 submits each at least). With it, only what was dispatched before a pause
    # landed meets it: the server's burst, once a storm (4-7 submits a storm here, 2026-11-28).
    total = sum([await submits(fake, item_id) for item_id in item_ids])
    storms = resumed["flow"]["storms"]
    assert total <= min(ITEMS + 10 * storms, 2 * ITEMS - 1), (total, storms)
    # Resumed by itself at the configured rate; the flow says what happened (its last
    # `FLOW_EVENTS_KEPT` events: a long storm's earlier ones may be gone).
    assert resumed["paused_until"] is None
    assert resumed["flow"] is not None and storms >= 1
    kinds = [event["kind"] for event in resumed["flow"]["events"]]
    assert "throttled" in kinds and kinds[-1] == "recovered", kinds


async def _item(http: httpx.AsyncClient, key: str) -> Any:
    return (await http.get(f"/v1/outboxes/tests/items/{key}")).json()
