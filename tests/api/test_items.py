"""REST API for items, end to end: HTTP, app, Temporal, worker, fake provider, read model."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from durable_outbox_temporal.contract.item import ItemProjection, ItemStatus
from temporalio.client import Client, Interceptor, OutboundInterceptor, StartWorkflowInput

from api.problem_codes import PROBLEM_CODES
from readmodel import store
from tests.api.conftest import Api
from tests.fakes import deliveries, script
from tests.readmodel.test_store import view

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
    # Every answer's code is listed, with this status, and its `type` names its kind's page.
    listed = PROBLEM_CODES.get(body.get("code", ""))
    assert listed is not None and listed.status in (status, None), body
    assert body["type"].endswith(f"/problems/{listed.type_code}"), body
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


async def test_failed_row_behind_a_running_workflow_is_not_served(api: Api) -> None:
    """A redrive restarts a failed item before its row catches up: the workflow must win."""
    later = (datetime.now(UTC) + timedelta(hours=2)).isoformat()
    links = (await enqueue(api, "stale-row", not_before=later)).json()["links"]
    stale = view(
        "stale-row", 5, ItemStatus.FAILED, "tests", destination=api.email.name, last_error="old"
    )
    await asyncio.to_thread(
        store.apply_projection, api.stack.engine, ItemProjection(view=stale, events=[])
    )

    item = (await api.http.get(links["self"])).json()

    assert item["status"] == "queued" and item["source"] == "workflow"
    assert item["last_error"] is None


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
        ({"destination": "x", "payload": {}, "max_attempts": "3"}, "max_attempts"),
        ({"destination": "x", "payload": {}, "priority": 0}, "priority"),
        ({"destination": "x", "payload": {}, "priority": 6}, "priority"),
        ({"destination": "x", "payload": {}, "priority": "1"}, "priority"),
        ({"destination": "x", "payload": {}, "ordering_key": "a\x00b"}, "ordering_key"),
        ({"destination": "x", "payload": {}, "surprise": 1}, "surprise"),
        ({"destination": 7, "payload": {}}, "destination"),
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
    [
        ("bad name!", "k"),
        ("-leading-dash", "k"),
        ("o" * 101, "k"),
        ("tests", "x" * 201),
        ("tests", ""),
        ("tests", "a/b"),
        ("tests", "tab\there"),
        ("tests", "bell\x07"),
        ("tests", "."),
        ("tests", ".."),
    ],
)
async def test_invalid_outbox_or_key_is_422(api: Api, outbox: str, key: str) -> None:
    response = await api.http.post(
        f"/v1/outboxes/{outbox}/items",
        json={"destination": api.webhook.name, "payload": {}},
        headers={"Idempotency-Key": key},
    )

    assert_problem(response, 422, "invalid-request")
    assert api.stack.outbox.started == []


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/outboxes/tests/items/%01ctrl"),
        ("GET", "/v1/outboxes/tests/items/%7F/events"),
        ("GET", f"/v1/outboxes/tests/items/{'k' * 201}"),
        ("POST", "/v1/outboxes/tests/items/%1Bescape/cancel"),
        ("POST", "/v1/outboxes/tests/items/%00/redrive"),
        ("GET", "/v1/outboxes/bad%20name/items/k"),
        ("GET", "/v1/outboxes/bad%20name/items"),
        ("GET", "/v1/outboxes/bad%20name/stats"),
    ],
)
async def test_invalid_key_or_outbox_in_path_is_422(api: Api, method: str, path: str) -> None:
    assert_problem(await api.http.request(method, path), 422, "invalid-request")


@pytest.mark.parametrize("key", ["order:42:cancel", "a?b=1#frag %20 ;,", "grüße-ü", "events"])
async def test_keys_with_reserved_characters_round_trip_through_links(api: Api, key: str) -> None:
    later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    # Header values travel as bytes: UTF-8 is what curl and most clients send.
    response = await api.http.post(
        "/v1/outboxes/tests/items",
        json={"destination": api.webhook.name, "payload": {}, "not_before": later},
        headers={"Idempotency-Key": key.encode()},
    )

    assert response.status_code == 202, response.text
    links = response.json()["links"]
    assert response.json()["key"] == key and response.json()["id"] == f"outbox/tests/{key}"
    item = await api.http.get(links["self"])
    assert item.status_code == 200 and item.json()["key"] == key
    # Its `queued` row and event were written by the API right after the start.
    events = (await api.http.get(links["events"])).json()
    assert [(event["seq"], event["type"]) for event in events] == [(1, "enqueued")]
    cancelled = await api.http.post(links["cancel"])
    assert cancelled.status_code == 200 and cancelled.json()["key"] == key


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


async def test_oversized_streamed_body_without_content_length_is_413(api_factory) -> None:
    api = await api_factory(max_request_bytes=1000)

    async def chunks() -> Any:
        yield b'{"destination": "x", "payload": {"blob": "'
        for _ in range(10):
            yield b"x" * 500
        yield b'"}}'

    response = await api.http.post(
        "/v1/outboxes/tests/items",
        content=chunks(),
        headers={"Content-Type": "application/json"},
    )

    assert "content-length" not in response.request.headers
    body = assert_problem(response, 413)
    assert "1000" in body["detail"]


async def test_body_just_under_the_limit_is_accepted(api_factory) -> None:
    api = await api_factory(max_request_bytes=1000)
    body = {"destination": api.webhook.name, "payload": {"blob": ""}}
    body["payload"]["blob"] = "x" * (990 - len(json.dumps(body)))

    content = json.dumps(body)
    json_type = {"Content-Type": "application/json"}

    response = await api.http.post("/v1/outboxes/tests/items", content=content, headers=json_type)
    untyped = await api.http.post("/v1/outboxes/tests/items", content=content)

    assert len(content) < 1000
    assert response.status_code == 202, response.text
    assert assert_problem(untyped, 415)["detail"].endswith("'Content-Type: application/json'")


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
    assert_problem(await api.http.post("/v1/outboxes/tests/items/never/redrive"), 404)
    assert_problem(await api.http.get("/v1/outboxes/tests/items/never/events"), 404)


async def test_failed_item_needs_redrive_and_redrive_delivers(api: Api) -> None:
    await script(api.stack.fake, "outbox/tests/fails-once", [{"status": 400}])
    first = await enqueue(api, "fails-once")
    links = first.json()["links"]
    await api.stack.failure(first.json()["id"])

    failed = (await api.http.get(links["self"])).json()
    reuse = await enqueue(api, "fails-once")
    redrive = await api.http.post(links["redrive"])
    await api.stack.result(first.json()["id"])
    sent = (await api.http.get(links["self"])).json()
    redrive_sent = await api.http.post(links["redrive"])

    assert failed["status"] == "failed" and "400" in failed["last_error"]
    reuse_problem = assert_problem(reuse, 409, "item-failed")
    assert "redrive" in reuse_problem["detail"]
    assert reuse_problem["redrive"] == links["redrive"]
    assert redrive.status_code == 202 and redrive.json()["created"] is True
    assert sent["status"] == "sent"
    assert [e["type"] for e in (await api.http.get(links["events"])).json()][-3:] == [
        "redriven",
        "accepted",
        "sent",
    ]
    assert_problem(redrive_sent, 409, "not-redrivable")
    # Refused under the first generation's key; delivered once under the redrive's own.
    assert await deliveries(api.stack.fake, first.json()["id"]) == 0
    assert await deliveries(api.stack.fake, first.json()["id"], generation=1) == 1


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
    await script(api.stack.fake, "outbox/tests/batch-failed", [{"status": 400}])
    await api.stack.failure((await enqueue(api, "batch-failed")).json()["id"])
    webhook = api.webhook.name
    items = [
        {"destination": webhook, "payload": {"n": 1}, "idempotency_key": "batch-new"},
        {"destination": api.email.name, "payload": EMAIL, "idempotency_key": "batch-existing"},
        {"destination": "nowhere", "payload": {}},
        {"destination": webhook, "payload": {"n": 2}, "idempotency_key": "a/b"},
        {"destination": webhook, "payload": [1, 2]},
        "not an object",
        {"destination": webhook, "payload": {"other": 1}, "idempotency_key": "batch-existing"},
        {"destination": api.email.name, "payload": EMAIL, "idempotency_key": "batch-failed"},
        {"destination": webhook, "payload": {"n": 3}},
    ]

    response = await api.http.post("/v1/outboxes/tests/items:batch", json={"items": items})

    assert response.status_code == 200
    body = response.json()
    results = body["results"]
    assert [r["index"] for r in results] == list(range(len(items)))
    assert [r["status"] for r in results] == [202, 200, 404, 422, 422, 422, 409, 409, 202]
    assert (body["created"], body["existing"], body["failed"]) == (2, 1, 6)
    assert results[0]["item"]["key"] == "batch-new" and results[0]["problem"] is None
    assert results[1]["item"]["created"] is False
    assert results[2]["problem"]["type"].endswith("unknown-destination")
    assert results[4]["problem"]["errors"][0]["location"] == ["body", "items", "4", "payload"]
    assert "payload" in results[4]["problem"]["detail"]
    assert results[6]["problem"]["type"].endswith("idempotency-conflict")
    assert results[7]["problem"]["redrive"] == "/v1/outboxes/tests/items/batch-failed/redrive"
    generated = results[8]["item"]
    assert len(generated["key"]) == 36
    assert (await api.stack.result(generated["id"])).status == "sent"


class _FailOneStart(Interceptor):
    """Makes starting one workflow id fail the way a bug would: an unexpected exception."""

    def __init__(self, workflow_id: str) -> None:
        self.workflow_id = workflow_id

    def intercept_client(self, next: OutboundInterceptor) -> OutboundInterceptor:
        failing = self.workflow_id

        class FailOne(OutboundInterceptor):
            async def start_workflow(self, input: StartWorkflowInput) -> Any:
                if input.id == failing:
                    raise RuntimeError("injected failure")
                return await super().start_workflow(input)

        return FailOne(next)


async def test_unexpected_failure_of_one_batch_item_is_its_own_500(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = api.stack.outbox.connection.config()
    assert isinstance(api.stack.outbox.connection, Client)
    config["interceptors"] = [_FailOneStart("outbox/tests/batch-bug")]
    monkeypatch.setattr(api.stack.outbox, "_client", Client(**config))
    webhook = api.webhook.name
    items = [
        {"destination": webhook, "payload": {"n": 1}, "idempotency_key": "batch-before-bug"},
        {"destination": webhook, "payload": {"n": 2}, "idempotency_key": "batch-bug"},
        {"destination": webhook, "payload": {"n": 3}, "idempotency_key": "batch-after-bug"},
    ]

    response = await api.http.post("/v1/outboxes/tests/items:batch", json={"items": items})

    assert response.status_code == 200, response.text
    body = response.json()
    assert [r["status"] for r in body["results"]] == [202, 500, 202]
    assert (body["created"], body["existing"], body["failed"]) == (2, 0, 1)
    problem = body["results"][1]["problem"]
    assert problem["code"] == "internal" and "injected" not in problem["detail"]
    for key in ("batch-before-bug", "batch-after-bug"):
        assert (await api.stack.result(f"outbox/tests/{key}")).status == "sent"
    assert_problem(await api.http.get("/v1/outboxes/tests/items/batch-bug"), 404)


@pytest.mark.parametrize(
    "body", [{"items": []}, {"items": {"a": 1}}, {"things": []}, [{"destination": "x"}]]
)
async def test_malformed_batch_envelope_is_422(api: Api, body: Any) -> None:
    response = await api.http.post("/v1/outboxes/tests/items:batch", json=body)

    assert_problem(response, 422, "invalid-request")


async def test_batch_over_100_items_is_422(api: Api) -> None:
    items = [{"destination": api.webhook.name, "payload": {}}] * 101

    response = await api.http.post("/v1/outboxes/tests/items:batch", json={"items": items})

    assert_problem(response, 422)


async def _enqueue_listing(api: Api, key: str, destination: str, payload: Any) -> str:
    response = await api.http.post(
        "/v1/outboxes/listing/items",
        json={"destination": destination, "payload": payload},
        headers={"Idempotency-Key": key},
    )
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


async def test_list_filters_and_paginates(api: Api) -> None:
    started = datetime.now(UTC)
    webhook_ids = [
        await _enqueue_listing(api, f"list-{n}", api.webhook.name, {"n": n}) for n in range(4)
    ]
    email_id = await _enqueue_listing(api, "list-email", api.email.name, EMAIL)
    await script(api.stack.fake, "outbox/listing/list-failed", [{"status": 400}])
    failed_id = await _enqueue_listing(api, "list-failed", api.webhook.name, {"n": "bad"})
    for item_id in [*webhook_ids, email_id]:
        await api.stack.result(item_id)
    await api.stack.failure(failed_id)

    async def ids(**params: Any) -> list[str]:
        response = await api.http.get("/v1/outboxes/listing/items", params=params)
        assert response.status_code == 200, response.text
        return [item["id"] for item in response.json()["items"]]

    pages: list[dict[str, Any]] = []
    cursor = None
    while not pages or cursor:
        params = {"limit": 4, **({"cursor": cursor} if cursor else {})}
        pages.append((await api.http.get("/v1/outboxes/listing/items", params=params)).json())
        cursor = pages[-1]["next_cursor"]
    listed = [item["id"] for page in pages for item in page["items"]]
    everything = [*webhook_ids, email_id, failed_id]

    assert [len(page["items"]) for page in pages] == [4, 2]
    assert listed == list(reversed(everything))  # newest first, no gaps, no repeats
    assert sorted(await ids(status="sent")) == sorted([*webhook_ids, email_id])
    assert await ids(status="failed") == [failed_id]
    assert await ids(destination=api.email.name) == [email_id]
    assert await ids(key_prefix="list-f") == [failed_id]
    assert len(await ids(key_prefix="list-")) == 6
    assert await ids(key_prefix="list_") == []  # `_` is no wildcard
    assert sorted(await ids(status="sent", destination=api.webhook.name)) == sorted(webhook_ids)
    hour_before = started - timedelta(hours=1)
    east, west = timezone(timedelta(hours=5)), timezone(timedelta(hours=-3))
    assert len(await ids(created_from=hour_before.astimezone(east).isoformat())) == 6
    assert await ids(created_to=hour_before.astimezone(west).isoformat()) == []
    naive_later = (datetime.now(UTC) + timedelta(minutes=5)).replace(tzinfo=None)
    assert await ids(created_from=naive_later.isoformat()) == []
    assert len(await ids(created_from=started.isoformat(), created_to=naive_later.isoformat())) == 6
    for bad in ({"cursor": "garbage"}, {"status": "lost"}, {"limit": 0}, {"limit": 501}):
        assert_problem(await api.http.get("/v1/outboxes/listing/items", params=bad), 422)
    assert_problem(
        await api.http.get("/v1/outboxes/listing/items", params={"created_from": "yesterday"}),
        422,
    )

    stats = (await api.http.get("/v1/outboxes/listing/stats")).json()
    assert stats["counts"] == {"sent": 5, "failed": 1} and stats["total"] == 6
    rates = {d["name"]: (d["submit_rate"], d["poll_rate"]) for d in stats["destinations"]}
    assert rates == {
        api.email.name: (api.email.submit_rate, api.email.poll_rate),
        api.webhook.name: (api.webhook.submit_rate, api.webhook.poll_rate),
    }
    outboxes = (await api.http.get("/v1/outboxes")).json()
    assert {"outbox": "listing", "counts": {"sent": 5, "failed": 1}, "total": 6} in outboxes
    empty = (await api.http.get("/v1/outboxes/nothing-here/stats")).json()
    assert empty["counts"] == {} and empty["total"] == 0
