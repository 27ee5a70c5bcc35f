"""Scheduled fan-out through the REST API, on the dev server: the time-skipping test server
implements none of Temporal's schedule RPCs (the last test shows what the API says there)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import httpx
import pytest_asyncio
from durable_outbox_temporal.contract.ids import temporal_schedule_id
from durable_outbox_temporal.contract.schedule import item_key
from durable_outbox_temporal.destinations import Destination
from temporalio.client import Client

from devstack.fake_provider import FakeProvider
from tests.api.conftest import api_settings, open_api
from tests.conftest import Stack, unique_name, webhook_destination
from tests.workflows.test_lane import wait_for
from worker import default_operations_task_queue


@dataclass
class ScheduleApi:
    http: httpx.AsyncClient
    stack: Stack
    webhook: Destination
    # Ids of this test's schedules start with it, so teardown deletes exactly those.
    prefix: str

    def new_id(self, name: str) -> str:
        return f"{self.prefix}-{name}"

    def body(self, name: str, **fields: Any) -> dict[str, Any]:
        """A valid create body: two webhook items with placeholders, every second."""
        items = [
            {
                "destination": self.webhook.name,
                "payload": {"n": 0, "at": "{{scheduled_at}}", "key": "{{item_key}}"},
            },
            {
                "destination": self.webhook.name,
                "payload": {"n": 1, "key": "{{item_key}}"},
                "key_suffix": "second",
            },
        ]
        return {"id": self.new_id(name), "outbox": "sched", "items": items, **fields}


async def delete_schedules(client: Client, prefix: str) -> None:
    async for entry in await client.list_schedules():
        if entry.id.startswith(temporal_schedule_id(prefix)):
            with contextlib.suppress(Exception):
                await client.get_schedule_handle(entry.id).delete()


@pytest_asyncio.fixture(loop_scope="session")
async def schedule_api(
    dev_env: Any, stack_factory: Any, fake_provider: FakeProvider
) -> AsyncIterator[ScheduleApi]:
    webhook = webhook_destination(fake_provider)
    stack: Stack = await stack_factory(webhook, env=dev_env)
    settings = api_settings(
        workflow_task_queue=stack.task_queue,
        operations_task_queue=default_operations_task_queue(stack.task_queue),
    )
    prefix = unique_name("t")
    opened = open_api(stack, settings)
    http = await opened.__anext__()
    try:
        yield ScheduleApi(http=http, stack=stack, webhook=webhook, prefix=prefix)
    finally:
        await delete_schedules(stack.client, prefix)
        await opened.aclose()


async def completed_fires(api: ScheduleApi, schedule_id: str, count: int) -> list[dict[str, Any]]:
    """Wait (wall clock: the dev server's schedules run on real time) for `count` fires whose
    workflows have completed; the schedule's fires, oldest first."""
    shown: dict[str, Any] = {}

    async def done() -> bool:
        nonlocal shown
        shown = (await api.http.get(f"/v1/schedules/{schedule_id}")).json()
        return sum(fire["status"] == "completed" for fire in shown["recent_fires"]) >= count

    await wait_for(done, limit_s=15)
    return list(reversed(shown["recent_fires"]))


async def delivered_keys(api: ScheduleApi) -> list[str]:
    """The item key (from its payload) of every delivery at this test's destination."""
    deliveries = await api.stack.fake.admin.deliveries(api.webhook.name)
    return [entry["payload"]["key"] for entry in deliveries]


async def wait_items_sent(api: ScheduleApi, keys: list[str]) -> None:
    for key in keys:
        await wait_for(lambda key=key: _is_sent(api, key), limit_s=15)


async def _is_sent(api: ScheduleApi, key: str) -> bool:
    response = await api.http.get(f"/v1/outboxes/sched/items/{key}")
    return response.status_code == 200 and response.json()["status"] == "sent"


def fire_keys(schedule_id: str, fire: dict[str, Any]) -> list[str]:
    at = datetime.fromisoformat(fire["scheduled_at"])
    return [item_key(schedule_id, at, "0"), item_key(schedule_id, at, "second")]


async def test_an_interval_schedule_enqueues_each_item_once_per_fire_until_paused(
    schedule_api: ScheduleApi,
) -> None:
    api = schedule_api
    schedule_id = api.new_id("every-second")

    created = await api.http.post(
        "/v1/schedules", json=api.body("every-second", interval_seconds=1)
    )
    assert created.status_code == 201, created.text
    fires = await completed_fires(api, schedule_id, 2)
    paused = await api.http.post(f"/v1/schedules/{schedule_id}/pause", json={"note": "enough"})
    fires_when_paused = paused.json()["fires"]
    await asyncio.sleep(2.5)  # two more fire times pass while paused
    shown = (await api.http.get(f"/v1/schedules/{schedule_id}")).json()
    keys = [key for fire in reversed(shown["recent_fires"]) for key in fire_keys(schedule_id, fire)]
    await wait_items_sent(api, keys)

    assert created.headers["location"] == f"/v1/schedules/{schedule_id}"
    assert created.json()["interval_seconds"] == 1 and created.json()["items"] == 2
    assert len(fires) >= 2 and len({fire["workflow_id"] for fire in fires}) == len(fires)
    assert paused.json()["paused"] is True and paused.json()["note"] == "enough"
    assert shown["fires"] == fires_when_paused and shown["next_fire_times"] == []
    # Each fire enqueued both its items, under keys made of its fire time, and nothing twice.
    assert sorted(await delivered_keys(api)) == sorted(keys)
    assert len(keys) == 2 * shown["fires"]


async def test_a_paused_schedule_fires_on_trigger_and_a_repeat_of_one_fire_adds_nothing(
    schedule_api: ScheduleApi,
) -> None:
    api = schedule_api
    schedule_id = api.new_id("yearly")
    body = api.body("yearly", cron="0 0 1 1 *", timezone="Europe/Paris", paused=True)
    created = await api.http.post("/v1/schedules", json=body)
    assert created.status_code == 201, created.text

    # Two triggers in a row: one fire each, or one fire for both when they share a second.
    triggered = [await api.http.post(f"/v1/schedules/{schedule_id}/trigger") for _ in range(2)]
    fires = await completed_fires(api, schedule_id, 1)
    await asyncio.sleep(1)  # a second trigger, if it was a fire of its own, has shown by now
    fires = await completed_fires(api, schedule_id, 1)
    keys = [key for fire in fires for key in fire_keys(schedule_id, fire)]
    await wait_items_sent(api, keys)

    assert [response.status_code for response in triggered] == [202, 202]
    assert created.json()["paused"] is True and created.json()["cron"] == "0 0 1 1 *"
    assert created.json()["next_fire_times"] == []  # paused
    assert len({fire["scheduled_at"] for fire in fires}) == len(fires) in (1, 2)
    assert sorted(await delivered_keys(api)) == sorted(keys)


async def test_show_list_unpause_and_delete(schedule_api: ScheduleApi) -> None:
    api = schedule_api
    schedule_id = api.new_id("weekday")
    body = api.body("weekday", cron="0 6 * * MON-FRI", timezone="Europe/Paris", paused=True)
    await api.http.post("/v1/schedules", json=body)

    unpaused = await api.http.post(f"/v1/schedules/{schedule_id}/unpause")
    listed: list[dict[str, Any]] = []

    async def is_listed() -> bool:
        nonlocal listed
        listed = (await api.http.get("/v1/schedules")).json()["schedules"]
        return any(entry["id"] == schedule_id for entry in listed)

    await wait_for(is_listed, limit_s=10)
    deleted = await api.http.delete(f"/v1/schedules/{schedule_id}")
    gone = await api.http.get(f"/v1/schedules/{schedule_id}")
    deleted_again = await api.http.delete(f"/v1/schedules/{schedule_id}")

    shown = unpaused.json()
    assert shown["paused"] is False and shown["note"] == "unpaused through the API"
    assert shown["temporal_schedule_id"] == f"schedule/{schedule_id}"
    assert shown["overlap"] == "skip" and shown["catchup_window_seconds"] == 300
    assert [item["key_suffix"] for item in shown["template"]] == [None, "second"]
    assert shown["template"][1]["payload"] == {"n": 1, "key": "{{item_key}}"}
    next_fires = [datetime.fromisoformat(at) for at in shown["next_fire_times"]]
    assert len(next_fires) == 5 and next_fires == sorted(next_fires)
    # 06:00 in Paris is 05:00 or 04:00 UTC, on weekdays only.
    assert all(at.hour in (4, 5) and at.minute == 0 and at.weekday() < 5 for at in next_fires)
    entry = next(entry for entry in listed if entry["id"] == schedule_id)
    assert entry["outbox"] == "sched" and entry["cron"] == "0 6 * * MON-FRI"
    assert entry["timezone"] == "Europe/Paris" and entry["items"] == 2
    assert deleted.status_code == 204
    assert gone.status_code == 404 and gone.json()["type"] == "/problems/schedule-not-found"
    assert deleted_again.status_code == 404


async def test_creation_refuses_bad_input_by_field_and_a_taken_id(
    schedule_api: ScheduleApi,
) -> None:
    api = schedule_api
    every = {"interval_seconds": 60}
    cases: list[tuple[dict[str, Any], list[str]]] = [
        (api.body("a"), ["body"]),  # neither cron nor interval
        (api.body("a", cron="0 6 * * *", **every), ["body"]),
        (api.body("a", cron="not a cron"), ["body", "cron"]),  # the server's parse
        (api.body("a", cron="61 * * * *"), ["body", "cron"]),
        (api.body("a", cron="0 6 * * *", timezone="Mars/Olympus"), ["body", "timezone"]),
        (api.body("a/b", **every), ["body", "id"]),
        (api.body("a", interval_seconds=0), ["body", "interval_seconds"]),
        (api.body("a", catchup_window_seconds=1, **every), ["body", "catchup_window_seconds"]),
        (api.body("a", overlap="allow_all", **every), ["body", "overlap"]),
        ({**api.body("a", **every), "extra": 1}, ["body", "extra"]),
        ({**api.body("a", **every), "items": []}, ["body", "items"]),
    ]
    item_cases: list[tuple[dict[str, Any], list[str]]] = [
        ({"destination": "nope"}, ["body", "items", "1", "destination"]),
        ({"payload": {"s": "{{nope}}"}}, ["body", "items", "1", "payload", "s"]),
        ({"key_suffix": "0"}, ["body", "items", "1", "key_suffix"]),
        ({"max_attempts": 0}, ["body", "items", "1", "max_attempts"]),
        ({"ordering_key": ".."}, ["body", "items", "1", "ordering_key"]),
        ({"payload": "text"}, ["body", "items", "1", "payload"]),
    ]
    for change, location in item_cases:
        body = api.body("a", **every)
        body["items"][1] = {**body["items"][1], **change}
        cases.append((body, location))

    for body, location in cases:
        response = await api.http.post("/v1/schedules", json=body)
        assert response.status_code == 422, (body, response.text)
        assert response.headers["content-type"] == "application/problem+json"
        assert location in [error["location"] for error in response.json()["errors"]], (
            body,
            response.json(),
        )
    first = await api.http.post("/v1/schedules", json=api.body("taken", **every))
    second = await api.http.post("/v1/schedules", json=api.body("taken", cron="0 6 * * *"))
    listed = (await api.http.get("/v1/schedules")).json()["schedules"]

    assert first.status_code == 201
    assert second.status_code == 409 and second.json()["type"] == "/problems/schedule-exists"
    # Nothing refused was created.
    assert api.new_id("a") not in [entry["id"] for entry in listed]


async def test_unknown_schedules_are_404_for_every_action(schedule_api: ScheduleApi) -> None:
    api = schedule_api
    base = f"/v1/schedules/{api.new_id('never-created')}"

    responses = [
        await api.http.get(base),
        await api.http.post(f"{base}/pause"),
        await api.http.post(f"{base}/unpause"),
        await api.http.post(f"{base}/trigger"),
        await api.http.delete(base),
    ]

    assert [response.status_code for response in responses] == [404] * 5
    assert {response.json()["type"] for response in responses} == {"/problems/schedule-not-found"}


async def test_a_server_without_schedules_answers_501(api: Any) -> None:
    # The time-skipping test server (the `api` fixture's) does not implement CreateSchedule.
    body = {
        "id": unique_name("ts"),
        "outbox": "sched",
        "items": [{"destination": api.webhook.name, "payload": {}}],
        "interval_seconds": 60,
    }

    response = await api.http.post("/v1/schedules", json=body)
    listed = await api.http.get("/v1/schedules")

    assert response.status_code == 501, response.text
    assert response.json()["type"] == "/problems/not-supported-by-temporal"
    assert "CreateSchedule" in response.json()["detail"]
    assert listed.status_code == 501
