"""Destinations at run time on the dev server: rates changed and read back, pause and resume."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest_asyncio

from contract.ids import provider_idempotency_key
from tests.api.conftest import api_settings, open_api
from tests.api.test_items import assert_problem
from tests.conftest import Stack, webhook_destination


@dataclass
class DevApi:
    http: httpx.AsyncClient
    stack: Stack
    webhook: str


@pytest_asyncio.fixture(loop_scope="session")
async def dev_api(stack_factory, fake_provider, dev_env) -> AsyncIterator[DevApi]:
    webhook = webhook_destination(fake_provider, submit_rate=50.0)
    stack = await stack_factory(webhook, env=dev_env)
    settings = api_settings(workflow_task_queue=stack.task_queue)
    async for http in open_api(stack, settings):
        yield DevApi(http=http, stack=stack, webhook=webhook.name)


async def enqueue(api: DevApi, key: str) -> str:
    response = await api.http.post(
        "/v1/outboxes/tests/items",
        json={"destination": api.webhook, "payload": {"key": key}},
        headers={"Idempotency-Key": key},
    )
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


async def test_a_run_time_rate_is_enforced_and_read_back(dev_api: DevApi) -> None:
    url = f"/v1/destinations/{dev_api.webhook}"

    patched = await dev_api.http.patch(url, json={"submit_rate": 2})
    item_ids = [await enqueue(dev_api, f"rate-{n}") for n in range(10)]
    for item_id in item_ids:
        assert (await dev_api.stack.result(item_id)).status == "sent"
    delivered = await dev_api.stack.fake.admin.deliveries(dev_api.webhook)
    span = delivered[-1]["at"] - delivered[0]["at"]
    listed = (await dev_api.http.get("/v1/destinations")).json()

    assert patched.status_code == 200, patched.text
    assert patched.json()["submit"] == {"rate": 2.0, "source": "api"}
    assert patched.json()["configured_submit_rate"] == 50.0
    # 2 per second after the limiter's initial burst (a few): 10 take well over 3 s; at the
    # configured 50/s they would all go within a fraction of one.
    assert len(delivered) == 10 and span >= 3.0
    assert [d["submit"] for d in listed if d["name"] == dev_api.webhook] == [
        {"rate": 2.0, "source": "api"}
    ]


async def test_pause_holds_every_submit_and_resume_delivers(dev_api: DevApi) -> None:
    url = f"/v1/destinations/{dev_api.webhook}"
    await dev_api.http.patch(url, json={"submit_rate": 20})

    paused = await dev_api.http.patch(url, json={"paused": True, "reason": "provider maintenance"})
    item_id = await enqueue(dev_api, "while-paused")
    await asyncio.sleep(3)
    held = (await dev_api.http.get("/v1/outboxes/tests/items/while-paused")).json()
    delivered_while_paused = await dev_api.stack.fake.admin.key_stats(
        provider_idempotency_key(item_id)
    )
    stats = (await dev_api.http.get("/v1/outboxes/tests/stats")).json()
    resumed = await dev_api.http.patch(url, json={"paused": False})
    view = await dev_api.stack.result(item_id)

    assert paused.json()["paused"] is True
    assert paused.json()["pause_reason"] == "provider maintenance"
    assert paused.json()["submit"]["rate"] == 0 and paused.json()["resume_submit_rate"] == 20
    assert held["status"] == "queued" and delivered_while_paused["submits"] == 0
    [shown] = [d for d in stats["destinations"] if d["name"] == dev_api.webhook]
    assert shown["paused"] is True and shown["submit_rate_in_force"] == 0
    assert resumed.json()["paused"] is False
    assert resumed.json()["submit"] == {"rate": 20.0, "source": "api"}  # the rate before
    assert view.status == "sent"


async def test_bad_changes_are_problems(dev_api: DevApi) -> None:
    url = f"/v1/destinations/{dev_api.webhook}"
    assert_problem(await dev_api.http.patch("/v1/destinations/nope", json={"paused": True}), 404)
    assert_problem(await dev_api.http.patch(url, json={"submit_rate": 0}), 422)
    assert_problem(await dev_api.http.patch(url, json={"submit_rate": 1, "extra": 1}), 422)
    assert_problem(await dev_api.http.get("/v1/destinations/nope"), 404)


async def test_purge_cancels_only_what_the_provider_does_not_have(dev_api: DevApi) -> None:
    sent_id = await enqueue(dev_api, "purge-sent")
    assert (await dev_api.stack.result(sent_id)).status == "sent"
    delayed = []
    for n in range(3):
        response = await dev_api.http.post(
            "/v1/outboxes/purging/items",
            json={"destination": dev_api.webhook, "payload": {"n": n}, "delay_seconds": 3600},
            headers={"Idempotency-Key": f"later-{n}"},
        )
        assert response.status_code == 202
        delayed.append(f"later-{n}")
    keys: list[str] = []
    for _ in range(100):  # visibility trails the starts by a moment
        answer = await dev_api.http.post("/v1/outboxes/purging/items:purge", json={})
        keys += answer.json()["keys"]
        if len(keys) == 3:
            break
        await asyncio.sleep(0.1)

    assert sorted(keys) == delayed
    for key in delayed:
        item = (await dev_api.http.get(f"/v1/outboxes/purging/items/{key}")).json()
        assert item["status"] == "cancelled"
    untouched = (await dev_api.http.get("/v1/outboxes/tests/items/purge-sent")).json()
    assert untouched["status"] == "sent"
    again = (await dev_api.http.post("/v1/outboxes/purging/items:purge", json={})).json()
    # Nothing left to cancel (a lagging listing may still name one: it counts as skipped).
    assert again["cancelled"] == 0 and again["keys"] == []
    assert_problem(
        await dev_api.http.post("/v1/outboxes/purging/items:purge", json={"destination": "nope"}),
        404,
    )
