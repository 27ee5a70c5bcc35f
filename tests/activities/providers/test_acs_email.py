"""AcsEmailProvider against the real fake provider, and the real Azure SDK as the referee."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from azure.communication.email import EmailClient
from azure.core.credentials import AzureKeyCredential
from durable_outbox_temporal.contract.item import OperationStatus, PollRequest, SubmitRequest

from activities.providers.acs_email import AcsEmailProvider
from activities.providers.base import PermanentProviderError
from configuration.providers import AcsEmailSettings
from configuration.tls import shared_tls_context
from devstack.fake_provider import FakeProvider
from tests.conftest import ACS_ACCESS_KEY

MESSAGE = {
    "senderAddress": "noreply@example.com",
    "recipients": {"to": [{"address": "ada@example.com"}]},
    "content": {"subject": "Hello", "plainText": "Hi"},
}


def new_key() -> str:
    return f"acs-{uuid.uuid4().hex}"


# Each key's first submit time, the same on every retry as the item workflow keeps it.
FIRST_SUBMITTED_AT: dict[str, datetime] = {}


def submit_request(
    key: str, attempt: int = 1, first_submitted_at: datetime | None = None
) -> SubmitRequest:
    return SubmitRequest(
        destination="email",
        item_id=f"outbox/t/{key}",
        idempotency_key=key,
        payload=MESSAGE,
        attempt=attempt,
        first_submitted_at=first_submitted_at
        or FIRST_SUBMITTED_AT.setdefault(key, datetime.now(UTC)),
    )


def poll_request(operation_url: str) -> PollRequest:
    return PollRequest(destination="email", item_id="outbox/t/x", operation_url=operation_url)


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(verify=shared_tls_context()) as client:
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


def recording_acs(
    answer: httpx.Response, seen: list[httpx.Request], **settings: Any
) -> AcsEmailProvider:
    """An ACS provider whose every request gets `answer` (a provider answering what the fake
    never would), with each request it sent in `seen`."""

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return answer

    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    acs_settings = AcsEmailSettings(
        endpoint="https://acs.example.com", access_key=ACS_ACCESS_KEY, **settings
    )
    return AcsEmailProvider(acs_settings, client)


@pytest.mark.parametrize(
    "location",
    [
        "https://evil.example.net/emails/operations/1",
        "http://acs.example.com/emails/operations/1",
        "https://acs.example.com:8443/emails/operations/1",
        "https://acs.example.com@evil.example.net/emails/operations/1",
        "https://acs.example.com.evil.example.net/emails/operations/1",
    ],
)
async def test_operation_location_on_another_host_or_scheme_is_permanent(location: str) -> None:
    seen: list[httpx.Request] = []
    provider = recording_acs(
        httpx.Response(202, json={"id": "1"}, headers={"Operation-Location": location}), seen
    )

    with pytest.raises(PermanentProviderError, match="not on the endpoint's host"):
        await provider.submit(submit_request(new_key()))
    with pytest.raises(PermanentProviderError, match="not on the endpoint's host"):
        await provider.poll(poll_request(location))

    # The send went to the endpoint; no signed poll ever went anywhere.
    assert [request.url.host for request in seen] == ["acs.example.com"]


@pytest.mark.parametrize(
    "location",
    ["https://ACS.example.com:443/emails/operations/1", "/emails/operations/1"],
)
async def test_operation_location_on_the_endpoint_is_followed(location: str) -> None:
    seen: list[httpx.Request] = []
    provider = recording_acs(
        httpx.Response(202, json={"id": "1"}, headers={"Operation-Location": location}), seen
    )

    result = await provider.submit(submit_request(new_key()))

    assert result.operation_url is not None
    assert httpx.URL(result.operation_url).host == "acs.example.com"


async def test_submit_and_poll_with_the_fake_stay_on_its_host(fake_provider, http) -> None:
    provider = acs_provider(fake_provider, http)

    accepted = await provider.submit(submit_request(new_key()))
    assert accepted.operation_url is not None
    polled = await provider.poll(poll_request(accepted.operation_url))

    assert polled.status in (OperationStatus.RUNNING, OperationStatus.SUCCEEDED)


@pytest.mark.parametrize("retry_after", ["300000000000", "999999999", "7201"])
async def test_retry_after_beyond_the_maximum_fails_the_send(
    fake_provider, http, retry_after: str
) -> None:
    settings = AcsEmailSettings(
        endpoint=fake_provider.url,
        access_key=ACS_ACCESS_KEY,
        max_retry_after_s=7200,
        headers={"X-Fake-Status": "429", "X-Fake-Retry-After": retry_after},
    )

    with pytest.raises(PermanentProviderError) as error:
        await AcsEmailProvider(settings, http).submit(submit_request(new_key()))

    assert error.value.status_code == 429
    assert f"provider asked to retry after {retry_after} s" in str(error.value)
    assert "beyond max_retry_after_s (7200 s)" in str(error.value)


async def test_a_polls_retry_after_beyond_the_maximum_fails_the_poll() -> None:
    seen: list[httpx.Request] = []
    provider = recording_acs(
        httpx.Response(200, json={"status": "Running"}, headers={"Retry-After": "3601"}),
        seen,
        max_retry_after_s=3600,
    )

    with pytest.raises(PermanentProviderError, match="retry after 3601 s, beyond"):
        await provider.poll(poll_request("https://acs.example.com/emails/operations/1"))
