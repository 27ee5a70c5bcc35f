"""An `acs-sms` destination through the API: its payload checked at enqueue (422, never a failed
delivery), per-number results on the item's recipients, and SMS delivery reports from Event Grid
(posted by a test, and by the fake provider's Event Grid) at the same events endpoint as email's."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
import pytest_asyncio
from durable_outbox_temporal.contract.ids import provider_idempotency_key
from durable_outbox_temporal.contract.sms import MAX_SMS_RECIPIENTS
from durable_outbox_temporal.destinations import Destination

from devstack.fake_provider import FakeProvider, run_fake_provider
from tests.api.conftest import api_settings, open_api, serve_stack
from tests.api.test_items import assert_problem
from tests.conftest import Stack
from tests.conftest import sms_destination as make_sms_destination

SECRET = "test-sms-events-secret-0123456789"
SMS_REPORT = "Microsoft.Communication.SMSDeliveryReportReceived"
ITEMS = "/v1/outboxes/sms/items"


def sms_destination(fake: FakeProvider) -> Destination:
    return make_sms_destination(fake, events_secret=SECRET, report_window_s=3600)


def sms(*numbers: str) -> dict[str, Any]:
    return {
        "from": "+18005550100",
        "smsRecipients": [{"to": number} for number in numbers],
        "message": "See you at 09:30",
    }


@dataclass
class SmsApi:
    http: httpx.AsyncClient
    stack: Stack
    sms: str

    async def enqueue(self, key: str, payload: dict[str, Any]) -> httpx.Response:
        return await self.http.post(
            ITEMS,
            json={"destination": self.sms, "payload": payload},
            headers={"Idempotency-Key": key},
        )

    async def until(self, key: str, done: Any) -> dict[str, Any]:
        for _ in range(200):
            item = dict((await self.http.get(f"{ITEMS}/{key}")).json())
            if done(item):
                return item
            await asyncio.sleep(0.05)
        raise AssertionError(f"{key}: {item}")


@pytest_asyncio.fixture(loop_scope="session")
async def sms_api(stack_factory, fake_provider) -> AsyncIterator[SmsApi]:
    destination = sms_destination(fake_provider)
    stack = await stack_factory(destination)
    async for http in open_api(stack, api_settings(workflow_task_queue=stack.task_queue)):
        yield SmsApi(http=http, stack=stack, sms=destination.name)


@pytest.mark.parametrize(
    ("payload", "detail"),
    [
        (sms("5550100"), r"payload.smsRecipients[0].to: '5550100' is not a phone number in E.164"),
        (sms("+1 555 0100"), "payload.smsRecipients[0].to: '+1 555 0100' is not a phone number"),
        ({**sms("+15550100"), "from": "Contoso"}, "payload.from must be the sender's phone number"),
        (
            sms(*(f"+1555{n:07d}" for n in range(MAX_SMS_RECIPIENTS + 1))),
            "payload.smsRecipients has 101 recipients; ACS takes at most 100",
        ),
        (sms(), "payload.smsRecipients must be a non-empty array"),
        (sms("+15550100", "+15550100"), "payload.smsRecipients[1].to: +15550100 is listed twice"),
        ({**sms("+15550100"), "message": ""}, "payload.message must be a non-empty string"),
        (
            {**sms("+15550100"), "smsSendOptions": {"tag": "mine"}},
            "payload.smsSendOptions.tag: not allowed",
        ),
        (
            {**sms(), "smsRecipients": [{"to": "+15550100", "repeatabilityRequestId": "x"}]},
            "payload.smsRecipients[0]: repeatabilityRequestId: not allowed",
        ),
        ({**sms("+15550100"), "text": "hi"}, "payload: text: not a field of an ACS SMS send"),
    ],
)
async def test_a_payload_acs_would_refuse_is_422_at_enqueue_naming_the_field(
    sms_api: SmsApi, payload: dict[str, Any], detail: str
) -> None:
    key = f"bad-{uuid.uuid4().hex[:8]}"

    response = await sms_api.enqueue(key, payload)

    assert detail in assert_problem(response, 422, "invalid-request")["detail"]
    assert (await sms_api.http.get(f"{ITEMS}/{key}")).status_code == 404  # nothing to fail


async def test_a_batch_refuses_only_its_bad_sms(sms_api: SmsApi) -> None:
    response = await sms_api.http.post(
        f"{ITEMS}:batch",
        json={
            "items": [
                {"destination": sms_api.sms, "payload": sms("+15550130"), "idempotency_key": "b1"},
                {"destination": sms_api.sms, "payload": sms("15550131"), "idempotency_key": "b2"},
            ]
        },
    )

    assert response.status_code in (200, 207), response.text
    statuses = [result["status"] for result in response.json()["results"]]
    assert statuses[1] == 422 and statuses[0] in (201, 202)


async def test_each_number_shows_on_the_item_a_refused_one_failed_the_others_pending(
    sms_api: SmsApi,
) -> None:
    key = f"ok-{uuid.uuid4().hex[:8]}"
    assert (await sms_api.enqueue(key, sms("+15550132", "+9995550133"))).status_code == 202

    item = await sms_api.until(key, lambda item: item["status"] == "sent")

    recipients = {r["address"]: r for r in item["recipients"]}
    assert recipients["+15550132"]["status"] == "pending"
    assert recipients["+9995550133"]["status"] == "failed"
    assert recipients["+9995550133"]["detail"].startswith("HTTP 400: ")
    assert item["delivery"] == "bounced"


def sms_event(tag: str | None, to: str, status: str, message_id: str = "") -> dict[str, Any]:
    at = "2026-11-28T10:00:00.1234567+00:00"
    data: dict[str, Any] = {
        "messageId": message_id or f"Outgoing_{uuid.uuid4()}",
        "from": "+18005550100",
        "to": to,
        "deliveryStatus": status,
        "deliveryStatusDetails": f"{status} by test",
        "receivedTimestamp": at,
        "deliveryAttempts": [{"timestamp": at, "segmentsSucceeded": 1, "segmentsFailed": 0}],
    }
    if tag is not None:
        data["tag"] = tag
    return {
        "id": str(uuid.uuid4()),
        "topic": "/subscriptions/0/resourceGroups/g/providers/microsoft.communication/x/a",
        "subject": f"phonenumber/{to}",
        "eventType": SMS_REPORT,
        "eventTime": datetime.now(UTC).isoformat(),
        "dataVersion": "1.0",
        "metadataVersion": "1",
        "data": data,
    }


async def test_sms_delivery_reports_reach_the_item_by_their_tag(sms_api: SmsApi) -> None:
    key = f"rep-{uuid.uuid4().hex[:8]}"
    assert (await sms_api.enqueue(key, sms("+15550134", "+15550135"))).status_code == 202
    item = await sms_api.until(key, lambda item: item["status"] == "sent")
    tag = provider_idempotency_key(item["id"])

    response = await sms_api.http.post(
        f"/v1/destinations/{sms_api.sms}/events",
        params={"secret": SECRET},
        json=[
            sms_event(tag, "+15550134", "Delivered"),
            sms_event(tag, "+15550135", "Failed"),
            sms_event(None, "+15550136", "Delivered"),  # sent some other way: no tag
            {**sms_event(tag, "+15550134", "Delivered"), "data": {"to": "+1"}},
        ],
    )

    assert response.status_code == 200, response.text
    assert response.json() == {
        "received": 4,
        "applied": 2,
        "unknown": 1,
        "late": 0,
        "ignored": 0,
        "invalid": 1,
    }
    item = await sms_api.until(
        key, lambda item: all(r["status"] != "pending" for r in item["recipients"])
    )
    assert sorted((r["address"], r["status"], r["detail"]) for r in item["recipients"]) == [
        ("+15550134", "delivered", "Delivered by test"),
        ("+15550135", "failed", "Failed by test"),
    ]


async def test_the_fakes_event_grid_reports_each_number_to_the_sms_destination(
    stack_factory,
) -> None:
    """The whole loop: the item goes to the fake's ACS SMS, whose Event Grid posts each
    number's report to the destination's events endpoint, and the item shows them."""
    async with run_fake_provider(events_secret=SECRET) as fake:
        destination = sms_destination(fake)
        stack = await stack_factory(destination)
        async with serve_stack(stack) as url:
            await fake.admin.change_faults(
                sms_report_url=f"{url}/v1/destinations/{destination.name}/events",
                report_delay_s=0.0,
            )
            async with httpx.AsyncClient(base_url=url) as http:
                api = SmsApi(http=http, stack=stack, sms=destination.name)
                key = f"loop-{uuid.uuid4().hex[:8]}"
                assert (await api.enqueue(key, sms("+15550137", "+15550138"))).status_code == 202

                item = await api.until(key, lambda item: item["delivery"] == "delivered")

        assert sorted(r["address"] for r in item["recipients"]) == ["+15550137", "+15550138"]
        assert (await fake.admin.stats())["totals"]["reports_sent"] == 2


async def test_a_schedule_whose_sms_every_fire_would_refuse_is_422_at_creation(
    sms_api: SmsApi,
) -> None:
    body = {
        "id": f"sms-{uuid.uuid4().hex[:8]}",
        "outbox": "sms",
        "interval_seconds": 60,
        "items": [
            {
                "destination": sms_api.sms,
                "payload": {**sms("+15550139"), "message": "{{fire_date}}"},
            },
            {"destination": sms_api.sms, "payload": sms("0555 0139")},
        ],
    }

    response = await sms_api.http.post("/v1/schedules", json=body)

    assert response.status_code == 422, response.text
    errors = response.json()["errors"]
    assert [error["location"] for error in errors] == [["body", "items", "1", "payload"]]
    assert "E.164" in errors[0]["message"]
