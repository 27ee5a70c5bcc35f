"""WebhookProvider: signatures the real Standard Webhooks library accepts, and every outcome."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
import standardwebhooks
from durable_outbox_temporal.contract.item import SubmitRequest
from pydantic import ValidationError
from standardwebhooks.webhooks import WebhookVerificationError

from activities.providers.base import (
    EndpointGoneError,
    PermanentProviderError,
    TransientProviderError,
)
from activities.providers.webhook import WebhookProvider
from configuration.providers import WebhookSettings
from configuration.tls import shared_tls_context
from devstack.fake_provider import FakeProvider, FaultConfig, run_fake_provider
from tests.conftest import WEBHOOK_SECRET
from tests.ports import free_port

PAYLOAD = {"event": "order.paid", "amount": 12.5}


def new_key() -> str:
    return f"wh-{uuid.uuid4().hex}"


def submit_request(key: str, payload: dict[str, Any] | None = None) -> SubmitRequest:
    return SubmitRequest(
        destination="hook",
        item_id=f"outbox/t/{key}",
        idempotency_key=key,
        payload=payload or PAYLOAD,
        attempt=1,
    )


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(verify=shared_tls_context()) as client:
        yield client


def webhook_at(http: httpx.AsyncClient, url: str, **settings: Any) -> WebhookProvider:
    return WebhookProvider(WebhookSettings(url=url, secret=WEBHOOK_SECRET, **settings), http)


def fake_webhook(
    fake: FakeProvider, http: httpx.AsyncClient, **fake_headers: str
) -> WebhookProvider:
    return webhook_at(http, f"{fake.url}/webhook/{uuid.uuid4().hex}", headers=fake_headers)


async def captured_request() -> tuple[httpx.Request, bool]:
    captured: list[httpx.Request] = []

    def receiver(request: httpx.Request) -> httpx.Response:
        captured.append(request)
        return httpx.Response(204)

    async with httpx.AsyncClient(transport=httpx.MockTransport(receiver)) as client:
        result = await webhook_at(client, "https://receiver.test/hook").submit(
            submit_request("msg-1")
        )
    return captured[0], result.delivered


async def test_signature_verifies_with_the_real_standardwebhooks_library() -> None:
    sent, delivered = await captured_request()

    verified = standardwebhooks.Webhook(WEBHOOK_SECRET).verify(sent.content, dict(sent.headers))

    assert delivered is True
    assert verified == PAYLOAD
    assert sent.headers["webhook-id"] == "msg-1"
    assert sent.headers["content-type"] == "application/json"


async def test_tampered_body_fails_verification() -> None:
    sent, _ = await captured_request()
    tampered = json.dumps({**PAYLOAD, "amount": 99}).encode()

    with pytest.raises(WebhookVerificationError):
        standardwebhooks.Webhook(WEBHOOK_SECRET).verify(tampered, dict(sent.headers))


async def test_2xx_from_the_fake_is_delivered(fake_provider, http) -> None:
    key = new_key()

    result = await fake_webhook(fake_provider, http).submit(submit_request(key))

    assert result.delivered is True and result.operation_url is None
    assert result.provider_message_id == key
    assert (await fake_provider.admin.key_stats(key))["deliveries"] == 1


async def test_same_webhook_id_twice_is_delivered_once(fake_provider, http) -> None:
    key = new_key()
    provider = fake_webhook(fake_provider, http)

    first = await provider.submit(submit_request(key))
    second = await provider.submit(submit_request(key))

    assert first.delivered and second.delivered
    stats = await fake_provider.admin.key_stats(key)
    assert (stats["submits"], stats["deliveries"]) == (2, 1)


async def test_410_says_the_endpoint_is_gone_and_names_it_without_secrets(
    fake_provider, http
) -> None:
    path = f"webhook/{uuid.uuid4().hex}"
    await fake_provider.admin.set_endpoint_fault(path.removeprefix("webhook/"), status=410)
    base = fake_provider.url.replace("http://", "http://user:password@")
    provider = webhook_at(http, f"{base}/{path}?token=secret")

    with pytest.raises(EndpointGoneError, match="410 Gone.*disabled this endpoint") as error:
        await provider.submit(submit_request(new_key()))

    assert error.value.status_code == 410
    # The URL goes into the destination's pause reason, which operators read: no credentials.
    assert error.value.endpoint == f"{fake_provider.url}/{path}"


async def test_400_is_permanent(fake_provider, http) -> None:
    provider = fake_webhook(fake_provider, http, **{"X-Fake-Status": "400"})

    with pytest.raises(PermanentProviderError) as error:
        await provider.submit(submit_request(new_key()))

    assert error.value.status_code == 400
    assert not isinstance(error.value, TransientProviderError)


async def test_429_is_transient_and_carries_retry_after(fake_provider, http) -> None:
    provider = fake_webhook(
        fake_provider, http, **{"X-Fake-Status": "429", "X-Fake-Retry-After": "7"}
    )

    with pytest.raises(TransientProviderError) as error:
        await provider.submit(submit_request(new_key()))

    assert (error.value.status_code, error.value.retry_after_s) == (429, 7.0)


async def test_503_is_transient(fake_provider, http) -> None:
    key = new_key()
    provider = fake_webhook(fake_provider, http, **{"X-Fake-Status": "503"})

    with pytest.raises(TransientProviderError) as error:
        await provider.submit(submit_request(key))

    assert error.value.status_code == 503 and error.value.retry_after_s is None
    assert (await fake_provider.admin.key_stats(key))["deliveries"] == 0


async def test_closed_port_is_a_transient_connection_error(http) -> None:
    port = free_port()
    provider = webhook_at(http, f"http://127.0.0.1:{port}/hook")

    with pytest.raises(TransientProviderError, match="connection failed") as error:
        await provider.submit(submit_request(new_key()))

    assert error.value.status_code is None


async def test_hung_request_past_timeout_is_a_transient_timeout(fake_provider, http) -> None:
    provider = webhook_at(
        http,
        f"{fake_provider.url}/webhook/{uuid.uuid4().hex}",
        headers={"X-Fake-Hang-S": "5"},
        timeout_s=0.2,
    )

    with pytest.raises(TransientProviderError, match="timed out"):
        await provider.submit(submit_request(new_key()))


NEW_SECRET = "whsec_bmV3LXdlYmhvb2stc2lnbmluZy1zZWNyZXQ="


async def sent_while_rotating(until: datetime) -> httpx.Request:
    """A message signed by a provider rotating from WEBHOOK_SECRET to NEW_SECRET until `until`."""
    captured: list[httpx.Request] = []

    def receiver(request: httpx.Request) -> httpx.Response:
        captured.append(request)
        return httpx.Response(204)

    settings = WebhookSettings(
        url="https://receiver.test/hook",
        secret=NEW_SECRET,
        previous_secret=WEBHOOK_SECRET,
        previous_secret_until=until,
    )
    async with httpx.AsyncClient(transport=httpx.MockTransport(receiver)) as client:
        await WebhookProvider(settings, client).submit(submit_request(new_key()))
    return captured[0]


async def test_during_the_grace_window_old_and_new_receivers_both_verify() -> None:
    sent = await sent_while_rotating(datetime.now(UTC) + timedelta(hours=1))

    assert len(sent.headers["webhook-signature"].split(" ")) == 2
    for secret in (WEBHOOK_SECRET, NEW_SECRET):
        verified = standardwebhooks.Webhook(secret).verify(sent.content, dict(sent.headers))
        assert verified == PAYLOAD


async def test_after_the_grace_window_only_the_new_secret_verifies() -> None:
    sent = await sent_while_rotating(datetime.now(UTC) - timedelta(seconds=1))

    assert len(sent.headers["webhook-signature"].split(" ")) == 1
    verified = standardwebhooks.Webhook(NEW_SECRET).verify(sent.content, dict(sent.headers))
    assert verified == PAYLOAD
    with pytest.raises(WebhookVerificationError):
        standardwebhooks.Webhook(WEBHOOK_SECRET).verify(sent.content, dict(sent.headers))


async def test_the_fake_verifying_with_the_old_secret_accepts_during_the_window(
    fake_provider, http
) -> None:
    key = new_key()
    settings = WebhookSettings(
        url=f"{fake_provider.url}/webhook/{uuid.uuid4().hex}",
        secret=NEW_SECRET,
        previous_secret=WEBHOOK_SECRET,
        previous_secret_until=datetime.now(UTC) + timedelta(hours=1),
    )

    result = await WebhookProvider(settings, http).submit(submit_request(key))

    assert result.delivered is True
    assert (await fake_provider.admin.key_stats(key))["deliveries"] == 1


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"previous_secret": WEBHOOK_SECRET}, "go together"),
        ({"previous_secret_until": "2026-12-01T12:00:00Z"}, "go together"),
        (
            {"previous_secret": WEBHOOK_SECRET, "previous_secret_until": "2026-12-01T12:00:00"},
            "timezone",
        ),
        (
            {"previous_secret": "not base64!", "previous_secret_until": "2026-12-01T12:00Z"},
            "whsec_",
        ),
        (
            {"previous_secret": NEW_SECRET, "previous_secret_until": "2026-12-01T12:00:00Z"},
            "same as secret",
        ),
    ],
)
def test_a_grace_window_needs_both_fields_an_offset_and_another_secret(
    fields: dict[str, Any], problem: str
) -> None:
    with pytest.raises(ValidationError, match=problem):
        WebhookSettings(url="https://receiver.test/hook", secret=NEW_SECRET, **fields)


async def test_retry_after_beyond_the_maximum_fails_the_webhook(fake_provider, http) -> None:
    provider = fake_webhook(
        fake_provider, http, **{"X-Fake-Status": "503", "X-Fake-Retry-After": "300000000000"}
    )

    with pytest.raises(PermanentProviderError, match="retry after 300000000000 s, beyond"):
        await provider.submit(submit_request(new_key()))


@pytest.mark.parametrize(("window_s", "delivered"), [(300.0, 1), (0.0, 2)])
async def test_a_lost_answer_retried_is_once_within_the_receivers_window_and_again_after(
    http, window_s: float, delivered: int
) -> None:
    """Webhooks have no reconcile step: past the receiver's dedupe window a retry of a send
    whose answer was lost is a second delivery (docs/explanation/provider-dedupe.md)."""
    async with run_fake_provider(FaultConfig(webhook_dedupe_window_s=window_s)) as fake:
        key = new_key()
        await fake.admin.script(key, [{"drop_response": True}])
        provider = fake_webhook(fake, http)

        with pytest.raises(TransientProviderError, match="connection failed"):
            await provider.submit(submit_request(key))
        retried = await provider.submit(submit_request(key))

        assert retried.delivered is True
        stats = await fake.admin.key_stats(key)
        assert (stats["submits"], stats["deliveries"]) == (2, delivered)
