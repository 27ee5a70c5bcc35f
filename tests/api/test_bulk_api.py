"""Bulk mode through the REST API: the same routes and answers as for item workflows."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime, timedelta

from tests.api.conftest import Api
from tests.workflows.test_outbox_item import EMAIL


async def until_status(api: Api, key: str, status: str, *, skip_time: bool = True) -> dict:
    """Poll the item until it has `status`; with `skip_time`, the server may skip time meanwhile
    (it would also skip to the due time of anything else that waits)."""
    unlocked = (
        api.stack.env.time_skipping_unlocked()
        if skip_time and api.stack.env.supports_time_skipping
        else contextlib.nullcontext()
    )
    async with unlocked:
        for _ in range(300):
            response = await api.http.get(f"/v1/outboxes/tests/items/{key}")
            if response.status_code == 200 and response.json()["status"] == status:
                return dict(response.json())
            await asyncio.sleep(0.1)
    raise AssertionError(f"{key} never reached {status}: {response.text}")


async def test_bulk_items_are_enqueued_read_cancelled_and_refused_like_items(
    dev_env, api_factory
) -> None:
    # The dev server: real time, so the item due in an hour stays queued until it is cancelled.
    api = await api_factory(email_overrides={"mode": "bulk", "shards": 2}, env=dev_env)
    later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    batch = {
        "items": [
            {"destination": api.email.name, "payload": EMAIL, "idempotency_key": "now-1"},
            {"destination": api.email.name, "payload": EMAIL, "idempotency_key": "now-2"},
            {
                "destination": api.email.name,
                "payload": EMAIL,
                "idempotency_key": "later",
                "not_before": later,
            },
        ]
    }

    response = await api.http.post("/v1/outboxes/tests/items:batch", json=batch)
    assert response.status_code == 200, response.text
    assert [r["status"] for r in response.json()["results"]] == [202, 202, 202]
    cancelled = await api.http.post("/v1/outboxes/tests/items/later/cancel", json={})
    assert cancelled.status_code == 202, cancelled.text
    row = await until_status(api, "later", "cancelled", skip_time=False)
    assert row["status"] == "cancelled"
    events = (await api.http.get("/v1/outboxes/tests/items/later/events")).json()
    assert [event["type"] for event in events] == ["enqueued", "cancelled"]

    sent = await until_status(api, "now-1", "sent")
    assert sent["source"] == "read-model" and sent["attempts"] == 1
    # A repeat answers with the item; a different request for its key is a conflict.
    again = await api.http.post(
        "/v1/outboxes/tests/items",
        json={"destination": api.email.name, "payload": EMAIL},
        headers={"Idempotency-Key": "now-2"},
    )
    assert again.status_code == 200, again.text
    conflict = await api.http.post(
        "/v1/outboxes/tests/items",
        json={"destination": api.email.name, "payload": {"other": 1}},
        headers={"Idempotency-Key": "now-2"},
    )
    assert conflict.status_code == 409, conflict.text

    # An ordering key goes to the shard that owns it, whose lane the lanes API shows.
    ordered = await api.http.post(
        "/v1/outboxes/tests/items",
        json={"destination": api.email.name, "payload": EMAIL, "ordering_key": "k"},
        headers={"Idempotency-Key": "ordered-1"},
    )
    assert ordered.status_code == 202, ordered.text
    lane = await api.http.get("/v1/outboxes/tests/lanes/k")
    assert lane.status_code == 200, lane.text
    assert lane.json()["ordering_key"] == "k"
