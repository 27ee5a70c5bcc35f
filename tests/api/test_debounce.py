"""Debounce through the REST API: enqueue one or a batch into a window, see it wait, repeat a
member's key, cancel a member, read the superseded items; combinations it does not support are
refused, never accepted and ignored."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import httpx
import pytest
from durable_outbox_temporal.contract.debounce import (
    CLOSE_WINDOW_ACTIVITY,
    COLLECTED_KEY,
    debounce_workflow_id,
)
from durable_outbox_temporal.contract.ids import item_workflow_id

from tests.api.conftest import Api, api_settings, open_api
from tests.api.test_items import EMAIL, assert_problem
from tests.conftest import webhook_destination, workflow_result

ITEMS = "/v1/outboxes/tests/items"


def _debounced(api: Api, debounce_key: str, n: int, **fields: Any) -> dict[str, Any]:
    return {
        "destination": api.webhook.name,
        "payload": {"n": n},
        "debounce_key": debounce_key,
        "debounce_s": 30,
        **fields,
    }


async def _post(api: Api, key: str, body: dict[str, Any]) -> Any:
    return await api.http.post(ITEMS, json=body, headers={"Idempotency-Key": key})


async def _close_window(api: Api, debounce_key: str) -> int:
    """Let time run until the key's window has closed and its workflow ended."""
    stack = api.stack
    handle = stack.client.get_workflow_handle(
        debounce_workflow_id("tests", api.webhook.name, debounce_key)
    )
    async with stack.env.time_skipping_unlocked():
        closed: int = await workflow_result(handle)
    return closed


async def _item(api: Api, key: str) -> dict[str, Any]:
    response = await api.http.get(f"{ITEMS}/{key}")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def _key(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:10]}"


@pytest.mark.parametrize(
    ("fields", "on_email", "says"),
    [
        ({"debounce_s": 5}, False, "need a debounce_key"),
        ({"debounce_key": "k"}, False, "needs debounce_s"),
        ({"debounce_key": "k", "debounce_s": 5, "ordering_key": "o"}, False, "ordering_key"),
        ({"debounce_key": "k", "debounce_s": 5, "delay_seconds": 3}, False, "delay_seconds"),
        ({"debounce_key": "k", "debounce_s": 10, "max_wait_s": 5}, False, "max_wait_s"),
        ({"debounce_key": "k", "debounce_s": 5, "debounce_mode": "collect"}, True, "collect"),
        ({"debounce_key": "k", "debounce_s": 5, "debounce_mode": "sometimes"}, False, None),
        ({"debounce_key": "k", "debounce_s": 2 * 86400}, False, None),
        ({"debounce_key": "k", "debounce_s": 0}, False, None),
        ({"debounce_key": "a/b", "debounce_s": 5}, False, None),
    ],
)
async def test_unsupported_debounce_combinations_are_422_and_start_nothing(
    api: Api, fields: dict[str, Any], on_email: bool, says: str | None
) -> None:
    key = _key("refused")
    destination = api.email.name if on_email else api.webhook.name
    payload = EMAIL if on_email else {"n": 1}

    response = await _post(api, key, {"destination": destination, "payload": payload, **fields})

    problem = assert_problem(response, 422)
    if says is not None:
        assert says in problem["detail"], problem
    assert_problem(await api.http.get(f"{ITEMS}/{key}"), 404, "item-not-found")


async def test_a_payload_using_the_reserved_collect_member_is_refused(api: Api) -> None:
    key = _key("reserved")
    body = {"destination": api.webhook.name, "payload": {COLLECTED_KEY: [1, 2]}}
    problem = assert_problem(await _post(api, key, body), 422, "invalid-request")
    assert COLLECTED_KEY in problem["detail"]


async def test_a_batch_in_one_window_waits_then_one_item_carries_the_others(api: Api) -> None:
    debounce_key = _key("profile")
    keys = [_key(f"member-{n}") for n in (1, 2, 3)]
    batch = [{**_debounced(api, debounce_key, n), "idempotency_key": k} for n, k in enumerate(keys)]

    response = await api.http.post(f"{ITEMS}:batch", json={"items": batch})

    assert response.status_code == 200, response.text
    assert [r["status"] for r in response.json()["results"]] == [202, 202, 202]
    waiting = await _item(api, keys[0])
    assert (waiting["status"], waiting["debounce_key"]) == ("queued", debounce_key)
    [reason] = waiting["waiting_on"]
    assert reason["reason"] == "debounce" and reason["until"] is not None, reason
    assert "3 items" in reason["detail"]

    # A member's key again: the same member (200), never a second one; another request: 409.
    again = await _post(api, keys[1], _debounced(api, debounce_key, 1))
    assert (again.status_code, again.json()["status"]) == (200, "queued")
    assert_problem(
        await _post(api, keys[1], _debounced(api, debounce_key, 7)), 409, "idempotency-conflict"
    )

    assert await _close_window(api, debounce_key) == 1
    carrier = item_workflow_id("tests", keys[-1])
    sent = await api.stack.result(carrier)
    assert sent.status.value == "sent"

    for key in keys[:-1]:
        item = await _item(api, key)
        assert (item["status"], item["superseded_by"]) == ("superseded", carrier), item
        assert item["waiting_on"] is None
    carried = await _item(api, keys[-1])
    assert (carried["status"], carried["superseded_by"]) == ("sent", None)
    listed = await api.http.get(ITEMS, params={"status": "superseded", "limit": 200})
    assert {keys[0], keys[1]} <= {item["key"] for item in listed.json()["items"]}
    events = (await api.http.get(f"{ITEMS}/{keys[0]}/events")).json()
    assert [event["type"] for event in events] == ["enqueued", "superseded"]
    # A superseded member's key again: the read model answers with it, nothing is resent.
    repeat = await _post(api, keys[0], _debounced(api, debounce_key, 0))
    assert (repeat.status_code, repeat.json()["status"]) == (200, "superseded")
    delivered = await api.stack.fake.admin.deliveries(endpoint=api.webhook.name)
    assert [entry["payload"] for entry in delivered] == [{"n": 2}]


async def test_collect_posts_one_json_array_of_every_payload(api: Api) -> None:
    debounce_key = _key("digest")
    keys = [_key(f"part-{n}") for n in (1, 2, 3)]
    for n, key in enumerate(keys):
        body = _debounced(api, debounce_key, n, debounce_mode="collect", max_wait_s=60)
        assert (await _post(api, key, body)).status_code == 202

    assert await _close_window(api, debounce_key) == 1
    await api.stack.result(item_workflow_id("tests", keys[-1]))

    delivered = await api.stack.fake.admin.deliveries(endpoint=api.webhook.name)
    assert [entry["payload"] for entry in delivered] == [[{"n": 0}, {"n": 1}, {"n": 2}]]
    assert [(await _item(api, key))["status"] for key in keys] == [
        "superseded",
        "superseded",
        "sent",
    ]
    # The carrier's row holds what it delivered: a redrive of it would send the array again.
    carried = await _item(api, keys[-1])
    assert carried["payload"] == {COLLECTED_KEY: [{"n": 0}, {"n": 1}, {"n": 2}]}


async def test_a_cancelled_member_leaves_its_window_and_the_rest_still_goes(api: Api) -> None:
    debounce_key = _key("cancel")
    first, last = _key("stays"), _key("leaves")
    assert (await _post(api, first, _debounced(api, debounce_key, 1))).status_code == 202
    assert (await _post(api, last, _debounced(api, debounce_key, 2))).status_code == 202

    cancelled = await api.http.post(f"{ITEMS}/{last}/cancel", json={"reason": "changed my mind"})

    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["status"] == "cancelled"
    assert (await _item(api, last))["status"] == "cancelled"
    assert await _close_window(api, debounce_key) == 1
    await api.stack.result(item_workflow_id("tests", first))
    delivered = await api.stack.fake.admin.deliveries(endpoint=api.webhook.name)
    assert [entry["payload"] for entry in delivered] == [{"n": 1}]
    assert (await _item(api, first))["superseded_by"] is None
    # Cancelled for good: a second cancel is refused, not sent to the window again.
    assert_problem(await api.http.post(f"{ITEMS}/{last}/cancel"), 409)


async def test_cancels_racing_the_close_never_call_a_delivered_member_cancelled(
    stack_factory: Any, fake_provider: Any, dev_env: Any
) -> None:
    """Twenty members, each cancelled about when their window closes (dev server, two rounds):
    an item the cancel answered 200 for is `cancelled` and in no delivery; every other one is in
    exactly one delivery (superseded by, or itself, the carrier). The window records each
    decision before its I/O runs: the hand-over and the cancels are scheduled activities."""
    webhook = webhook_destination(fake_provider)
    stack = await stack_factory(webhook, env=dev_env)
    settings = api_settings(workflow_task_queue=stack.task_queue)
    async for http in open_api(stack, settings):
        for round_, wait_s in enumerate((0.9, 1.0)):
            debounce_key = _key(f"race{round_}")
            keys = [f"{debounce_key}-{n}" for n in range(20)]
            batch = await http.post(
                f"{ITEMS}:batch",
                json={
                    "items": [
                        {
                            "destination": webhook.name,
                            "payload": {"key": key},
                            "idempotency_key": key,
                            "debounce_key": debounce_key,
                            "debounce_s": 1,
                            "debounce_mode": "collect",
                        }
                        for key in keys
                    ]
                },
            )
            assert batch.json()["created"] == 20, batch.text
            await asyncio.sleep(wait_s)
            answers = await asyncio.gather(
                *(http.post(f"{ITEMS}/{key}/cancel", json={"reason": "race"}) for key in keys)
            )
            # 503: the server aborted the cancel's update as the window ended (under load); its
            # outcome is then the item's status, checked against the deliveries below.
            assert {answer.status_code for answer in answers} <= {200, 409, 503}, [
                answer.text for answer in answers if answer.status_code not in (200, 409, 503)
            ]
            statuses = await _ended(http, keys)
            window = stack.client.get_workflow_handle(
                debounce_workflow_id("tests", webhook.name, debounce_key)
            )
            await workflow_result(window)
            # The carrier's delivery, if any: it ends `sent` once the provider has it.
            carried = [key for key in keys if statuses[key] != "cancelled"]
            if carried:
                await _ended_as(http, carried, {"superseded", "sent", "failed"})
            delivered = [
                member["key"]
                for entry in await fake_provider.admin.deliveries(endpoint=webhook.name)
                if isinstance(entry["payload"], list)
                for member in entry["payload"]
                if str(member.get("key", "")).startswith(debounce_key)
            ]

            for key, answer in zip(keys, answers, strict=True):
                cancelled = statuses[key] == "cancelled"
                if answer.status_code != 503:
                    assert cancelled == (answer.status_code == 200), (key, statuses[key])
                assert delivered.count(key) == (0 if cancelled else 1), (key, statuses[key])
            history = await window.fetch_history()
            scheduled = [
                event.activity_task_scheduled_event_attributes.activity_type.name
                for event in history.events
                if event.HasField("activity_task_scheduled_event_attributes")
            ]
            assert CLOSE_WINDOW_ACTIVITY in scheduled or not delivered


async def _ended(http: httpx.AsyncClient, keys: list[str]) -> dict[str, str]:
    """Each key's status once none is queued any more."""
    for _ in range(300):
        found = [(await http.get(f"{ITEMS}/{key}")).json()["status"] for key in keys]
        if "queued" not in found:
            return dict(zip(keys, found, strict=True))
        await asyncio.sleep(0.1)
    raise AssertionError(f"never ended: {found}")


async def _ended_as(http: httpx.AsyncClient, keys: list[str], ended: set[str]) -> None:
    """Until one of `keys` is `sent` and the others are in `ended` (the carrier went)."""
    for _ in range(300):
        found = [(await http.get(f"{ITEMS}/{key}")).json()["status"] for key in keys]
        if "sent" in found and set(found) <= ended:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"the window's carrier never went: {found}")
