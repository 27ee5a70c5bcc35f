"""AcsEmailProvider's repeatable requests and reconcile step, at the fake and at a mock ACS."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from email.utils import formatdate

import httpx
import pytest
from durable_outbox_temporal.contract.item import OperationStatus, PollRequest, SubmitRequest

from activities.providers.acs_email import AcsEmailProvider
from activities.providers.base import PermanentProviderError, TransientProviderError
from configuration.providers import AcsEmailSettings
from configuration.tls import shared_tls_context
from devstack.fake_provider import FakeProvider, FaultConfig, run_fake_provider
from tests.conftest import ACS_ACCESS_KEY

FIRST_SENT = "Repeatability-First-Sent"
MESSAGE = {
    "senderAddress": "noreply@example.com",
    "recipients": {"to": [{"address": "ada@example.com"}]},
    "content": {"subject": "Hello", "plainText": "Hi"},
}


def request(key: str, first_submitted_at: datetime | None, attempt: int = 1) -> SubmitRequest:
    return SubmitRequest(
        destination="email",
        item_id=f"outbox/t/{key}",
        idempotency_key=key,
        payload=MESSAGE,
        attempt=attempt,
        first_submitted_at=first_submitted_at,
    )


@pytest.fixture
async def fake() -> AsyncIterator[FakeProvider]:
    async with run_fake_provider(FaultConfig()) as fake:
        yield fake


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(verify=shared_tls_context()) as client:
        yield client


def provider(fake: FakeProvider, http: httpx.AsyncClient) -> AcsEmailProvider:
    return AcsEmailProvider(AcsEmailSettings(endpoint=fake.url, access_key=ACS_ACCESS_KEY), http)


async def test_a_lost_answer_retried_within_the_window_is_the_same_send(fake, http) -> None:
    key, first = str(uuid.uuid4()), datetime.now(UTC)
    await fake.admin.script(key, [{"drop_response": True}])
    acs = provider(fake, http)

    with pytest.raises(TransientProviderError, match="connection failed"):
        await acs.submit(request(key, first))
    retried = await acs.submit(request(key, first, attempt=2))

    assert retried.operation_url is not None and key in retried.operation_url
    stats = await fake.admin.key_stats(key)
    assert (stats["submits"], stats["deliveries"]) == (2, 1)


async def test_a_lost_answer_retried_past_the_window_is_adopted_not_sent_again(fake, http) -> None:
    """The item's first submit waited beyond the window (a paused queue, say), so every attempt
    is past it: the first finds nothing and sends; the retry finds that send and adopts it."""
    key = str(uuid.uuid4())
    first = datetime.now(UTC) - timedelta(seconds=301)
    await fake.admin.script(key, [{"drop_response": True}])
    acs = provider(fake, http)

    with pytest.raises(TransientProviderError):
        await acs.submit(request(key, first))
    adopted = await acs.submit(request(key, first, attempt=2))

    assert adopted.delivered is False and adopted.found_by_lookup is True
    assert adopted.operation_url == f"{fake.url}/emails/operations/{key}?api-version=2023-03-31"
    assert adopted.recipients == ["ada@example.com"]
    stats = await fake.admin.key_stats(key)
    assert (stats["submits"], stats["deliveries"]) == (1, 1)
    polled = await acs.poll(
        PollRequest(destination="email", item_id=key, operation_url=adopted.operation_url)
    )
    assert polled.status is OperationStatus.SUCCEEDED


async def test_without_the_reconcile_step_a_retry_past_the_window_is_a_412(fake, http) -> None:
    """The naive retry the reconcile step replaces: the first send's request again."""
    key = str(uuid.uuid4())
    acs = provider(fake, http)
    acs.reconcile = False

    with pytest.raises(PermanentProviderError, match="412") as error:
        await acs.submit(request(key, datetime.now(UTC) - timedelta(seconds=301), attempt=2))

    assert error.value.status_code == 412


async def test_every_retry_carries_the_first_sends_headers(http) -> None:
    seen: list[httpx.Request] = []
    acs = mock_acs(seen, lambda request: accepted())
    first = datetime.now(UTC) - timedelta(seconds=30)
    key = str(uuid.uuid4())

    for attempt in (1, 2, 3):
        await acs.submit(request(key, first, attempt))

    headers = {
        tuple(r.headers[name] for name in ("Operation-Id", "Repeatability-Request-Id", FIRST_SENT))
        for r in seen
    }
    assert len(seen) == 3 and len(headers) == 1
    operation_id, request_id, first_sent = headers.pop()
    assert operation_id == key
    assert uuid.UUID(request_id)
    # The item's first submit time, never the retrying process's clock.
    assert first_sent == formatdate(first.timestamp(), usegmt=True)


def accepted() -> httpx.Response:
    return httpx.Response(
        202, json={"id": "op"}, headers={"Operation-Location": "/emails/operations/op"}
    )


def mock_acs(seen: list[httpx.Request], answer: object) -> AcsEmailProvider:
    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return answer(request)  # type: ignore[operator]

    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    settings = AcsEmailSettings(endpoint="https://acs.example.com", access_key=ACS_ACCESS_KEY)
    return AcsEmailProvider(settings, client)


async def test_a_412_is_reconciled_by_adopting_the_operation_it_finds() -> None:
    """ACS's clock ahead of ours: we think the first send is within the window, ACS does not."""
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            return httpx.Response(412, json={"error": {"code": "PreconditionFailed"}})
        return httpx.Response(200, json={"id": "op-1", "status": "Succeeded"})

    acs = mock_acs(seen, answer)

    adopted = await acs.submit(request("op-1", datetime.now(UTC), attempt=2))

    assert [(r.method, r.url.path) for r in seen] == [
        ("POST", "/emails:send"),
        ("GET", "/emails/operations/op-1"),
    ]
    assert adopted.provider_message_id == "op-1"
    assert (
        adopted.operation_url
        == "https://acs.example.com/emails/operations/op-1?api-version=2023-03-31"
    )


async def test_a_412_with_no_trace_of_the_operation_is_sent_anew() -> None:
    seen: list[httpx.Request] = []
    first = datetime.now(UTC)

    def answer(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            return httpx.Response(404, json={"error": {"code": "NotFound"}})
        if len(seen) == 1:
            return httpx.Response(412, json={"error": {"code": "PreconditionFailed"}})
        return accepted()

    acs = mock_acs(seen, answer)

    result = await acs.submit(request("op-2", first, attempt=2))

    assert [r.method for r in seen] == ["POST", "GET", "POST"]
    original, anew = seen[0].headers, seen[2].headers
    assert original["Repeatability-First-Sent"] == formatdate(first.timestamp(), usegmt=True)
    # A request of its own: the first one's id would be a mismatch where ACS still tracks it.
    assert anew["Repeatability-Request-Id"] != original["Repeatability-Request-Id"]
    assert anew["Operation-Id"] == original["Operation-Id"] == "op-2"
    assert result.operation_url is not None


async def test_a_repeat_of_a_send_still_in_progress_is_transient() -> None:
    acs = mock_acs([], lambda request: httpx.Response(409, headers={"Retry-After": "2"}))

    with pytest.raises(TransientProviderError, match="still in progress") as error:
        await acs.submit(request("op-3", datetime.now(UTC)))

    assert (error.value.status_code, error.value.retry_after_s) == (409, 2.0)


async def test_a_lookup_that_fails_is_transient_not_a_send() -> None:
    seen: list[httpx.Request] = []
    acs = mock_acs(seen, lambda request: httpx.Response(503))

    with pytest.raises(TransientProviderError, match="lookup"):
        await acs.submit(request("op-4", datetime.now(UTC) - timedelta(hours=1), attempt=2))

    assert [r.method for r in seen] == ["GET"]
