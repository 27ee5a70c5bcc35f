"""A destination whose submits keep failing opens its circuit (dev server: queue config): its
submit queue pauses for every worker, one probe goes at intervals, items wait without failing
or spending attempts, and the circuit closes by itself once a probe succeeds
(`flowcontrol/breaker.py`). In item mode and in bulk mode."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import pytest_asyncio
from durable_outbox_temporal.contract.ids import item_workflow_id

from devstack.fake_provider import FakeProvider
from tests.api.conftest import read_destination
from tests.api.test_destination_gone import eventually
from tests.api.test_throttle import api_with_flow
from tests.conftest import Stack, unique_name, webhook_destination
from tests.fakes import deliveries, submits

ITEMS = 12


@dataclass
class BreakerApi:
    http: httpx.AsyncClient
    stack: Stack
    fake: FakeProvider
    webhook: str
    # Where the destination's flow sends its operational events.
    events: str


@pytest_asyncio.fixture(loop_scope="session", params=["item", "bulk"])
async def breaker_api(
    request: pytest.FixtureRequest, stack_factory: Any, fake_provider: FakeProvider, dev_env: Any
) -> AsyncIterator[BreakerApi]:
    # Few attempts: an item that spent one per failed probe, or per retry while the circuit is
    # open, would end failed.
    bulk = {"mode": "bulk", "shards": 2} if request.param == "bulk" else {}
    events = webhook_destination(fake_provider)
    webhook = webhook_destination(
        fake_provider,
        submit_rate=10.0,
        max_attempts=6,
        backoff_initial_s=0.2,
        backoff_max_s=0.5,
        flow={
            "breaker_min_failures": 3,
            "breaker_window_s": 10.0,
            "breaker_probe_interval_s": 0.5,
            "events_destination": events.name,
        },
        **bulk,
    )
    stack = await stack_factory(webhook, events, env=dev_env)
    async with api_with_flow(stack, fake_provider, webhook.name) as http:
        yield BreakerApi(http, stack, fake_provider, webhook.name, events.name)


async def test_failing_submits_open_the_circuit_items_wait_and_it_closes_by_itself(
    breaker_api: BreakerApi,
) -> None:
    http, fake, name = breaker_api.http, breaker_api.fake, breaker_api.webhook
    url = f"/v1/destinations/{name}"
    # The endpoint is down: every request (probes too) answered 500.
    await fake.admin.set_endpoint_fault(name, status=500)
    keys = [unique_name("down") for _ in range(ITEMS)]
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
    item_ids = [item_workflow_id("tests", key) for key in keys]

    async def destination() -> Any:
        return await read_destination(http, url)

    opened = await eventually(destination, lambda found: found["circuit"] == "open")

    async def metrics() -> str:
        return (await http.get("/metrics")).text

    # Prometheus sees it too (the destinations' state is read at most every few seconds).
    for _ in range(100):
        scraped = await metrics()
        if f'outbox_destination_circuit_open{{destination="{name}"}} 1.0' in scraped:
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError("the circuit never showed open in /metrics")
    assert f'outbox_destination_paused{{destination="{name}"}} 1.0' in scraped
    assert f'outbox_destination_submit_rate{{destination="{name}"}} 0.0' in scraped
    assert opened["paused"] is True and opened["submit"]["rate"] == 0
    assert opened["pause_reason"].startswith("circuit open since ")
    assert "HTTP 500" in opened["pause_reason"]
    # Open: no submit goes (what was dispatched before the pause landed has come back by now),
    # while probes keep failing.
    await asyncio.sleep(1.0)
    before = sum([await submits(fake, item_id) for item_id in item_ids])
    probing = await eventually(
        destination,
        lambda found: (
            found["flow"] is not None
            and sum(e["kind"] == "probe_failed" for e in found["flow"]["events"]) >= 2
        ),
    )
    assert sum([await submits(fake, item_id) for item_id in item_ids]) == before
    assert probing["circuit"] == "open" and probing["flow"]["circuit"] == "open"
    assert probing["flow"]["opened_at"] is not None and probing["flow"]["next_probe_at"]
    queued = [
        item
        for item in [(await http.get(f"/v1/outboxes/tests/items/{k}")).json() for k in keys]
        if item["status"] == "queued"
    ]
    assert queued, "every item failed or went while the endpoint was down"
    assert all(
        any(r["reason"] == "circuit_open" for r in item["waiting_on"] or []) for item in queued
    ), [item["waiting_on"] for item in queued]

    # The endpoint is back: the next probe closes the circuit and every item goes, once.
    await fake.admin.clear_endpoint_fault(name)

    async def statuses() -> list[str]:
        items = [(await http.get(f"/v1/outboxes/tests/items/{k}")).json() for k in keys]
        return [item["status"] for item in items]

    # The next probe closes the circuit; then every item's retry goes (up to a minute on a
    # loaded machine: the retries wait their backoff, bulk shards their next tick).
    for _ in range(600):
        ended = await statuses()
        if not {"queued", "sending"} & set(ended):
            break
        await asyncio.sleep(0.1)
    closed = await eventually(destination, lambda found: found["circuit"] == "closed")
    assert ended == ["sent"] * ITEMS, ended
    assert [await deliveries(fake, item_id) for item_id in item_ids] == [1] * ITEMS
    assert closed["paused"] is False and closed["submit"]["source"] == "worker"
    if closed["flow"] is not None:
        kinds = [event["kind"] for event in closed["flow"]["events"]]
        assert kinds[0] == "opened" and kinds[-1] == "closed", kinds

    # The operator's webhook heard of the circuit opening and closing, as items of their own.
    async def told() -> list[Any]:
        return [d["payload"] for d in await fake.admin.deliveries(breaker_api.events)]

    notices = await eventually(told, lambda found: len(found) >= 2)
    assert [n["type"] for n in notices] == [
        "destination.circuit_opened",
        "destination.circuit_closed",
    ], notices
    assert all(n["destination"] == name for n in notices)
    assert notices[0]["circuit"] == "open" and "HTTP 500" in notices[0]["detail"]
