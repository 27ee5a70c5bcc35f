"""Items through the REST client, sync and async, against the real API over HTTP: enqueue,
read until sent, history, the API's refusals as typed exceptions, batches and pagination."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from durable_outbox_rest import (
    AsyncOutboxRest,
    CancelRequested,
    Conflict,
    Item,
    ItemStatus,
    NewItem,
    NotFound,
    OutboxRest,
    ProblemError,
    Unprocessable,
)

from tests.rest_client.conftest import ServedStack

EMAIL = {
    "senderAddress": "noreply@example.com",
    "recipients": {"to": [{"address": "ada@example.com"}]},
    "content": {"subject": "Welcome", "plainText": "Hi Ada"},
}
WITHIN_S = 30


def wait_for_status(rest: OutboxRest, outbox: str, key: str, wanted: str) -> Item:
    """The item once its status is `wanted`, or as it is after `WITHIN_S`."""
    deadline = time.monotonic() + WITHIN_S
    while True:
        item = rest.get_item(outbox, key)
        if item.status == wanted or time.monotonic() > deadline:
            return item
        time.sleep(0.2)


async def wait_for_status_async(rest: AsyncOutboxRest, outbox: str, key: str, wanted: str) -> Item:
    """The item once its status is `wanted`, or as it is after `WITHIN_S`."""
    deadline = time.monotonic() + WITHIN_S
    while True:
        item = await rest.get_item(outbox, key)
        if item.status == wanted or time.monotonic() > deadline:
            return item
        await asyncio.sleep(0.2)


async def test_sync_client_enqueues_reads_until_sent_and_raises_typed_problems(
    served: ServedStack,
) -> None:
    def scenario() -> dict[str, Any]:
        with OutboxRest(served.url) as rest:
            first = rest.enqueue("restsync", served.email.name, EMAIL, idempotency_key="ada-1")
            again = rest.enqueue("restsync", served.email.name, EMAIL, idempotency_key="ada-1")
            with pytest.raises(Conflict) as conflict:
                rest.enqueue("restsync", served.email.name, {"other": 1}, idempotency_key="ada-1")
            with pytest.raises(NotFound) as missing:
                rest.get_item("restsync", "never-enqueued")
            with pytest.raises(Unprocessable) as invalid:
                rest.enqueue("restsync", served.email.name, EMAIL, priority=9)
            sent = wait_for_status(rest, "restsync", "ada-1", ItemStatus.SENT)
            events = rest.item_events("restsync", "ada-1")
        return locals()

    seen = await asyncio.to_thread(scenario)

    assert seen["first"].created is True and seen["first"].id == "outbox/restsync/ada-1"
    assert seen["first"].links.self == "/v1/outboxes/restsync/items/ada-1"
    assert seen["again"].created is False and seen["again"].id == seen["first"].id
    conflict = seen["conflict"].value
    assert conflict.status == 409 and conflict.type.endswith("/idempotency-conflict")
    assert conflict.title and conflict.detail and conflict.body["status"] == 409
    missing = seen["missing"].value
    assert missing.status == 404 and missing.type.endswith("/item-not-found")
    invalid = seen["invalid"].value
    assert invalid.status == 422 and invalid.errors
    assert [error["location"] for error in invalid.errors] == [["body", "priority"]]
    sent: Item = seen["sent"]
    assert sent.status == ItemStatus.SENT and sent.payload == EMAIL
    assert sent.created_at is not None and sent.created_at.tzinfo is not None
    assert [event.type for event in seen["events"]] == ["enqueued", "accepted", "sent"]


async def test_async_client_enqueues_reads_until_sent_and_raises_typed_problems(
    served: ServedStack,
) -> None:
    key = f"order {uuid.uuid4().hex[:6]}?paid#1:x"  # a path segment once percent-encoded
    async with AsyncOutboxRest(served.url, timeout=10) as rest:
        first = await rest.enqueue(
            "restasync", served.webhook.name, {"order": 42}, idempotency_key=key
        )
        with pytest.raises(Conflict) as conflict:
            await rest.enqueue("restasync", served.webhook.name, {"order": 43}, idempotency_key=key)
        with pytest.raises(NotFound) as unknown_destination:
            await rest.enqueue("restasync", "no-such-destination", {"order": 42})
        with pytest.raises(Unprocessable) as late_and_delayed:
            await rest.enqueue(
                "restasync",
                served.webhook.name,
                {},
                not_before=datetime.now(UTC) + timedelta(hours=1),
                delay_seconds=5,
            )
        sent = await wait_for_status_async(rest, "restasync", key, ItemStatus.SENT)

    assert first.created and first.key == key and first.status == ItemStatus.QUEUED
    assert conflict.value.status == 409 and isinstance(conflict.value, ProblemError)
    assert unknown_destination.value.type.endswith("/unknown-destination")
    assert late_and_delayed.value.status == 422
    assert "not both" in late_and_delayed.value.detail
    assert sent.status == ItemStatus.SENT and sent.key == key and sent.payload == {"order": 42}
    assert sent.source in ("workflow", "read-model")


async def test_a_batch_answers_each_item_and_a_retried_batch_enqueues_nothing_twice(
    served: ServedStack,
) -> None:
    items = [
        NewItem(destination=served.webhook.name, payload={"n": 1}, idempotency_key="b-1"),
        NewItem(destination=served.webhook.name, payload={"n": 2}),
        NewItem(destination=served.webhook.name, payload={"n": 3}, priority=0),
    ]
    async with AsyncOutboxRest(served.url) as rest:
        batch = await rest.enqueue_batch("restbatch", items)
        repeated = await rest.enqueue_batch("restbatch", items[:1])

    assert (batch.created, batch.existing, batch.failed) == (2, 0, 1)
    assert [result.status for result in batch.results] == [202, 202, 422]
    assert batch.results[0].item is not None and batch.results[0].item.key == "b-1"
    # A key the client generated rather than the API: a retry of this call sends the same one.
    generated = batch.results[1].item
    assert generated is not None and uuid.UUID(generated.key)
    problem = batch.results[2].problem
    assert problem is not None and problem.status == 422 and problem.errors
    assert (repeated.created, repeated.existing) == (0, 1)


async def test_pagination_yields_every_item_once_newest_first(served: ServedStack) -> None:
    outbox = f"restpages-{uuid.uuid4().hex[:6]}"
    keys = [f"p-{n}" for n in range(7)] + ["q-7"]
    async with AsyncOutboxRest(served.url) as rest:
        for key in keys:
            await rest.enqueue(outbox, served.webhook.name, {"key": key}, idempotency_key=key)
        for key in keys:
            await wait_for_status_async(rest, outbox, key, ItemStatus.SENT)
        first_page = await rest.list_items(outbox, limit=3)
        listed_async = [item.key async for item in rest.iter_items(outbox, page_size=3)]
        sent_only = [
            item.key async for item in rest.iter_items(outbox, status=ItemStatus.SENT, page_size=2)
        ]
        none_failed = [item async for item in rest.iter_items(outbox, status="failed")]
        prefixed = [item.key async for item in rest.iter_items(outbox, key_prefix="q-")]

    def listed_sync() -> list[str]:
        with OutboxRest(served.url) as rest:
            return [item.key for item in rest.iter_items(outbox, page_size=4)]

    def prefixed_sync() -> list[str]:
        with OutboxRest(served.url) as rest:
            return [item.key for item in rest.list_items(outbox, key_prefix="p-", limit=2).items]

    assert len(first_page.items) == 3 and first_page.next_cursor is not None
    assert listed_async == list(reversed(keys))
    assert await asyncio.to_thread(listed_sync) == list(reversed(keys))
    assert sent_only == list(reversed(keys)) and none_failed == []
    assert prefixed == ["q-7"] and await asyncio.to_thread(prefixed_sync) == ["p-6", "p-5"]


async def test_cancel_and_redrive_through_the_client(served: ServedStack) -> None:
    later = datetime.now(UTC) + timedelta(hours=2)
    async with AsyncOutboxRest(served.url) as rest:
        await rest.enqueue(
            "restcancel", served.webhook.name, {"n": 1}, idempotency_key="c-1", not_before=later
        )
        cancelled = await rest.cancel("restcancel", "c-1", reason="changed my mind")
        with pytest.raises(Conflict) as again:
            await rest.cancel("restcancel", "c-1")
        with pytest.raises(Conflict) as not_failed:
            await rest.redrive("restcancel", "c-1")

    assert not isinstance(cancelled, CancelRequested)
    assert cancelled.status == ItemStatus.CANCELLED
    assert again.value.type.endswith("/cannot-cancel")
    assert not_failed.value.type.endswith("/not-redrivable")
