"""The example receiver driven by the outbox's own webhook provider: real signed deliveries,
retried under one `webhook-id`, handled once."""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from durable_outbox_temporal.contract.item import SubmitRequest
from standardwebhooks import Webhook

from activities.providers.base import PermanentProviderError, TransientProviderError
from activities.providers.webhook import WebhookProvider
from configuration.providers import WebhookSettings
from examples.webhook_receiver.receiver import WebhookInbox, create_app, record_event

SECRET = "whsec_ZXhhbXBsZS1yZWNlaXZlci1zZWNyZXQ="
URL = "http://receiver.test/webhooks"


def delivery(key: str, payload: dict[str, Any], attempt: int = 1) -> SubmitRequest:
    return SubmitRequest(
        destination="hooks",
        item_id=f"outbox/t/{key}",
        idempotency_key=key,
        payload=payload,
        attempt=attempt,
    )


@pytest.fixture
def inbox(tmp_path: Path) -> WebhookInbox:
    return WebhookInbox(tmp_path / "webhooks.sqlite3")


@pytest.fixture
async def receiver(inbox: WebhookInbox) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=create_app(SECRET, inbox), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport) as client:
        yield client


def provider(client: httpx.AsyncClient, secret: str = SECRET, **settings: Any) -> WebhookProvider:
    return WebhookProvider(WebhookSettings(url=URL, secret=secret, **settings), client)


def events(inbox: WebhookInbox) -> list[tuple[str, str]]:
    return inbox.db.execute("SELECT webhook_id, payload FROM events").fetchall()


async def test_a_retried_webhook_is_handled_once(
    receiver: httpx.AsyncClient, inbox: WebhookInbox
) -> None:
    sender, key = provider(receiver), str(uuid.uuid4())

    first = await sender.submit(delivery(key, {"booking": "b-1"}))
    again = await sender.submit(delivery(key, {"booking": "b-1"}, attempt=2))

    assert first.delivered and again.delivered  # a repeat is answered 2xx: no more retries
    assert events(inbox) == [(key, '{"booking": "b-1"}')]


async def test_each_message_is_handled(receiver: httpx.AsyncClient, inbox: WebhookInbox) -> None:
    sender = provider(receiver)

    for booking in ("b-1", "b-2"):
        await sender.submit(delivery(str(uuid.uuid4()), {"booking": booking}))

    assert len(events(inbox)) == 2


async def test_a_delivery_signed_with_another_secret_is_refused(
    receiver: httpx.AsyncClient, inbox: WebhookInbox
) -> None:
    sender = provider(receiver, secret="whsec_b3RoZXItc2VjcmV0")

    with pytest.raises(PermanentProviderError, match="HTTP 401"):
        await sender.submit(delivery(str(uuid.uuid4()), {"booking": "b-1"}))

    assert events(inbox) == []


async def test_during_a_rotation_a_receiver_with_the_old_secret_still_verifies(
    receiver: httpx.AsyncClient, inbox: WebhookInbox
) -> None:
    sender = provider(
        receiver,
        secret="whsec_bmV3LXJlY2VpdmVyLXNlY3JldA==",
        previous_secret=SECRET,
        previous_secret_until=datetime.now(UTC) + timedelta(hours=1),
    )

    await sender.submit(delivery(str(uuid.uuid4()), {"booking": "b-1"}))

    assert len(events(inbox)) == 1


async def test_a_tampered_body_or_an_old_timestamp_is_refused(
    receiver: httpx.AsyncClient, inbox: WebhookInbox
) -> None:
    signer, key, body = Webhook(SECRET), str(uuid.uuid4()), '{"amount":1}'
    now = datetime.now(UTC)
    tampered = {
        "webhook-id": key,
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": signer.sign(key, now, body),
    }
    old = now - timedelta(minutes=10)
    stale = {
        "webhook-id": key,
        "webhook-timestamp": str(int(old.timestamp())),
        "webhook-signature": signer.sign(key, old, body),
    }

    assert (await receiver.post(URL, content='{"amount":100}', headers=tampered)).status_code == 401
    assert (await receiver.post(URL, content=body, headers=stale)).status_code == 401
    assert (await receiver.post(URL, content=body, headers={})).status_code == 401
    assert events(inbox) == []


async def test_a_handler_that_fails_leaves_the_id_unseen_so_the_retry_handles_it(
    inbox: WebhookInbox,
) -> None:
    failures = [RuntimeError("database down")]

    def flaky(db: sqlite3.Connection, message_id: str, payload: Any) -> None:
        record_event(db, message_id, payload)
        if failures:
            raise failures.pop()

    app = create_app(SECRET, inbox, flaky)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport) as client:
        sender, key = provider(client), str(uuid.uuid4())
        with pytest.raises(TransientProviderError, match="HTTP 500"):
            await sender.submit(delivery(key, {"booking": "b-1"}))
        await sender.submit(delivery(key, {"booking": "b-1"}, attempt=2))

    assert events(inbox) == [(key, '{"booking": "b-1"}')]
