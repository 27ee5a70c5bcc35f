"""REST API for items, end to end: HTTP, app, Temporal, worker, fake provider, read model."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.api.conftest import Api
from tests.fakes import deliveries, script

EMAIL = {
    "senderAddress": "noreply@example.com",
    "recipients": {"to": [{"address": "grace@example.com"}]},
    "content": {"subject": "Hi", "plainText": "Hello Grace"},
}
PROBLEM = "application/problem+json"


def assert_problem(response: Any, status: int, type_suffix: str | None = None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith(PROBLEM)
    body: dict[str, Any] = response.json()
    assert body["status"] == status and body["title"] and body["detail"]
    if type_suffix is not None:
        assert body["type"].endswith(type_suffix), body
    return body


async def enqueue(api: Api, key: str, payload: dict[str, Any] | None = None, **fields: Any) -> Any:
    body = {"destination": api.email.name, "payload": payload or EMAIL, **fields}
    return await api.http.post(
        "/v1/outboxes/tests/items", json=body, headers={"Idempotency-Key": key}
    )


async def test_enqueue_then_item_is_sent_and_served_from_read_model(api: Api) -> None:
    response = await enqueue(api, "welcome-1")

    assert response.status_code == 202
    body = response.json()
    assert body["id"] == "outbox/tests/welcome-1" and body["created"] is True
    assert response.headers["location"] == body["links"]["self"]
    await api.stack.result(body["id"])
    item = (await api.http.get(body["links"]["self"])).json()
    assert item["status"] == "sent" and item["source"] == "read-model"
    assert item["payload"] == EMAIL
    events = (await api.http.get(body["links"]["events"])).json()
    assert [e["type"] for e in events] == ["enqueued", "accepted", "sent"]


async def test_running_item_is_served_live_from_the_workflow(api: Api) -> None:
    later = (datetime.now(UTC) + timedelta(hours=2)).isoformat()
    response = await enqueue(api, "later-1", not_before=later)

    item = (await api.http.get(response.json()["links"]["self"])).json()

    assert item["status"] == "queued" and item["source"] == "workflow"


async def test_same_key_returns_existing_item_and_other_payload_conflicts(api: Api) -> None:
    first = await enqueue(api, "dup-1")
    again = await enqueue(api, "dup-1")
    conflict = await enqueue(api, "dup-1", payload={**EMAIL, "senderAddress": "b@example.com"})

    assert (first.status_code, again.status_code) == (202, 200)
    assert again.json()["id"] == first.json()["id"] and again.json()["created"] is False
    assert_problem(conflict, 409, "idempotency-conflict")
    await api.stack.result(first.json()["id"])
    assert await deliveries(api.stack.fake, first.json()["id"]) == 1


async def test_missing_idempotency_key_is_generated(api: Api) -> None:
    response = await api.http.post(
        "/v1/outboxes/tests/items", json={"destination": api.webhook.name, "payload": {"a": 1}}
    )

    assert response.status_code == 202
    assert len(response.json()["key"]) == 36


async def test_unknown_destination_is_404(api: Api) -> None:
    response = await api.http.post(
        "/v1/outboxes/tests/items", json={"destination": "nowhere", "payload": {}}
    )

    body = assert_problem(response, 404, "unknown-destination")
    assert "nowhere" in body["detail"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"payload": {}}, "destination"),
        ({"destination": "x", "payload": [1, 2]}, "payload"),
        ({"destination": "x", "payload": "text"}, "payload"),
        ({"destination": "x", "payload": {}, "not_before": "2030-01-01T00:00:00"}, "not_before"),
        ({"destination": "x", "payload": {}, "not_before": "tomorrow"}, "not_before"),
        ({"destination": "x", "payload": {}, "max_attempts": 0}, "max_attempts"),
        ({"destination": "x", "payload": {}, "surprise": 1}, "surprise"),
    ],
)
async def test_invalid_body_is_422_naming_the_field(
    api: Api, body: dict[str, Any], field: str
) -> None:
    response = await api.http.post("/v1/outboxes/tests/items", json=body)

    problem = assert_problem(response, 422, "invalid-request")
    assert field in problem["detail"]
    assert any(field in error["location"] for error in problem["errors"])


@pytest.mark.parametrize(
    ("outbox", "key"),
    [("bad name!", "k"), ("tests", "x" * 201), ("tests", "a/b"), ("tests", "tab\there")],
)
async def test_invalid_outbox_or_key_is_422(api: Api, outbox: str, key: str) -> None:
    response = await api.http.post(
        f"/v1/outboxes/{outbox}/items",
        json={"destination": api.webhook.name, "payload": {}},
        headers={"Idempotency-Key": key},
    )

    assert_problem(response, 422, "invalid-request")


async def test_malformed_json_is_400(api: Api) -> None:
    response = await api.http.post(
        "/v1/outboxes/tests/items",
        content=b'{"destination": ',
        headers={"Content-Type": "application/json"},
    )

    assert_problem(response, 400, "malformed-json")


async def test_oversized_body_is_413(api_factory) -> None:
    api = await api_factory(max_request_bytes=1000)

    response = await api.http.post(
        "/v1/outboxes/tests/items",
        json={"destination": api.webhook.name, "payload": {"blob": "x" * 5000}},
    )

    body = assert_problem(response, 413)
    assert "1000" in body["detail"]


async def test_unknown_route_and_method_are_problems(api: Api) -> None:
    assert_problem(await api.http.get("/v1/nothing-here"), 404)
    assert_problem(await api.http.delete("/v1/outboxes/tests/items"), 405)


async def test_cancel_delayed_item_then_cancel_again_is_409(api: Api) -> None:
    later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    links = (await enqueue(api, "cancel-me", not_before=later)).json()["links"]

    cancelled = await api.http.post(links["cancel"], json={"reason": "changed my mind"})
    again = await api.http.post(links["cancel"])

    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert_problem(again, 409, "cannot-cancel")


async def test_cancel_of_sent_item_is_409_and_unknown_item_404(api: Api) -> None:
    response = await enqueue(api, "sent-then-cancel")
    await api.stack.result(response.json()["id"])

    assert_problem(await api.http.post(response.json()["links"]["cancel"]), 409, "cannot-cancel")
    assert_problem(await api.http.get("/v1/outboxes/tests/items/never"), 404, "item-not-found")
    assert_problem(await api.http.post("/v1/outboxes/tests/items/never/cancel"), 404)


async def test_failed_item_needs_redrive_and_redrive_delivers(api: Api) -> None:
    await script(api.stack.fake, "outbox/tests/fails-once", [{"status": 400}])
    first = await enqueue(api, "fails-once")
    await api.stack.failure(first.json()["id"])

    reuse = await enqueue(api, "fails-once")
    redrive = await api.http.post(first.json()["links"]["redrive"])
    await api.stack.result(first.json()["id"])
    redrive_sent = await api.http.post(first.json()["links"]["redrive"])

    assert_problem(reuse, 409, "item-failed")
    assert redrive.status_code == 202
    assert (await api.http.get(first.json()["links"]["self"])).json()["status"] == "sent"
    assert_problem(redrive_sent, 409, "not-redrivable")


async def test_redrive_failed_redrives_every_failed_item(api: Api) -> None:
    keys = ["bulk-a", "bulk-b"]
    for key in keys:
        await script(api.stack.fake, f"outbox/tests/{key}", [{"status": 422}])
        await api.stack.failure((await enqueue(api, key)).json()["id"])

    response = await api.http.post("/v1/outboxes/tests/items:redrive-failed", json={})

    assert response.status_code == 200
    assert sorted(response.json()["keys"]) == keys
    for key in keys:
        assert (await api.stack.result(f"outbox/tests/{key}")).status == "sent"


async def test_batch_reports_each_item(api: Api) -> None:
    await enqueue(api, "batch-existing")
    items = [
        {"destination": api.webhook.name, "payload": {"n": 1}, "idempotency_key": "batch-new"},
        {"destination": api.email.name, "payload": EMAIL, "idempotency_key": "batch-existing"},
        {"destination": "nowhere", "payload": {}},
        {"destination": api.webhook.name, "payload": {"n": 2}, "idempotency_key": "a/b"},
    ]

    response = await api.http.post("/v1/outboxes/tests/items:batch", json={"items": items})

    assert response.status_code == 200
    body = response.json()
    assert [r["status"] for r in body["results"]] == [202, 200, 404, 422]
    assert (body["created"], body["existing"], body["failed"]) == (1, 1, 2)
    assert body["results"][2]["problem"]["type"].endswith("unknown-destination")


async def test_batch_over_100_items_is_422(api: Api) -> None:
    items = [{"destination": api.webhook.name, "payload": {}}] * 101

    response = await api.http.post("/v1/outboxes/tests/items:batch", json={"items": items})

    assert_problem(response, 422)


async def test_list_filters_and_paginates(api: Api) -> None:
    ids = []
    for n in range(5):
        response = await api.http.post(
            "/v1/outboxes/listing/items",
            json={"destination": api.webhook.name, "payload": {"n": n}},
            headers={"Idempotency-Key": f"list-{n}"},
        )
        ids.append(response.json()["id"])
    for item_id in ids:
        await api.stack.result(item_id)

    first = (await api.http.get("/v1/outboxes/listing/items", params={"limit": 2})).json()
    second = (
        await api.http.get(
            "/v1/outboxes/listing/items", params={"limit": 2, "cursor": first["next_cursor"]}
        )
    ).json()
    third = (
        await api.http.get(
            "/v1/outboxes/listing/items", params={"limit": 2, "cursor": second["next_cursor"]}
        )
    ).json()
    filtered = await api.http.get(
        "/v1/outboxes/listing/items", params={"status": "failed", "destination": api.webhook.name}
    )

    listed = [item["id"] for page in (first, second, third) for item in page["items"]]
    assert sorted(listed) == sorted(ids) and len(set(listed)) == 5
    assert third["next_cursor"] is None
    assert filtered.json()["items"] == []
    assert_problem(await api.http.get("/v1/outboxes/listing/items?cursor=garbage"), 422)
    assert_problem(await api.http.get("/v1/outboxes/listing/items?status=lost"), 422)

    stats = (await api.http.get("/v1/outboxes/listing/stats")).json()
    assert stats["counts"] == {"sent": 5} and stats["total"] == 5
    assert {d["name"] for d in stats["destinations"]} == {api.email.name, api.webhook.name}
    outboxes = (await api.http.get("/v1/outboxes")).json()
    assert {"outbox": "listing", "counts": {"sent": 5}, "total": 5} in outboxes
