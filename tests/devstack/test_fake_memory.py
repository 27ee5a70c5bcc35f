"""The fake remembers a request only as long as the real service does, and can lose an answer."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from email.utils import formatdate

import httpx
import pytest
from standardwebhooks import Webhook

from activities.providers.acs_email import API_VERSION, sign_request
from configuration.tls import shared_tls_context
from devstack.fake_provider import FakeProvider, FaultConfig, run_fake_provider
from tests.conftest import ACS_ACCESS_KEY, WEBHOOK_SECRET

EMAIL = json.dumps(
    {
        "senderAddress": "noreply@example.com",
        "recipients": {"to": [{"address": "ada@example.com"}]},
        "content": {"subject": "s", "plainText": "p"},
    }
).encode()


@pytest.fixture
async def fake() -> AsyncIterator[FakeProvider]:
    async with run_fake_provider(FaultConfig()) as fake:
        yield fake


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(verify=shared_tls_context()) as client:
        yield client


async def send(
    http: httpx.AsyncClient,
    fake: FakeProvider,
    key: str,
    *,
    request_id: str | None = None,
    first_sent: float | None = None,
    body: bytes = EMAIL,
    **headers: str,
) -> httpx.Response:
    """A signed send-email request; repeatable (with `request_id` and `first_sent`) or not."""
    if request_id is not None:
        headers["Repeatability-Request-Id"] = request_id
        headers["Repeatability-First-Sent"] = formatdate(first_sent or time.time(), usegmt=True)
    request = http.build_request(
        "POST",
        f"{fake.url}/emails:send",
        params={"api-version": API_VERSION},
        content=body,
        headers={"Content-Type": "application/json", "Operation-Id": key, **headers},
    )
    sign_request(request, ACS_ACCESS_KEY)
    return await http.send(request)


async def test_a_repeat_within_the_window_gets_the_first_answer_and_is_not_sent_again(
    fake, http
) -> None:
    key, request_id, first_sent = uuid.uuid4().hex, str(uuid.uuid4()), time.time()

    first = await send(http, fake, key, request_id=request_id, first_sent=first_sent)
    again = await send(http, fake, key, request_id=request_id, first_sent=first_sent)

    assert (first.status_code, again.status_code) == (202, 202)
    assert first.headers["Operation-Location"] == again.headers["Operation-Location"]
    assert again.headers["Repeatability-Result"] == "accepted"
    stats = await fake.admin.key_stats(key)
    assert (stats["submits"], stats["deliveries"]) == (2, 1)


async def test_a_first_sent_older_than_the_window_is_refused_with_412(fake, http) -> None:
    key, request_id = uuid.uuid4().hex, str(uuid.uuid4())

    refused = await send(http, fake, key, request_id=request_id, first_sent=time.time() - 301)

    assert refused.status_code == 412
    assert refused.json()["error"]["code"] == "PreconditionFailed"
    assert refused.headers["Repeatability-Result"] == "rejected"
    assert (await fake.admin.key_stats(key))["deliveries"] == 0


async def test_the_window_is_configurable(http) -> None:
    async with run_fake_provider(FaultConfig(repeatability_window_s=3600)) as fake:
        key = uuid.uuid4().hex
        accepted = await send(
            http, fake, key, request_id=str(uuid.uuid4()), first_sent=time.time() - 3000
        )
        refused = await send(
            http, fake, key, request_id=str(uuid.uuid4()), first_sent=time.time() - 3700
        )

    assert (accepted.status_code, refused.status_code) == (202, 412)


async def test_past_the_window_the_send_anew_a_412_forces_is_a_second_delivery(fake, http) -> None:
    """What the reconcile step is for: once the first send is beyond the window, its repeat is
    refused, and sending it anew (a new request id and first-sent) delivers it again."""
    key, request_id = uuid.uuid4().hex, str(uuid.uuid4())
    # Ten seconds inside the 300 s window (the header drops the fraction, and a loaded machine
    # took more than the second this test once left), the repeat ten past it.
    first_sent = time.time() - 290

    first = await send(http, fake, key, request_id=request_id, first_sent=first_sent)
    repeat = await send(http, fake, key, request_id=request_id, first_sent=first_sent - 20)
    anew = await send(http, fake, key, request_id=str(uuid.uuid4()))

    assert (first.status_code, repeat.status_code, anew.status_code) == (202, 412, 202)
    assert (await fake.admin.key_stats(key))["deliveries"] == 2


@pytest.mark.parametrize(
    ("headers", "problem"),
    [
        ({"Repeatability-Request-Id": "not-a-guid"}, "GUID"),
        ({"Repeatability-First-Sent": "yesterday"}, "IMF-fixdate"),
        ({"Repeatability-First-Sent": "2026-11-28T07:00:00Z"}, "IMF-fixdate"),
    ],
)
async def test_malformed_repeatability_headers_are_a_400(
    fake, http, headers: dict[str, str], problem: str
) -> None:
    key = uuid.uuid4().hex
    full = {
        "Repeatability-Request-Id": str(uuid.uuid4()),
        "Repeatability-First-Sent": formatdate(usegmt=True),
        **headers,
    }

    refused = await send(http, fake, key, **full)

    assert refused.status_code == 400
    assert problem in refused.json()["error"]["message"]
    assert (await fake.admin.key_stats(key))["deliveries"] == 0


async def test_one_repeatability_header_without_the_other_is_a_400(fake, http) -> None:
    refused = await send(
        http, fake, uuid.uuid4().hex, **{"Repeatability-Request-Id": str(uuid.uuid4())}
    )

    assert refused.status_code == 400
    assert "go together" in refused.json()["error"]["message"]


async def test_a_repeat_that_does_not_match_the_first_request_is_a_400(fake, http) -> None:
    key, request_id, first_sent = uuid.uuid4().hex, str(uuid.uuid4()), time.time()
    other = EMAIL.replace(b'"p"', b'"changed"')

    await send(http, fake, key, request_id=request_id, first_sent=first_sent)
    refused = await send(http, fake, key, request_id=request_id, first_sent=first_sent, body=other)

    assert refused.status_code == 400
    assert "does not match" in refused.json()["error"]["message"]
    assert (await fake.admin.key_stats(key))["deliveries"] == 1


async def test_a_send_without_the_headers_is_executed_every_time(fake, http) -> None:
    """As ACS: a plain POST is not idempotent, whatever its Operation-Id."""
    key = uuid.uuid4().hex

    await send(http, fake, key)
    await send(http, fake, key)

    assert (await fake.admin.key_stats(key))["deliveries"] == 2
    assert (await fake.admin.stats())["totals"]["duplicates"] == 1


async def test_a_dropped_response_was_taken_but_the_sender_never_learns_it(fake, http) -> None:
    key, request_id, first_sent = uuid.uuid4().hex, str(uuid.uuid4()), time.time()
    await fake.admin.script(key, [{"drop_response": True}])

    with pytest.raises(httpx.RemoteProtocolError):
        await send(http, fake, key, request_id=request_id, first_sent=first_sent)
    lookup = http.build_request(
        "GET", f"{fake.url}/emails/operations/{key}", params={"api-version": API_VERSION}
    )
    sign_request(lookup, ACS_ACCESS_KEY)
    found = await http.send(lookup)

    assert found.status_code == 200 and found.json()["id"] == key
    assert (await fake.admin.key_stats(key))["deliveries"] == 1


async def test_lost_response_rate_drops_answers_of_taken_requests(http) -> None:
    async with run_fake_provider(FaultConfig(lost_response_rate=1.0)) as fake:
        key = uuid.uuid4().hex
        with pytest.raises(httpx.RemoteProtocolError):
            await send(http, fake, key, request_id=str(uuid.uuid4()))

        assert (await fake.admin.key_stats(key))["deliveries"] == 1


async def post_webhook(
    http: httpx.AsyncClient, fake: FakeProvider, message_id: str, **headers: str
) -> httpx.Response:
    body = '{"event":"paid"}'
    now = int(time.time())
    signature = Webhook(WEBHOOK_SECRET).sign(message_id, datetime.fromtimestamp(now, UTC), body)
    return await http.post(
        f"{fake.url}/webhook/memory",
        content=body,
        headers={
            "webhook-id": message_id,
            "webhook-timestamp": str(now),
            "webhook-signature": signature,
            **headers,
        },
    )


async def test_a_webhook_id_is_deduped_within_the_window_and_new_after_it(http) -> None:
    async with run_fake_provider(FaultConfig(webhook_dedupe_window_s=300)) as fake:
        message_id = f"msg_{uuid.uuid4().hex}"
        for _ in range(2):
            assert (await post_webhook(http, fake, message_id)).status_code == 204
        within = (await fake.admin.key_stats(message_id))["deliveries"]
        await fake.admin.change_faults(webhook_dedupe_window_s=0)
        await post_webhook(http, fake, message_id)
        after = (await fake.admin.key_stats(message_id))["deliveries"]

    assert (within, after) == (1, 2)


async def test_a_webhooks_dropped_response_was_delivered(fake, http) -> None:
    message_id = f"msg_{uuid.uuid4().hex}"

    with pytest.raises(httpx.RemoteProtocolError):
        await post_webhook(http, fake, message_id, **{"X-Fake-Drop-Response": "1"})

    assert (await fake.admin.key_stats(message_id))["deliveries"] == 1
    assert [entry["key"] for entry in await fake.admin.deliveries("memory")] == [message_id]


async def pay(
    fake: FakeProvider, http: httpx.AsyncClient, key: str, amount: int = 100
) -> httpx.Response:
    return await http.post(
        f"{fake.url}/payments",
        json={"amount": amount, "currency": "eur"},
        headers={
            "Authorization": f"Bearer {fake.state.payment_token}",
            "Idempotency-Key": f'"{key}"',
        },
    )


async def test_the_payment_api_replays_a_key_then_forgets_it_but_keeps_the_payment(
    http: httpx.AsyncClient,
) -> None:
    async with run_fake_provider(FaultConfig(payment_key_window_s=0.3)) as fake:
        key = str(uuid.uuid4())
        first = await pay(fake, http, key)
        replayed = await pay(fake, http, key)
        other_body = await pay(fake, http, key, amount=999)
        await asyncio.sleep(0.4)  # the window is wall-clock time, as Stripe's is
        after = await pay(fake, http, key)
        found = await http.get(
            f"{fake.url}/payments/by-key/{key}",
            headers={"Authorization": f"Bearer {fake.state.payment_token}"},
        )

    assert first.status_code == 200 and replayed.json() == first.json()
    assert replayed.headers["Idempotent-Replayed"] == "true"
    assert other_body.status_code == 400 and other_body.json()["error"]["type"] == (
        "idempotency_error"
    )
    assert key in other_body.json()["error"]["message"]
    # Forgotten: executed again, a second payment.
    assert after.status_code == 200 and after.json()["id"] != first.json()["id"]
    assert found.status_code == 200 and found.json()["idempotency_key"] == key


async def test_the_payment_api_refuses_a_call_without_a_key_or_the_token(
    fake: FakeProvider, http: httpx.AsyncClient
) -> None:
    no_key = await http.post(
        f"{fake.url}/payments",
        json={"amount": 1},
        headers={"Authorization": f"Bearer {fake.state.payment_token}"},
    )
    no_token = await http.post(
        f"{fake.url}/payments", json={"amount": 1}, headers={"Idempotency-Key": "k"}
    )
    unknown = await http.get(
        f"{fake.url}/payments/by-key/nope",
        headers={"Authorization": f"Bearer {fake.state.payment_token}"},
    )

    assert (no_key.status_code, no_token.status_code, unknown.status_code) == (400, 401, 404)
    assert await fake.admin.deliveries("payments") == []
