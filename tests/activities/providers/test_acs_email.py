"""AcsEmailProvider against the real fake provider, and the real Azure SDK as the referee."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from azure.communication.email import EmailClient
from azure.core.credentials import AzureKeyCredential

from activities.providers.acs_email import AcsEmailProvider, AcsEmailSettings
from activities.providers.base import PermanentProviderError
from contract.item import OperationStatus, PollRequest, SubmitRequest
from devstack.fake_provider import FakeProvider
from tests.conftest import ACS_ACCESS_KEY

MESSAGE = {
    "senderAddress": "noreply@example.com",
    "recipients": {"to": [{"address": "ada@example.com"}]},
    "content": {"subject": "Hello", "plainText": "Hi"},
}


def new_key() -> str:
    return f"acs-{uuid.uuid4().hex}"


def submit_request(key: str) -> SubmitRequest:
    return SubmitRequest(
        destination="email",
        item_id=f"outbox/t/{key}",
        idempotency_key=key,
        payload=MESSAGE,
        attempt=1,
    )


def poll_request(operation_url: str) -> PollRequest:
    return PollRequest(destination="email", item_id="outbox/t/x", operation_url=operation_url)


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as client:
        yield client


def acs_provider(
    fake: FakeProvider, http: httpx.AsyncClient, access_key: str = ACS_ACCESS_KEY
) -> AcsEmailProvider:
    return AcsEmailProvider(AcsEmailSettings(endpoint=fake.url, access_key=access_key), http)


async def test_submit_is_accepted_as_an_operation_not_a_delivery(fake_provider, http) -> None:
    key = new_key()

    result = await acs_provider(fake_provider, http).submit(submit_request(key))

    assert result.delivered is False
    assert result.operation_url is not None
    assert result.operation_url.startswith(f"{fake_provider.url}/emails/operations/{key}")
    assert result.provider_message_id == key
    stats = await fake_provider.admin.key_stats(key)
    assert (stats["submits"], stats["deliveries"]) == (1, 1)


async def test_poll_sees_running_then_succeeded(fake_provider, http) -> None:
    key = new_key()
    provider = acs_provider(fake_provider, http)
    await fake_provider.admin.script(key, [{"running_polls": 1}])

    accepted = await provider.submit(submit_request(key))
    first = await provider.poll(poll_request(accepted.operation_url or ""))
    second = await provider.poll(poll_request(accepted.operation_url or ""))

    assert first.status is OperationStatus.RUNNING
    assert second.status is OperationStatus.SUCCEEDED
    assert second.error is None
    assert (await fake_provider.admin.key_stats(key))["polls"] == 2


async def test_same_idempotency_key_twice_is_one_delivery_and_one_operation(
    fake_provider, http
) -> None:
    key = new_key()
    provider = acs_provider(fake_provider, http)

    first = await provider.submit(submit_request(key))
    second = await provider.submit(submit_request(key))

    assert first.operation_url == second.operation_url
    stats = await fake_provider.admin.key_stats(key)
    assert (stats["submits"], stats["deliveries"]) == (2, 1)


async def test_wrong_access_key_is_a_permanent_401(fake_provider, http) -> None:
    key = new_key()
    provider = acs_provider(fake_provider, http, access_key="d3Jvbmcta2V5")

    with pytest.raises(PermanentProviderError, match="401") as error:
        await provider.submit(submit_request(key))

    assert error.value.status_code == 401
    assert (await fake_provider.admin.key_stats(key))["deliveries"] == 0


async def test_operation_that_fails_reports_failed_with_the_providers_message(
    fake_provider, http
) -> None:
    key = new_key()
    provider = acs_provider(fake_provider, http)
    await fake_provider.admin.script(key, [{"operation_result": "Failed"}])

    accepted = await provider.submit(submit_request(key))
    result = await provider.poll(poll_request(accepted.operation_url or ""))

    assert result.status is OperationStatus.FAILED
    assert result.error == "injected operation failure"


async def test_real_azure_sdk_is_accepted_and_its_poller_sees_succeeded(fake_provider) -> None:
    """If the fake rejected the SDK's signing, our provider could pass against a wrong fake.

    Built from endpoint + AzureKeyCredential: `from_connection_string` drops the scheme and the
    SDK then forces https, which a plain-http fake cannot answer.
    """
    client = EmailClient(fake_provider.url, AzureKeyCredential(ACS_ACCESS_KEY))
    key = new_key()
    await fake_provider.admin.script(key, [{"running_polls": 1}])

    def send() -> dict[str, Any]:
        with client:
            poller = client.begin_send(MESSAGE, operation_id=key, polling_interval=0.05)
            return dict(poller.result())

    result = await asyncio.to_thread(send)

    assert result["status"] == "Succeeded"
    assert result["id"] == key
    stats = await fake_provider.admin.key_stats(key)
    assert (stats["submits"], stats["deliveries"]) == (1, 1)
    assert stats["polls"] >= 2  # one Running answer, then Succeeded


async def test_real_azure_sdk_with_wrong_key_is_refused(fake_provider) -> None:
    client = EmailClient(fake_provider.url, AzureKeyCredential("d3Jvbmcta2V5"))
    key = new_key()

    def send() -> Any:
        with client:
            return client.begin_send(MESSAGE, operation_id=key, polling_interval=0.05).result()

    with pytest.raises(Exception, match="(?i)denied") as error:
        await asyncio.to_thread(send)

    assert getattr(error.value, "status_code", None) == 401
    assert (await fake_provider.admin.key_stats(key))["deliveries"] == 0
