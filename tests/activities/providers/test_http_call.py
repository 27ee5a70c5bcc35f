"""HttpCallProvider against the fake provider's payment API, which forgets a key as Stripe does."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from durable_outbox_temporal.contract.item import OperationStatus, PollRequest, SubmitRequest

from activities.providers.base import PermanentProviderError, TransientProviderError
from activities.providers.http_call import HttpCallProvider, idempotency_key_header
from configuration.providers import HttpCallSettings
from configuration.tls import shared_tls_context
from devstack.fake_payments import DECLINED_METHOD
from devstack.fake_provider import FakeProvider, FaultConfig, run_fake_provider
from tests.conftest import payment_destination

PAYMENT = {"amount": 2000, "currency": "eur", "payment_method": "pm_card_visa", "order": "o-1"}


def new_key() -> str:
    return str(uuid.uuid4())


def submit_request(
    key: str,
    payload: dict[str, Any] | None = None,
    attempt: int = 1,
    first_submitted_at: datetime | None = None,
) -> SubmitRequest:
    return SubmitRequest(
        destination="pay",
        item_id=f"outbox/t/{key}",
        idempotency_key=key,
        payload=PAYMENT if payload is None else payload,
        attempt=attempt,
        # A retry's first attempt was just now unless a test says otherwise (an unknown time
        # on a retry counts as past the window).
        first_submitted_at=first_submitted_at or datetime.now(UTC),
    )


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(verify=shared_tls_context()) as client:
        yield client


def payment_provider(
    fake: FakeProvider, http: httpx.AsyncClient, **settings: Any
) -> HttpCallProvider:
    destination = payment_destination(fake, settings=settings)
    return HttpCallProvider(destination.settings_as(HttpCallSettings), http)


async def payments(fake: FakeProvider, key: str) -> int:
    return sum(1 for entry in await fake.admin.deliveries("payments") if entry["key"] == key)


async def test_a_payment_is_made_once_however_often_it_is_retried_within_the_window(
    fake_provider, http
) -> None:
    provider, key = payment_provider(fake_provider, http), new_key()

    first = await provider.submit(submit_request(key))
    again = await provider.submit(submit_request(key, attempt=2))

    assert first.delivered is True and first.provider_message_id.startswith("pay_")
    assert again.provider_message_id == first.provider_message_id  # the first answer, replayed
    assert await payments(fake_provider, key) == 1


async def test_the_key_goes_as_a_structured_field_string_with_the_credentials(http) -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"id": "pay_1"})

    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    settings = HttpCallSettings(
        url="https://pay.test/v1/accounts/{payload.account}/charges",
        method="PUT",
        auth="basic",
        username="acct",
        password="s3cret",
    )
    key = new_key()
    await HttpCallProvider(settings, client).submit(
        submit_request(key, {"account": "a/b", "amount": 1})
    )

    (request,) = seen
    assert request.method == "PUT"
    assert request.url.raw_path == b"/v1/accounts/a%2Fb/charges"
    assert request.headers["Idempotency-Key"] == f'"{key}"'
    assert request.headers["Authorization"] == "Basic YWNjdDpzM2NyZXQ="
    assert json.loads(request.content) == {"account": "a/b", "amount": 1}
    assert idempotency_key_header('a"b\\') == '"a\\"b\\\\"'
    await client.aclose()


async def test_the_same_key_with_another_body_is_a_permanent_failure_naming_the_key(
    fake_provider, http
) -> None:
    provider, key = payment_provider(fake_provider, http), new_key()
    await provider.submit(submit_request(key))

    with pytest.raises(PermanentProviderError, match=f"Idempotency-Key {key} was first used"):
        await provider.submit(submit_request(key, {**PAYMENT, "amount": 9999}, attempt=2))

    assert await payments(fake_provider, key) == 1


async def test_a_declined_card_is_a_permanent_failure_with_the_providers_code(
    fake_provider, http
) -> None:
    provider, key = payment_provider(fake_provider, http), new_key()

    with pytest.raises(PermanentProviderError, match="HTTP 402") as declined:
        await provider.submit(submit_request(key, {**PAYMENT, "payment_method": DECLINED_METHOD}))

    assert declined.value.status_code == 402 and declined.value.error_code == "card_declined"
    assert await payments(fake_provider, key) == 0


async def test_a_wrong_token_is_permanent_and_no_error_or_log_line_carries_a_token(
    fake_provider, http, caplog
) -> None:
    caplog.set_level(logging.DEBUG)
    provider = payment_provider(fake_provider, http, token="sk_wrong_token")

    with pytest.raises(PermanentProviderError, match="HTTP 401") as refused:
        await provider.submit(submit_request(new_key()))

    assert "sk_wrong_token" not in str(refused.value)
    assert "sk_wrong_token" not in caplog.text
    assert fake_provider.state.payment_token not in caplog.text


async def test_a_lost_answer_retried_past_the_window_is_found_by_the_lookup_not_paid_twice(
    http,
) -> None:
    async with run_fake_provider(FaultConfig(payment_key_window_s=0.2)) as fake:
        provider, key = payment_provider(fake, http, idempotency_window_s=0.2), new_key()
        await fake.admin.script(key, [{"drop_response": True}])
        first_at = datetime.now(UTC)
        with pytest.raises(TransientProviderError):
            await provider.submit(submit_request(key, first_submitted_at=first_at))
        await asyncio.sleep(0.3)  # the fake's window is wall-clock time, as Stripe's is

        found = await provider.submit(submit_request(key, attempt=2, first_submitted_at=first_at))

        assert found.delivered is True and found.found_by_lookup is True
        assert found.provider_message_id.startswith("pay_")
        assert await payments(fake, key) == 1


async def test_without_a_status_url_the_same_retry_pays_twice(http) -> None:
    """What the lookup prevents, and proof that the fake forgets a key."""
    async with run_fake_provider(FaultConfig(payment_key_window_s=0.2)) as fake:
        provider = payment_provider(fake, http, idempotency_window_s=0.2, status_url=None)
        key = new_key()
        await fake.admin.script(key, [{"drop_response": True}])
        first_at = datetime.now(UTC)
        with pytest.raises(TransientProviderError):
            await provider.submit(submit_request(key, first_submitted_at=first_at))
        await asyncio.sleep(0.3)

        await provider.submit(submit_request(key, attempt=2, first_submitted_at=first_at))

        assert await payments(fake, key) == 2


async def test_within_the_window_no_lookup_is_made(fake_provider, http) -> None:
    provider, key = payment_provider(fake_provider, http), new_key()
    recent = datetime.now(UTC) - timedelta(minutes=5)

    result = await provider.submit(submit_request(key, attempt=2, first_submitted_at=recent))

    assert result.found_by_lookup is False
    assert await payments(fake_provider, key) == 1


async def test_a_long_running_payment_is_polled_to_its_end(fake_provider, http) -> None:
    provider, key = payment_provider(fake_provider, http, poll_operations=True), new_key()
    await fake_provider.admin.script(key, [{"running_polls": 1}])

    accepted = await provider.submit(submit_request(key))
    assert accepted.delivered is False and accepted.operation_url is not None
    assert accepted.retry_after_s == 1.0
    poll = PollRequest(destination="pay", item_id="x", operation_url=accepted.operation_url)
    running = await provider.poll(poll)
    ended = await provider.poll(poll)

    assert (running.status, running.retry_after_s) == (OperationStatus.RUNNING, 1.0)
    assert ended.status is OperationStatus.SUCCEEDED


async def test_an_operation_on_another_origin_is_not_followed_with_the_credentials(http) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(202, headers={"Location": "https://elsewhere.test/op/1"})

    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    settings = HttpCallSettings(
        url="https://pay.test/charges", auth="bearer", token="t", poll_operations=True
    )

    with pytest.raises(PermanentProviderError, match="not on the destination's origin"):
        await HttpCallProvider(settings, client).submit(submit_request(new_key()))
    await client.aclose()


async def test_a_body_over_the_limit_fails_permanently(fake_provider, http) -> None:
    provider = payment_provider(fake_provider, http, max_body_bytes=50)

    with pytest.raises(PermanentProviderError, match="over max_body_bytes"):
        await provider.submit(submit_request(new_key(), {**PAYMENT, "note": "x" * 50}))


async def test_probe_sends_nothing(fake_provider, http) -> None:
    before = await fake_provider.admin.deliveries("payments")

    answer = await payment_provider(fake_provider, http).probe()

    assert answer.startswith("HTTP ")
    assert await fake_provider.admin.deliveries("payments") == before
