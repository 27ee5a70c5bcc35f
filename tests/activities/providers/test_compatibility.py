"""The referees: the real Azure SDK talks to our fake, and the real Standard Webhooks library
verifies our signatures. If either disagrees, our providers would fail against real services."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
import standardwebhooks
from azure.communication.email import EmailClient
from azure.core.credentials import AzureKeyCredential

from activities.providers.acs_email import AcsEmailProvider
from activities.providers.base import PermanentProviderError
from activities.providers.webhook import WebhookProvider
from common.models import OperationStatus, PollRequest, SubmitRequest
from tests.conftest import ACS_ACCESS_KEY, WEBHOOK_SECRET

MESSAGE = {
    "senderAddress": "noreply@example.com",
    "recipients": {"to": [{"address": "ada@example.com"}]},
    "content": {"subject": "Hello", "plainText": "Hi"},
}


def request(key: str, payload: dict | None = None) -> SubmitRequest:
    return SubmitRequest(
        destination="d",
        item_id=f"outbox/t/{key}",
        idempotency_key=key,
        payload=payload or MESSAGE,
        attempt=1,
    )


async def test_real_azure_sdk_sends_through_the_fake_and_sees_succeeded(fake_provider) -> None:
    client = EmailClient(fake_provider.url, AzureKeyCredential(ACS_ACCESS_KEY))

    def send() -> dict:
        with client:
            return client.begin_send(MESSAGE, polling_interval=0.05).result()

    result = await asyncio.to_thread(send)

    assert result["status"] == "Succeeded"
    stats = await fake_provider.admin.stats()
    assert stats["totals"]["deliveries"] >= 1


async def test_azure_sdk_with_wrong_key_is_rejected(fake_provider) -> None:
    client = EmailClient(fake_provider.url, AzureKeyCredential("d3Jvbmcta2V5"))

    with pytest.raises(Exception, match="(?i)denied|401|unauthori"), client:
        await asyncio.to_thread(lambda: client.begin_send(MESSAGE).result())


async def test_our_acs_requests_pass_the_fakes_signature_check(fake_provider) -> None:
    async with httpx.AsyncClient() as http:
        provider = AcsEmailProvider(
            {"endpoint": fake_provider.url, "access_key": ACS_ACCESS_KEY}, http
        )
        await fake_provider.admin.script("acs-ok", [{"running_polls": 1}])
        accepted = await provider.submit(request("acs-ok"))
        first = await provider.poll(PollRequest("d", "i", accepted.operation_url or ""))
        second = await provider.poll(PollRequest("d", "i", accepted.operation_url or ""))
        again = await provider.submit(request("acs-ok"))

    assert accepted.delivered is False and accepted.operation_url
    assert (first.status, second.status) == (OperationStatus.RUNNING, OperationStatus.SUCCEEDED)
    assert again.operation_url == accepted.operation_url
    assert (await fake_provider.admin.key_stats("acs-ok"))["deliveries"] == 1


async def test_acs_request_signed_with_another_key_is_refused(fake_provider) -> None:
    async with httpx.AsyncClient() as http:
        provider = AcsEmailProvider(
            {"endpoint": fake_provider.url, "access_key": "b3RoZXIta2V5"}, http
        )
        with pytest.raises(PermanentProviderError, match="401"):
            await provider.submit(request("acs-bad-key"))


async def test_operation_failure_carries_the_providers_error(fake_provider) -> None:
    async with httpx.AsyncClient() as http:
        provider = AcsEmailProvider(
            {"endpoint": fake_provider.url, "access_key": ACS_ACCESS_KEY}, http
        )
        await fake_provider.admin.script("acs-fails", [{"operation_result": "Failed"}])
        accepted = await provider.submit(request("acs-fails"))
        result = await provider.poll(PollRequest("d", "i", accepted.operation_url or ""))

    assert result.status is OperationStatus.FAILED
    assert result.error == "injected operation failure"


async def test_our_webhook_signature_verifies_with_standardwebhooks() -> None:
    captured: list[httpx.Request] = []

    def receiver(http_request: httpx.Request) -> httpx.Response:
        captured.append(http_request)
        return httpx.Response(204)

    async with httpx.AsyncClient(transport=httpx.MockTransport(receiver)) as http:
        provider = WebhookProvider(
            {"url": "https://example.test/hook", "secret": WEBHOOK_SECRET}, http
        )
        result = await provider.submit(request("msg-1", {"event": "order.paid", "amount": 12.5}))

    sent = captured[0]
    verified = standardwebhooks.Webhook(WEBHOOK_SECRET).verify(sent.content, dict(sent.headers))
    assert result.delivered is True
    assert verified == {"event": "order.paid", "amount": 12.5}
    assert sent.headers["webhook-id"] == "msg-1"
    with pytest.raises(standardwebhooks.webhooks.WebhookVerificationError):
        tampered = json.dumps({"event": "order.paid", "amount": 99}).encode()
        standardwebhooks.Webhook(WEBHOOK_SECRET).verify(tampered, dict(sent.headers))
