"""Concurrency caps and multi-window quotas, per destination and per `concurrency_key`, on the
dev server, measured at the fake provider (`flowcontrol/caps.py`), in item mode and in bulk
mode: never more requests out at once than a cap, never more submits in any sliding window
than a quota, every item delivered once, none failed for waiting."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import pytest_asyncio

from devstack.fake_provider import FakeProvider
from tests.api.conftest import api_settings, open_api
from tests.conftest import unique_name, webhook_destination

TENANTS = {"a": 6, "b": 3, "c": 3}


@dataclass
class CapsApi:
    http: httpx.AsyncClient
    fake: FakeProvider
    capped: str
    quota: str


@pytest_asyncio.fixture(loop_scope="session", params=["item", "bulk"])
async def caps_api(
    request: pytest.FixtureRequest, stack_factory: Any, fake_provider: FakeProvider, dev_env: Any
) -> AsyncIterator[CapsApi]:
    bulk = {"mode": "bulk", "shards": 2} if request.param == "bulk" else {}
    # Few attempts: an item that spent attempts while held would end failed.
    common = {"submit_rate": 100.0, "max_attempts": 2, "backoff_initial_s": 0.2, **bulk}
    capped = webhook_destination(
        fake_provider, flow={"max_in_flight": 3, "key_max_in_flight": 1}, **common
    )
    quota = webhook_destination(
        fake_provider,
        flow={
            "quotas": [{"per": "2s", "max": 5}],
            "key_quotas": [{"per": "2s", "max": 2}],
        },
        **common,
    )
    stack = await stack_factory(capped, quota, env=dev_env)
    settings = api_settings(workflow_task_queue=stack.task_queue)
    # Each request stays out a while: without the caps, a tenant's items would overlap.
    await fake_provider.admin.set_endpoint_fault(capped.name, latency_ms=300)
    try:
        async for http in open_api(stack, settings):
            yield CapsApi(http, fake_provider, capped.name, quota.name)
    finally:
        await fake_provider.admin.clear_endpoint_fault(capped.name)


async def enqueue_and_wait(http: httpx.AsyncClient, destination: str) -> list[str]:
    items = [
        {
            "destination": destination,
            "payload": {"tenant": tenant, "n": n},
            "idempotency_key": unique_name(f"{tenant}-{n}"),
            "concurrency_key": tenant,
        }
        for tenant, count in TENANTS.items()
        for n in range(count)
    ]
    batch = await http.post("/v1/outboxes/tests/items:batch", json={"items": items})
    assert batch.status_code in (200, 207) and batch.json()["created"] == len(items), batch.text
    keys = [item["idempotency_key"] for item in items]
    for _ in range(300):
        found = [(await http.get(f"/v1/outboxes/tests/items/{k}")).json() for k in keys]
        statuses = [item["status"] for item in found]
        if not {"queued", "sending"} & set(statuses):
            return statuses
        await asyncio.sleep(0.1)
    raise AssertionError(f"never ended: {statuses}")


async def test_caps_hold_per_destination_and_per_key(caps_api: CapsApi) -> None:
    http, fake, name = caps_api.http, caps_api.fake, caps_api.capped
    seen: list[int] = []

    async def sample_in_flight() -> None:
        # What an operator reads meanwhile: the requests out now under the destination's cap.
        while True:
            seen.append((await http.get(f"/v1/destinations/{name}")).json()["in_flight"])
            await asyncio.sleep(0.05)

    sampler = asyncio.create_task(sample_in_flight())
    try:
        statuses = await enqueue_and_wait(http, name)
    finally:
        sampler.cancel()
    assert statuses == ["sent"] * sum(TENANTS.values()), statuses
    assert 1 <= max(seen) <= 3 and min(seen) >= 0, seen
    assert (await http.get(f"/v1/destinations/{name}")).json()["in_flight"] == 0
    prefix = f"/webhook/{name}"
    per_tenant = {t: await fake.admin.max_in_flight(prefix, where={"tenant": t}) for t in TENANTS}
    assert per_tenant == {"a": 1, "b": 1, "c": 1}, per_tenant
    # The destination's cap holds too, and tenants' requests went side by side.
    assert 2 <= await fake.admin.max_in_flight(prefix) <= 3


async def test_quotas_hold_in_every_sliding_window(caps_api: CapsApi) -> None:
    http, fake, name = caps_api.http, caps_api.fake, caps_api.quota
    statuses = await enqueue_and_wait(http, name)
    assert statuses == ["sent"] * sum(TENANTS.values()), statuses
    prefix = f"/webhook/{name}"
    assert await fake.admin.max_rate(prefix, 2.0) == 5
    per_tenant = {t: await fake.admin.max_rate(prefix, 2.0, where={"tenant": t}) for t in TENANTS}
    assert per_tenant == {"a": 2, "b": 2, "c": 2}, per_tenant
