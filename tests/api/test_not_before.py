"""A `not_before` later than Temporal can delay an item is refused, never silently shortened."""

from __future__ import annotations

import contextlib
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from durable_outbox_temporal.contract.ids import item_workflow_id
from durable_outbox_temporal.contract.limits import MAX_START_DELAY
from temporalio.service import RPCError

from tests.api.conftest import Api
from tests.api.test_items import assert_problem

FAR_FUTURE = "9999-12-31T23:59:59Z"
LIMIT = f"{MAX_START_DELAY.days} days"


async def _stop_if_started(api: Api, key: str) -> None:
    """Terminate the item if the far due time was wrongly accepted: teardown would otherwise
    skip the shared time-skipping server's clock thousands of years, breaking later tests."""
    handle = api.stack.client.get_workflow_handle(item_workflow_id("tests", key))
    with contextlib.suppress(RPCError):  # not found: nothing was started, as it should be
        await handle.terminate(reason="wrongly accepted far due time")


def _just_over_the_limit() -> str:
    # A minute over: the server's cap would still start it a minute early.
    return (datetime.now(UTC) + MAX_START_DELAY + timedelta(minutes=1)).isoformat()


@pytest.mark.parametrize("not_before", [FAR_FUTURE, "just-over"])
async def test_a_due_time_beyond_the_limit_is_422_and_starts_nothing(
    api: Api, not_before: str
) -> None:
    due = _just_over_the_limit() if not_before == "just-over" else not_before
    key = f"too-far-{uuid.uuid4()}"

    response = await api.http.post(
        "/v1/outboxes/tests/items",
        json={"destination": api.webhook.name, "payload": {"n": 1}, "not_before": due},
        headers={"Idempotency-Key": key},
    )
    await _stop_if_started(api, key)

    problem = assert_problem(response, 422, "invalid-request")
    assert LIMIT in problem["detail"]
    assert_problem(await api.http.get(f"/v1/outboxes/tests/items/{key}"), 404, "item-not-found")


async def test_a_due_time_within_the_limit_is_accepted(api: Api) -> None:
    due = (datetime.now(UTC) + MAX_START_DELAY - timedelta(minutes=1)).isoformat()
    key = f"far-but-fine-{uuid.uuid4()}"

    response = await api.http.post(
        "/v1/outboxes/tests/items",
        json={"destination": api.webhook.name, "payload": {"n": 1}, "not_before": due},
        headers={"Idempotency-Key": key},
    )

    assert response.status_code == 202, response.text
    # Cancelled, so teardown does not skip the shared server's clock a century to finish it.
    cancelled = await api.http.post(f"/v1/outboxes/tests/items/{key}/cancel", json={})
    assert cancelled.status_code == 200, cancelled.text


async def test_one_batch_item_beyond_the_limit_fails_alone(api: Api) -> None:
    key = f"too-far-{uuid.uuid4()}"
    items = [
        {"destination": api.webhook.name, "payload": {"n": 1}},
        {
            "destination": api.webhook.name,
            "payload": {"n": 2},
            "idempotency_key": key,
            "not_before": FAR_FUTURE,
        },
        {"destination": api.webhook.name, "payload": {"n": 3}},
    ]

    response = await api.http.post("/v1/outboxes/tests/items:batch", json={"items": items})
    await _stop_if_started(api, key)

    assert response.status_code == 200, response.text
    body = response.json()
    assert [result["status"] for result in body["results"]] == [202, 422, 202]
    assert (body["created"], body["existing"], body["failed"]) == (2, 0, 1)
    problem = body["results"][1]["problem"]
    assert problem["status"] == 422 and problem["type"].endswith("invalid-request")
    assert LIMIT in problem["detail"]
    assert_problem(await api.http.get(f"/v1/outboxes/tests/items/{key}"), 404, "item-not-found")
    for result in (body["results"][0], body["results"][2]):
        assert (await api.stack.result(result["item"]["id"])).status == "sent"


async def test_delay_seconds_makes_the_item_queued_until_its_due_time(api: Api) -> None:
    key = f"delayed-{uuid.uuid4()}"

    response = await api.http.post(
        "/v1/outboxes/tests/items",
        json={"destination": api.webhook.name, "payload": {"n": 1}, "delay_seconds": 3600},
        headers={"Idempotency-Key": key},
    )
    item = (await api.http.get(f"/v1/outboxes/tests/items/{key}")).json()
    handle = api.stack.client.get_workflow_handle(item_workflow_id("tests", key))
    described = await handle.describe()
    cancelled = await api.http.post(f"/v1/outboxes/tests/items/{key}/cancel", json={})

    assert response.status_code == 202, response.text
    assert item["status"] == "queued"
    # Both on the server's clock (the time-skipping server's runs ahead of the wall clock).
    assert described.execution_time is not None
    delay = described.execution_time - described.start_time
    assert timedelta(minutes=59) < delay <= timedelta(hours=1)
    assert datetime.fromisoformat(item["next_attempt_at"]) == described.execution_time
    assert cancelled.status_code == 200, cancelled.text


@pytest.mark.parametrize(
    ("fields", "problem_text"),
    [
        ({"delay_seconds": 10, "not_before": "2030-01-01T00:00:00Z"}, "not both"),
        ({"delay_seconds": -1}, "delay_seconds"),
        ({"delay_seconds": MAX_START_DELAY.total_seconds() + 1}, "delay_seconds"),
    ],
)
async def test_bad_delays_are_422(api: Api, fields: dict[str, object], problem_text: str) -> None:
    key = f"bad-delay-{uuid.uuid4()}"
    response = await api.http.post(
        "/v1/outboxes/tests/items",
        json={"destination": api.webhook.name, "payload": {"n": 1}, **fields},
        headers={"Idempotency-Key": key},
    )
    await _stop_if_started(api, key)

    assert problem_text in assert_problem(response, 422)["detail"]
