"""Destinations at run time on the dev server: rates changed and read back, pause and resume,
disable and re-enable."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
import pytest_asyncio
from durable_outbox_temporal.contract.ids import provider_idempotency_key, submit_task_queue
from temporalio.service import RPCError, RPCStatusCode

from api.errors import known_problem
from flowcontrol.queue_rates import QueueRate, disabled_reason, pause_queue, read_queue_rate
from tests.api.conftest import api_settings, open_api
from tests.api.test_items import assert_problem
from tests.api.test_purge import purge
from tests.conftest import Stack, email_destination, webhook_destination
from tests.workflows.test_outbox_item import EMAIL
from worker import default_operations_task_queue


@dataclass
class DevApi:
    http: httpx.AsyncClient
    stack: Stack
    webhook: str


@pytest_asyncio.fixture(loop_scope="session")
async def dev_api(stack_factory, fake_provider, dev_env) -> AsyncIterator[DevApi]:
    webhook = webhook_destination(fake_provider, submit_rate=50.0)
    stack = await stack_factory(webhook, env=dev_env)
    settings = api_settings(
        workflow_task_queue=stack.task_queue,
        # Its own operations worker runs purge batches.
        operations_task_queue=default_operations_task_queue(stack.task_queue),
    )
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

    patched = await patch(dev_api, url, {"submit_rate": 2})
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
    await patch(dev_api, url, {"submit_rate": 20})

    paused = await patch(dev_api, url, {"paused": True, "reason": "provider maintenance"})
    item_id = await enqueue(dev_api, "while-paused")
    await asyncio.sleep(3)
    held = (await dev_api.http.get("/v1/outboxes/tests/items/while-paused")).json()
    delivered_while_paused = await dev_api.stack.fake.admin.key_stats(
        provider_idempotency_key(item_id)
    )
    stats = (await dev_api.http.get("/v1/outboxes/tests/stats")).json()
    resumed = await patch(dev_api, url, {"paused": False})
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


async def test_a_disabled_destination_holds_its_items_until_an_operator_re_enables_it(
    dev_api: DevApi,
) -> None:
    url = f"/v1/destinations/{dev_api.webhook}"
    await patch(dev_api, url, {"submit_rate": 20})
    client = dev_api.stack.client
    queue = submit_task_queue(dev_api.webhook)
    # What the destination's flow does once it has failed for `disable_after_s`
    # (`activities/flow.py`; tests/workflows/test_destination_flow.py runs it).
    since = datetime.now(UTC)
    now = await read_queue_rate(client, queue)
    reason = disabled_reason(since, "failing for 3.0 days; last: HTTP 500")
    await pause_queue(client, queue, now, reason, identity="test")
    # The server applies an accepted change a moment later: under load a describe right after it
    # has read the rate before (a fresh-clone CI run showed this destination not yet disabled).
    for _ in range(100):
        if (await read_queue_rate(client, queue)).paused:
            break
        await asyncio.sleep(0.05)

    shown = (await dev_api.http.get(url)).json()
    item_id = await enqueue(dev_api, "while-disabled")
    held = (await dev_api.http.get("/v1/outboxes/tests/items/while-disabled")).json()
    scraped = (await dev_api.http.get("/metrics")).text
    # `paused: false` and `enabled: true` together are fine; opposites are refused.
    contradiction = await patch(dev_api, url, {"enabled": True, "paused": True})
    enabled = await patch(dev_api, url, {"enabled": True, "reason": "endpoint fixed"})
    view = await dev_api.stack.result(item_id)

    assert shown["disabled"] is True and shown["paused"] is True
    assert datetime.fromisoformat(shown["disabled_since"].replace("Z", "+00:00")) == since
    assert shown["circuit"] == "closed" and shown["resume_submit_rate"] == 20
    assert held["status"] == "queued", held
    assert [w["reason"] for w in held["waiting_on"]] == ["destination_disabled"], held
    assert f'outbox_destination_disabled{{destination="{dev_api.webhook}"}} 1.0' in scraped
    assert_problem(contradiction, 422)
    assert enabled.status_code == 200, enabled.text
    assert enabled.json()["disabled"] is False and enabled.json()["paused"] is False
    assert enabled.json()["submit"] == {"rate": 20.0, "source": "api"}  # the rate before
    assert view.status == "sent"


async def test_enabled_false_disables_by_hand_and_leaves_the_poll_queue(dev_api: DevApi) -> None:
    url = f"/v1/destinations/{dev_api.webhook}"
    disabled = await patch(dev_api, url, {"enabled": False, "reason": "retired"})
    again = await patch(dev_api, url, {"enabled": False})
    resumed = await patch(dev_api, url, {"paused": False})

    assert disabled.status_code == 200, disabled.text
    body = disabled.json()
    assert body["disabled"] is True and body["submit"]["rate"] == 0
    assert body["pause_reason"].startswith("disabled since ")
    assert body["pause_reason"].endswith(": by request: retired")
    assert body["poll"]["rate"] > 0
    # Disabled already: the first reason and time stay.
    assert again.json()["pause_reason"] == body["pause_reason"]
    # A resume lifts every pause, a disable's too.
    assert resumed.json()["disabled"] is False and resumed.json()["paused"] is False


async def test_a_queued_item_on_a_paused_destination_cancels_at_once(dev_api: DevApi) -> None:
    """Its submit waits on the paused queue, taken by no worker: a cancel withdraws it, and
    the resume sends nothing (issue 31)."""
    url = f"/v1/destinations/{dev_api.webhook}"
    await patch(dev_api, url, {"paused": True, "reason": "cancel while paused"})
    try:
        item_id = await enqueue(dev_api, "cancel-while-paused")
        await asyncio.sleep(2)  # the submit is scheduled on the paused queue by now
        cancelled = await dev_api.http.post(
            "/v1/outboxes/tests/items/cancel-while-paused/cancel", json={"reason": "no longer"}
        )
        view = await dev_api.stack.result(item_id)
    finally:
        await patch(dev_api, url, {"paused": False})
    await asyncio.sleep(1)
    stats = await dev_api.stack.fake.admin.key_stats(provider_idempotency_key(item_id))

    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["status"] == "cancelled"
    assert view.status == "cancelled" and view.attempts == 0
    assert stats["submits"] == 0


async def test_a_purge_of_a_paused_destinations_items_cancels_every_one(dev_api: DevApi) -> None:
    """Their submits wait on the paused queue: the purge withdraws each (it once took 5 s per
    item, issue 31), and the resume sends nothing."""
    url = f"/v1/destinations/{dev_api.webhook}"
    outbox = "purge-paused"
    await patch(dev_api, url, {"paused": True, "reason": "purge while paused"})
    try:
        batch = await dev_api.http.post(
            f"/v1/outboxes/{outbox}/items:batch",
            json={
                "items": [
                    {
                        "destination": dev_api.webhook,
                        "payload": {"n": n},
                        "idempotency_key": f"p{n}",
                    }
                    for n in range(30)
                ]
            },
        )
        assert batch.json()["created"] == 30, batch.text
        keys: list[str] = []
        for _ in range(100):  # visibility trails the starts by a moment
            keys += (await purge(dev_api.http, outbox))["keys"]
            if len(keys) == 30:
                break
            await asyncio.sleep(0.1)
    finally:
        await patch(dev_api, url, {"paused": False})
    await asyncio.sleep(1)  # time for a wrong submit after the resume
    # Each item records its cancel on its own: under a full run's load some took over a second.
    deadline = time.monotonic() + 30
    while True:
        items = (await dev_api.http.get(f"/v1/outboxes/{outbox}/items?limit=100")).json()["items"]
        if {item["status"] for item in items} == {"cancelled"} or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.2)
    stats = [
        await dev_api.stack.fake.admin.key_stats(provider_idempotency_key(item["id"]))
        for item in items
    ]

    assert sorted(keys) == sorted(f"p{n}" for n in range(30))
    assert {item["status"] for item in items} == {"cancelled"} and len(items) == 30
    assert {item["attempts"] for item in items} == {0}
    assert sum(stat["submits"] for stat in stats) == 0


async def test_bad_changes_are_problems(dev_api: DevApi) -> None:
    url = f"/v1/destinations/{dev_api.webhook}"
    assert_problem(await dev_api.http.patch("/v1/destinations/nope", json={"paused": True}), 404)
    assert_problem(await patch(dev_api, url, {"submit_rate": 0}), 422)
    # A rate that would never deliver (issue 31): refused as in the destinations file.
    assert_problem(await patch(dev_api, url, {"submit_rate": 9.7e-39}), 422)
    assert_problem(await patch(dev_api, url, {"poll_rate": 0.0005}), 422)
    for not_a_bool in ("yes", 1, "true"):
        assert_problem(await patch(dev_api, url, {"paused": not_a_bool}), 422)
    assert_problem(await patch(dev_api, url, {"submit_rate": 1, "extra": 1}), 422)
    # `enabled` is true or false only; a reason needs `paused` or `enabled`.
    for not_enabled in ("yes", 1, None):
        body: dict[str, Any] = {"enabled": not_enabled, "reason": "x"}
        assert_problem(await dev_api.http.patch(url, json=body), 422)
    assert_problem(await patch(dev_api, url, {"enabled": False, "paused": False}), 422)
    assert_problem(await patch(dev_api, url, {"flow": {"disable_after_s": 0}}), 422)
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
        keys += (await purge(dev_api.http, "purging"))["keys"]
        if len(keys) == 3:
            break
        await asyncio.sleep(0.1)

    assert sorted(keys) == delayed
    for key in delayed:
        item = (await dev_api.http.get(f"/v1/outboxes/purging/items/{key}")).json()
        assert item["status"] == "cancelled"
    untouched = (await dev_api.http.get("/v1/outboxes/tests/items/purge-sent")).json()
    assert untouched["status"] == "sent"
    again = await purge(dev_api.http, "purging")
    # Nothing left to cancel (a lagging listing may still name one: it counts as skipped).
    assert again["cancelled"] == 0 and again["keys"] == []
    assert_problem(
        await dev_api.http.post("/v1/outboxes/purging/items:purge", json={"destination": "nope"}),
        404,
    )


@pytest_asyncio.fixture(loop_scope="session")
async def polling_api(stack_factory, fake_provider, dev_env) -> AsyncIterator[DevApi]:
    """An email destination whose submits make the first polls (`poll_in_submit`)."""
    email = email_destination(
        fake_provider, poll_in_submit=True, submit_rate=4.0, poll_rate=10.0, poll_interval_s=0.2
    )
    stack = await stack_factory(email, env=dev_env)
    settings = api_settings(workflow_task_queue=stack.task_queue)
    async for http in open_api(stack, settings):
        yield DevApi(http=http, stack=stack, webhook=email.name)


async def patch(api: DevApi, url: str, body: dict[str, Any]) -> httpx.Response:
    """A PATCH as a client sends it: again after a 503 (the dev server cut a queue's update
    short under a full run's load, and the API put every queue back: nothing changed), a few
    times."""
    for _ in range(5):
        response = await api.http.patch(url, json=body)
        if response.status_code != 503:
            break
        await asyncio.sleep(1)
    return response


async def poll_queue_rate(api: DevApi) -> QueueRate:
    [destination] = api.stack.destinations
    return await read_queue_rate(api.stack.client, destination.poll_task_queue)


async def test_poll_in_submit_shows_and_keeps_the_poll_rate_across_both_queues(
    polling_api: DevApi,
) -> None:
    url = f"/v1/destinations/{polling_api.webhook}"
    response = await polling_api.http.post(
        "/v1/outboxes/tests/items",
        json={"destination": polling_api.webhook, "payload": EMAIL},
        headers={"Idempotency-Key": "first-poll-in-submit"},
    )
    view = await polling_api.stack.result(response.json()["id"])
    shown = (await polling_api.http.get(url)).json()
    queue_as_configured = await poll_queue_rate(polling_api)

    faster_submits = await patch(polling_api, url, {"submit_rate": 5})
    queue_after_submit_change = await poll_queue_rate(polling_api)
    faster_polls = await patch(polling_api, url, {"poll_rate": 20})
    queue_after_poll_change = await poll_queue_rate(polling_api)
    too_fast = await patch(polling_api, url, {"submit_rate": 20})
    paused = await patch(polling_api, url, {"paused": True})
    resumed = await patch(polling_api, url, {"paused": False})

    assert view.status == "sent" and view.poll_count == 1
    assert shown["poll_in_submit"] is True and shown["configured_poll_rate"] == 10.0
    # The poll queue runs 10 - 4 a second; with the submits' first polls, 10 in all.
    assert queue_as_configured.rate == 6.0 and shown["poll"]["rate"] == 10.0
    assert faster_submits.json()["submit"] == {"rate": 5.0, "source": "api"}
    assert faster_submits.json()["poll"]["rate"] == 10.0
    assert (queue_after_submit_change.rate, queue_after_submit_change.source) == (5.0, "api")
    assert faster_polls.json()["poll"]["rate"] == 20.0 and queue_after_poll_change.rate == 15.0
    problem = assert_problem(too_fast, 422)
    assert "must stay above submit_rate" in problem["detail"]
    assert paused.json()["poll"]["rate"] == 0 and paused.json()["resume_poll_rate"] == 20.0
    assert resumed.json()["poll"] == {"rate": 20.0, "source": "api"}


@pytest.mark.parametrize(
    "status",
    [
        RPCStatusCode.CANCELLED,
        RPCStatusCode.DEADLINE_EXCEEDED,
        RPCStatusCode.UNAVAILABLE,
        RPCStatusCode.RESOURCE_EXHAUSTED,
    ],
)
def test_temporal_not_answering_in_time_is_a_503_with_retry_after(status: RPCStatusCode) -> None:
    """Issue 31: `GET /v1/destinations/{name}` answered 500 on a Temporal `CANCELLED` under load;
    every route's RPC errors go through this one mapping."""
    problem = known_problem(RPCError("the call was cancelled", status, b""))

    assert problem is not None
    assert (problem.status, problem.slug) == (503, "temporal-unavailable")
    assert problem.headers["Retry-After"].isdigit()


async def test_a_paused_bulk_destinations_shared_submits_are_withdrawn_by_a_purge(
    stack_factory, fake_provider, dev_env
) -> None:
    """With `submit_batch`, queued items wait in shared submit activities scheduled on the
    paused queue (4 out at once) and behind them: the purge takes each out of its batch (a
    batch no worker took is cancelled and the rest asked again), and the resume sends none."""
    webhook = webhook_destination(
        fake_provider, submit_rate=50.0, mode="bulk", shards=1, submit_batch=3
    )
    stack = await stack_factory(webhook, env=dev_env)
    settings = api_settings(
        workflow_task_queue=stack.task_queue,
        operations_task_queue=default_operations_task_queue(stack.task_queue),
    )
    outbox = "purge-paused-bulk"
    count = 20  # 12 in the 4 batches out, 8 waiting for a batch
    async for http in open_api(stack, settings):
        url = f"/v1/destinations/{webhook.name}"
        await http.patch(url, json={"paused": True, "reason": "purge while paused"})
        try:
            batch = await http.post(
                f"/v1/outboxes/{outbox}/items:batch",
                json={
                    "items": [
                        {
                            "destination": webhook.name,
                            "payload": {"n": n},
                            "idempotency_key": f"b{n}",
                        }
                        for n in range(count)
                    ]
                },
            )
            assert batch.json()["created"] == count, batch.text
            await asyncio.sleep(2)  # the shard has scheduled its batches on the paused queue
            keys: list[str] = []
            for _ in range(100):
                keys += (await purge(http, outbox))["keys"]
                if len(keys) >= count:
                    break
                await asyncio.sleep(0.1)

            items = await every_one_ended(http, outbox, count)
        finally:
            await http.patch(url, json={"paused": False})
        await asyncio.sleep(1.5)
        delivered = await fake_provider.admin.deliveries(webhook.name)

        assert sorted(set(keys)) == sorted(f"b{n}" for n in range(count))
        assert {item["status"] for item in items} == {"cancelled"}
        assert {item["attempts"] for item in items} == {0}
        assert delivered == []


async def every_one_ended(http: httpx.AsyncClient, outbox: str, count: int) -> list[dict[str, Any]]:
    """The outbox's `count` items once none is queued any more."""
    for _ in range(200):
        page = await http.get(f"/v1/outboxes/{outbox}/items?limit=100")
        items: list[dict[str, Any]] = page.json()["items"]
        if len(items) == count and all(item["status"] != "queued" for item in items):
            return items
        await asyncio.sleep(0.1)
    raise AssertionError(f"items never ended: {items}")
