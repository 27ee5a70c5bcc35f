"""AcsSmsProvider against the fake provider's ACS SMS, and the real Azure SDK as the referee."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from azure.communication.sms import SmsClient
from azure.core.credentials import AzureKeyCredential
from durable_outbox_temporal.contract.item import RecipientStatus, SubmitRequest

from activities.providers.acs_signing import sign_request
from activities.providers.acs_sms import AcsSmsProvider, first_sent_at, repeatability_request_id
from activities.providers.base import PermanentProviderError, TransientProviderError
from configuration.providers import AcsSmsSettings
from configuration.tls import shared_tls_context
from devstack.fake_provider import FakeProvider, run_fake_provider
from tests.conftest import ACS_ACCESS_KEY

SENDER = "+18005550100"


def new_key() -> str:
    return f"sms-{uuid.uuid4().hex}"


def sms(*numbers: str, **options: Any) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "from": SENDER,
        "smsRecipients": [{"to": number} for number in numbers],
        "message": "Your appointment is at 09:30",
    }
    if options:
        payload["smsSendOptions"] = options
    return payload


def submit_request(key: str, payload: dict[str, Any], attempt: int = 1) -> SubmitRequest:
    return SubmitRequest(
        destination="sms",
        item_id=f"outbox/t/{key}",
        idempotency_key=key,
        payload=payload,
        attempt=attempt,
    )


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(verify=shared_tls_context()) as client:
        yield client


def sms_provider(
    fake: FakeProvider, http: httpx.AsyncClient, access_key: str = ACS_ACCESS_KEY
) -> AcsSmsProvider:
    return AcsSmsProvider(AcsSmsSettings(endpoint=fake.url, access_key=access_key), http)


async def deliveries(fake: FakeProvider, key: str) -> list[str]:
    """The numbers the fake sent a message to for item `key`, once per message."""
    return [
        entry["key"].removeprefix(f"{key}/")
        for entry in await fake.admin.deliveries("sms")
        if entry["key"].startswith(f"{key}/")
    ]


async def test_submit_sends_to_every_number_once_and_lists_them_for_reports(
    fake_provider, http
) -> None:
    key = new_key()

    result = await sms_provider(fake_provider, http).submit(
        submit_request(key, sms("+15550100", "+447700900123"))
    )

    assert result.delivered is True
    assert result.provider_message_id == key  # the tag every delivery report carries back
    assert result.recipients == ["+15550100", "+447700900123"]
    assert [(r.address, r.status) for r in result.recipient_results] == [
        ("+15550100", RecipientStatus.PENDING),
        ("+447700900123", RecipientStatus.PENDING),
    ]
    assert all(
        (r.detail or "").startswith("accepted as message Outgoing_")
        for r in result.recipient_results
    )
    assert sorted(await deliveries(fake_provider, key)) == ["+15550100", "+447700900123"]


async def test_a_retry_inside_the_window_repeats_the_request_ids_and_sends_nothing_twice(
    fake_provider, http
) -> None:
    key = new_key()
    provider = sms_provider(fake_provider, http)
    payload = sms("+15550101", "+15550102")

    first = await provider.submit(submit_request(key, payload))
    again = await provider.submit(submit_request(key, payload, attempt=2))

    assert first.recipients == again.recipients
    assert sorted(await deliveries(fake_provider, key)) == ["+15550101", "+15550102"]


async def test_each_recipient_carries_its_own_stable_repeatability_fields(http) -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        body = request.read()
        numbers = [r["to"] for r in json.loads(body)["smsRecipients"]]
        value = [{"to": n, "httpStatusCode": 202, "successful": True} for n in numbers]
        return httpx.Response(202, json={"value": value})

    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    provider = AcsSmsProvider(
        AcsSmsSettings(endpoint="https://acs.test", access_key=ACS_ACCESS_KEY), client
    )
    key = new_key()
    for attempt in (1, 2):
        await provider.submit(submit_request(key, sms("+15550103", "+15550104"), attempt))

    bodies = [json.loads(request.read()) for request in seen]
    ids = [[r["repeatabilityRequestId"] for r in body["smsRecipients"]] for body in bodies]
    assert ids[0] == ids[1]  # the same ids on every attempt
    assert ids[0] == [repeatability_request_id(key, n) for n in ("+15550103", "+15550104")]
    assert len(set(ids[0])) == 2 and all(len(i) == 36 for i in ids[0])
    assert all(r["repeatabilityFirstSent"].endswith(" GMT") for r in bodies[0]["smsRecipients"])
    assert bodies[0]["smsSendOptions"] == {"enableDeliveryReport": True, "tag": key}
    assert seen[0].url.path == "/sms" and seen[0].url.params["api-version"] == "2021-03-07"
    assert seen[0].headers["Authorization"].startswith("HMAC-SHA256 ")
    await client.aclose()


async def test_a_refused_number_is_failed_on_the_recipients_the_others_go(
    fake_provider, http
) -> None:
    key = new_key()

    result = await sms_provider(fake_provider, http).submit(
        submit_request(key, sms("+15550105", "+9995550106"))
    )

    assert result.delivered is True
    taken, refused = result.recipient_results
    assert (taken.address, taken.status) == ("+15550105", RecipientStatus.PENDING)
    assert (refused.address, refused.status) == ("+9995550106", RecipientStatus.FAILED)
    assert refused.detail is not None and refused.detail.startswith("HTTP 400: ")
    assert await deliveries(fake_provider, key) == ["+15550105"]


async def test_every_number_refused_is_a_permanent_failure_naming_them(fake_provider, http) -> None:
    with pytest.raises(PermanentProviderError, match=r"every recipient refused: \+9995550107"):
        await sms_provider(fake_provider, http).submit(
            submit_request(new_key(), sms("+9995550107"))
        )


async def test_a_throttled_send_is_transient_with_its_retry_after(fake_provider, http) -> None:
    key = new_key()
    await fake_provider.admin.script(key, [{"status": 429, "retry_after": "7"}])

    with pytest.raises(TransientProviderError) as error:
        await sms_provider(fake_provider, http).submit(submit_request(key, sms("+15550108")))

    assert (error.value.status_code, error.value.retry_after_s) == (429, 7.0)
    assert await deliveries(fake_provider, key) == []


async def test_a_recipient_failing_transiently_fails_the_attempt_whose_retry_repeats_it_all(
    http,
) -> None:
    """ACS answers each number on its own: a 503 for one fails the attempt, and the retry
    repeats every number's repeatability fields, so ACS answers the number that went from its
    memory (the fake's tests show it does) instead of sending it again."""
    answers = iter([503, 202])
    bodies: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.read()))
        second = next(answers)
        value = [
            {"to": "+15550109", "httpStatusCode": 202, "successful": True},
            {"to": "+15550110", "httpStatusCode": second, "successful": second == 202},
        ]
        return httpx.Response(202, json={"value": value}, headers={"Retry-After": "3"})

    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    provider = AcsSmsProvider(
        AcsSmsSettings(endpoint="https://acs.test", access_key=ACS_ACCESS_KEY), client
    )
    key, first = new_key(), at(5)
    request = replace(submit_request(key, sms("+15550109", "+15550110")), first_submitted_at=first)
    with pytest.raises(TransientProviderError, match=r"\+15550110: HTTP 503") as error:
        await provider.submit(request)
    result = await provider.submit(replace(request, attempt=2))

    assert (error.value.status_code, error.value.retry_after_s) == (503, 3.0)
    assert bodies[0]["smsRecipients"] == bodies[1]["smsRecipients"]  # ids and first-sent
    assert result.recipients == ["+15550109", "+15550110"]
    assert {r.status for r in result.recipient_results} == {RecipientStatus.PENDING}
    await client.aclose()


async def test_an_answer_for_other_numbers_is_refused(http) -> None:
    client = httpx.AsyncClient(
        transport=httpx.MockTransport(
            lambda request: httpx.Response(
                202, json={"value": [{"to": "+1", "httpStatusCode": 202, "successful": True}]}
            )
        )
    )
    provider = AcsSmsProvider(
        AcsSmsSettings(endpoint="https://acs.test", access_key=ACS_ACCESS_KEY), client
    )
    with pytest.raises(PermanentProviderError, match="not the numbers sent"):
        await provider.submit(submit_request(new_key(), sms("+15550111")))
    await client.aclose()


async def test_without_delivery_reports_no_recipient_waits_for_one(fake_provider, http) -> None:
    result = await sms_provider(fake_provider, http).submit(
        submit_request(new_key(), sms("+15550112", "+9995550112", enableDeliveryReport=False))
    )

    assert result.delivered is True
    # Only the refused number shows: nothing would ever settle a pending one.
    assert result.recipients == ["+9995550112"]
    assert [r.status for r in result.recipient_results] == [RecipientStatus.FAILED]


async def test_a_payload_enqueue_would_refuse_fails_permanently(fake_provider, http) -> None:
    with pytest.raises(PermanentProviderError, match=r"smsRecipients\[0\].to: '5550100'"):
        await sms_provider(fake_provider, http).submit(submit_request(new_key(), sms("5550100")))


async def test_a_wrong_key_is_refused(fake_provider, http) -> None:
    with pytest.raises(PermanentProviderError, match="HTTP 401"):
        await sms_provider(fake_provider, http, access_key="d3Jvbmcta2V5").submit(
            submit_request(new_key(), sms("+15550113"))
        )


def at(seconds_ago: float) -> datetime:
    return datetime.now(UTC) - timedelta(seconds=seconds_ago)


async def test_a_retry_past_the_window_is_refused_412_and_left_pending_not_sent_twice(
    http,
) -> None:
    """The fake forgets a request after its window, as ACS does: the retry's first-sent time is
    then too old, ACS cannot tell whether it sent the message, and the number stays pending for
    its delivery report rather than being sent a second time."""
    async with run_fake_provider() as fake:
        fake.state.sms.window_s = 30.0
        provider = sms_provider(fake, http)
        key, first = new_key(), at(10)
        await provider.submit(
            replace(submit_request(key, sms("+15550114")), first_submitted_at=first)
        )
        retry = replace(submit_request(key, sms("+15550114"), 2), first_submitted_at=first)
        fake.state.sms.window_s = 5.0  # the retry comes after the window

        again = await provider.submit(retry)

        assert await deliveries(fake, key) == ["+15550114"]
        [pending] = again.recipient_results
        assert pending.status is RecipientStatus.PENDING
        assert pending.detail is not None and pending.detail.startswith("HTTP 412: ")


async def test_a_request_the_fake_forgot_is_a_new_message_as_at_acs(http) -> None:
    """What the window costs a sender that starts afresh: the same request id with a new
    first-sent time, once the fake forgot it, is sent again."""
    async with run_fake_provider() as fake:
        fake.state.sms.window_s = 0.2
        provider = sms_provider(fake, http)
        key = new_key()
        await provider.submit(submit_request(key, sms("+15550121")))
        await asyncio.sleep(0.3)  # the fake's window is wall-clock time, as ACS's is

        await provider.submit(submit_request(key, sms("+15550121")))

        assert await deliveries(fake, key) == ["+15550121", "+15550121"]


def test_the_first_sent_time_is_the_first_attempts_unless_a_first_attempt_waited_too_long() -> None:
    request = submit_request(new_key(), sms("+15550122"))
    now = datetime.now(UTC)

    assert first_sent_at(request, now) == now  # not tracked: the attempt's own time
    assert first_sent_at(replace(request, first_submitted_at=at(30)), now) < now - timedelta(
        seconds=29
    )
    # A first attempt that waited in a backlog: nothing went under the key yet.
    assert first_sent_at(replace(request, first_submitted_at=at(600)), now) == now
    # A retry keeps the first attempt's time, however old: ACS then answers 412.
    retry = replace(request, attempt=2, first_submitted_at=at(600))
    assert first_sent_at(retry, now) == retry.first_submitted_at


async def test_the_fake_refuses_a_first_sent_older_than_its_window(fake_provider, http) -> None:
    """412 for a recipient whose repeatabilityFirstSent is outside the window."""
    body = {
        "from": SENDER,
        "message": "hi",
        "smsRecipients": [
            {
                "to": "+15550115",
                "repeatabilityRequestId": str(uuid.uuid4()),
                "repeatabilityFirstSent": "Mon, 01 Apr 2019 06:22:03 GMT",
            },
            {"to": "+15550116", "repeatabilityRequestId": str(uuid.uuid4())},
        ],
    }
    request = http.build_request(
        "POST", f"{fake_provider.url}/sms", params={"api-version": "2021-03-07"}, json=body
    )
    sign_request(request, ACS_ACCESS_KEY)

    answer = (await http.send(request)).json()["value"]

    assert [(a["httpStatusCode"], a["repeatabilityResult"]) for a in answer] == [
        (412, "rejected"),
        (400, "rejected"),
    ]


async def test_the_fake_refuses_a_repeat_that_does_not_match_the_first(fake_provider, http) -> None:
    key = new_key()
    provider = sms_provider(fake_provider, http)
    await provider.submit(submit_request(key, sms("+15550117")))
    changed = {**sms("+15550117"), "message": "another text"}

    with pytest.raises(PermanentProviderError, match="does not match the first"):
        await provider.submit(submit_request(key, changed, 2))


async def test_real_azure_sdk_is_accepted_by_the_fake(fake_provider) -> None:
    """If the fake refused the SDK's requests, our provider could pass against a wrong fake."""
    client = SmsClient(fake_provider.url, AzureKeyCredential(ACS_ACCESS_KEY))
    tag = new_key()

    def send() -> list[Any]:
        return list(
            client.send(
                SENDER,
                ["+15550118", "+9995550119"],
                "Hello from the SDK",
                enable_delivery_report=True,
                tag=tag,
            )
        )

    results = await asyncio.to_thread(send)

    assert [(r.to, r.successful, r.http_status_code) for r in results] == [
        ("+15550118", True, 202),
        ("+9995550119", False, 400),
    ]
    assert results[0].message_id.startswith("Outgoing_")
    assert await deliveries(fake_provider, tag) == ["+15550118"]


async def test_real_azure_sdk_with_wrong_key_is_refused(fake_provider) -> None:
    client = SmsClient(fake_provider.url, AzureKeyCredential("d3Jvbmcta2V5"))
    tag = new_key()

    with pytest.raises(Exception, match="(?i)denied") as error:
        await asyncio.to_thread(client.send, SENDER, "+15550120", "hi", tag=tag)

    assert getattr(error.value, "status_code", None) == 401
    assert await deliveries(fake_provider, tag) == []
