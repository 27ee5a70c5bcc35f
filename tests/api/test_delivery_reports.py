"""`POST /v1/destinations/{d}/events`: Event Grid and CloudEvents deliveries of ACS email
delivery reports, the subscription handshakes and the per-destination secret."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
import pytest_asyncio
from durable_outbox_temporal.contract.ids import provider_idempotency_key

from devstack.fake_provider import run_fake_provider
from service.reports import EARLY_REPORT_WINDOW
from tests.api.conftest import api_settings, open_api, serve_stack
from tests.api.test_items import assert_problem
from tests.conftest import Stack, email_destination, webhook_destination

SECRET = "test-events-secret-0123456789"
REPORT_TYPE = "Microsoft.Communication.EmailDeliveryReportReceived"
TOPIC = (
    "/subscriptions/0/resourceGroups/g/providers/microsoft.communication/communicationservices/a"
)
EMAIL = {
    "senderAddress": "noreply@example.com",
    "recipients": {"to": [{"address": "ada@example.com"}, {"address": "bob@example.com"}]},
    "content": {"subject": "Hi", "plainText": "Hello"},
}


@dataclass
class ReportsApi:
    http: httpx.AsyncClient
    stack: Stack
    email: str
    webhook: str

    @property
    def events(self) -> str:
        return f"/v1/destinations/{self.email}/events"

    async def sent_item(self, key: str) -> str:
        """Enqueue an email to ada and bob; wait until it is sent (and listening for reports)."""
        response = await self.http.post(
            "/v1/outboxes/tests/items",
            json={"destination": self.email, "payload": EMAIL},
            headers={"Idempotency-Key": key},
        )
        assert response.status_code == 202, response.text
        for _ in range(200):
            item = (await self.http.get(f"/v1/outboxes/tests/items/{key}")).json()
            if item["status"] == "sent":
                return str(item["id"])
            await asyncio.sleep(0.05)
        raise AssertionError(f"{key} never sent: {item}")

    async def item(self, key: str) -> dict[str, Any]:
        return dict((await self.http.get(f"/v1/outboxes/tests/items/{key}")).json())


@pytest_asyncio.fixture(loop_scope="session")
async def reports_api(stack_factory, fake_provider) -> AsyncIterator[ReportsApi]:
    email = email_destination(fake_provider, events_secret=SECRET, report_window_s=3600)
    webhook = webhook_destination(fake_provider)
    stack = await stack_factory(email, webhook)
    settings = api_settings(workflow_task_queue=stack.task_queue, api_token="bearer-token")
    async for http in open_api(stack, settings):
        # The item routes need the bearer token; the events route must ignore it.
        http.headers["Authorization"] = "Bearer bearer-token"
        yield ReportsApi(http=http, stack=stack, email=email.name, webhook=webhook.name)


def data(
    message_id: str, recipient: str, status: str, at: str = "2026-11-23T10:00:00.1234567+00:00"
) -> dict[str, Any]:
    return {
        "sender": "noreply@example.com",
        "recipient": recipient,
        "messageId": message_id,
        "status": status,
        "deliveryStatusDetails": {"statusMessage": f"{status} by test"},
        "deliveryAttemptTimestamp": at,
    }


def grid_event(event_data: dict[str, Any], event_type: str = REPORT_TYPE) -> dict[str, Any]:
    return {
        "id": str(uuid.uuid4()),
        "topic": TOPIC,
        "subject": "sender/noreply@example.com/message/x",
        "eventType": event_type,
        "eventTime": datetime.now(UTC).isoformat(),
        "dataVersion": "1.0",
        "metadataVersion": "1",
        "data": event_data,
    }


def cloud_event(event_data: dict[str, Any]) -> dict[str, Any]:
    return {
        "specversion": "1.0",
        "id": str(uuid.uuid4()),
        "source": TOPIC,
        "type": REPORT_TYPE,
        "time": datetime.now(UTC).isoformat(),
        "datacontenttype": "application/json",
        "data": event_data,
    }


async def test_a_wrong_or_missing_secret_is_401_and_the_bearer_token_is_not_it(
    reports_api: ReportsApi,
) -> None:
    http, url = reports_api.http, reports_api.events
    assert_problem(await http.post(url, json=[]), 401)
    assert_problem(await http.post(url, params={"secret": "nope"}, json=[]), 401)
    assert http.headers["Authorization"] == "Bearer bearer-token"  # sent with every call
    assert_problem(await http.options(url, headers={"WebHook-Request-Origin": "x"}), 401)

    by_query = await http.post(url, params={"secret": SECRET}, json=[])
    by_header = await http.post(url, headers={"X-Events-Secret": SECRET}, json=[])

    assert by_query.status_code == by_header.status_code == 200
    assert by_query.json()["received"] == 0


async def test_destinations_without_an_events_secret_have_no_endpoint(
    reports_api: ReportsApi,
) -> None:
    http = reports_api.http
    for name in (reports_api.webhook, "no-such-destination"):
        response = await http.post(f"/v1/destinations/{name}/events", params={"secret": SECRET})
        assert_problem(response, 404)


async def test_event_grid_subscription_validation_echoes_the_code(reports_api: ReportsApi) -> None:
    validation = grid_event(
        {"validationCode": "512d38b6-c7b8-40c8-89fe-f46f9e9622b6", "validationUrl": "https://x"},
        event_type="Microsoft.EventGrid.SubscriptionValidationEvent",
    )

    response = await reports_api.http.post(
        reports_api.events,
        params={"secret": SECRET},
        json=[validation],
        headers={"aeg-event-type": "SubscriptionValidation"},
    )

    assert response.status_code == 200
    assert response.json() == {"validationResponse": "512d38b6-c7b8-40c8-89fe-f46f9e9622b6"}


async def test_cloudevents_webhook_validation_allows_the_asking_origin(
    reports_api: ReportsApi,
) -> None:
    http, url = reports_api.http, reports_api.events

    response = await http.options(
        url, params={"secret": SECRET}, headers={"WebHook-Request-Origin": "eventgrid.azure.net"}
    )

    assert response.status_code == 200
    assert response.headers["WebHook-Allowed-Origin"] == "eventgrid.azure.net"
    assert_problem(await http.options(url, params={"secret": SECRET}), 400)


async def test_event_grid_reports_reach_the_item_and_its_lists(reports_api: ReportsApi) -> None:
    api = reports_api
    item_id = await api.sent_item("eg-1")
    message_id = provider_idempotency_key(item_id)
    assert (await api.item("eg-1"))["delivery"] == "pending"

    response = await api.http.post(
        api.events,
        params={"secret": SECRET},
        json=[
            grid_event(data(message_id, "ada@example.com", "Delivered")),
            grid_event(data(message_id, "bob@example.com", "Bounced")),
            grid_event({"something": "else"}, event_type="Microsoft.Storage.BlobCreated"),
        ],
    )

    assert response.status_code == 200, response.text
    assert response.json() == {
        "received": 3,
        "applied": 2,
        "unknown": 0,
        "late": 0,
        "ignored": 1,
        "invalid": 0,
    }
    for _ in range(100):
        item = await api.item("eg-1")
        # The two reports are projected one after the other, in either order.
        if all(r["status"] != "pending" for r in item["recipients"]):
            break
        await asyncio.sleep(0.05)
    assert [(r["address"], r["status"], r["detail"]) for r in item["recipients"]] == [
        ("ada@example.com", "delivered", "Delivered by test"),
        ("bob@example.com", "bounced", "Bounced by test"),
    ]
    assert item["recipients"][0]["at"].startswith("2026-11-23T10:00:00.123456")
    events = (await api.http.get("/v1/outboxes/tests/items/eg-1/events")).json()
    assert [e["type"] for e in events][-2:] == ["delivery-report", "delivery-report"]
    bounced = (await api.http.get("/v1/outboxes/tests/items?delivery=bounced")).json()["items"]
    assert [i["key"] for i in bounced] == ["eg-1"]
    assert (await api.http.get("/v1/outboxes/tests/items?delivery=delivered")).json()["items"] == []
    assert_problem(await api.http.get("/v1/outboxes/tests/items?delivery=lost"), 422)


async def test_cloudevents_single_and_batch(reports_api: ReportsApi) -> None:
    api = reports_api
    item_id = await api.sent_item("ce-1")
    message_id = provider_idempotency_key(item_id)

    single = await api.http.post(
        api.events,
        params={"secret": SECRET},
        json=cloud_event(data(message_id, "ada@example.com", "Delivered")),
        headers={"Content-Type": "application/cloudevents+json; charset=utf-8"},
    )
    batch = await api.http.post(
        api.events,
        params={"secret": SECRET},
        json=[
            cloud_event(data(message_id, "bob@example.com", "Expanded")),
            cloud_event(data(message_id, "bob@example.com", "Delivered", "2026-11-23T11:00:00Z")),
        ],
        headers={"Content-Type": "application/cloudevents-batch+json; charset=utf-8"},
    )

    assert single.status_code == batch.status_code == 200
    assert single.json()["applied"] == 1 and batch.json()["applied"] == 2
    view = await api.stack.result(item_id)  # every recipient settled: the item ends
    assert {r.address: r.status.value for r in view.recipients} == {
        "ada@example.com": "delivered",
        "bob@example.com": "delivered",
    }
    events = (await api.http.get("/v1/outboxes/tests/items/ce-1/events")).json()
    # A bounce after the item ended: its workflow is gone, its read-model row takes it (a
    # repeat changes nothing).
    bounce = [grid_event(data(message_id, "ada@example.com", "Bounced", "2026-11-24T00:00:00Z"))]
    for _ in range(2):
        late = await api.http.post(api.events, params={"secret": SECRET}, json=bounce)
        assert late.json()["late"] == 1 and late.json()["applied"] == 0
    item = await api.item("ce-1")
    assert item["delivery"] == "bounced" and item["status"] == "sent"
    assert [(r["address"], r["status"]) for r in item["recipients"]] == [
        ("ada@example.com", "bounced"),
        ("bob@example.com", "delivered"),
    ]
    after = (await api.http.get("/v1/outboxes/tests/items/ce-1/events")).json()
    assert after[:-1] == events
    assert after[-1]["type"] == "delivery-report"
    assert after[-1]["detail"] == "ada@example.com: bounced (Bounced by test)"
    assert after[-1]["seq"] == events[-1]["seq"] + 1
    # A recipient the item never sent to is not the item's: unknown, not late.
    stray = await api.http.post(
        api.events,
        params={"secret": SECRET},
        json=[grid_event(data(message_id, "eve@example.com", "Delivered"))],
    )
    assert stray.json()["unknown"] == 1 and stray.json()["late"] == 0


async def test_unknown_messages_and_unreadable_reports_are_accepted_and_counted(
    reports_api: ReportsApi,
) -> None:
    api = reports_api
    unreadable = data("m", "ada@example.com", "Exploded")

    response = await api.http.post(
        api.events,
        params={"secret": SECRET},
        json=[
            grid_event(data(str(uuid.uuid4()), "ada@example.com", "Delivered")),
            grid_event(unreadable),
        ],
    )

    assert response.status_code == 200
    assert response.json()["unknown"] == 1 and response.json()["invalid"] == 1
    metrics = (await api.http.get("/metrics")).text
    assert (
        f'outbox_delivery_reports_total{{destination="{api.email}",result="unknown"}} 1.0'
        in metrics
    )


async def test_a_recent_report_on_a_message_not_yet_recorded_is_sent_back_to_come_again(
    reports_api: ReportsApi,
) -> None:
    """A fast provider reports before the worker records the send: such a report (its attempt
    within the last 10 minutes) is answered 503 with Retry-After so Event Grid delivers it again;
    the delivery's known reports are applied at once. A fake's report was dropped so once."""
    api = reports_api
    item_id = await api.sent_item("early-1")
    message_id = provider_idempotency_key(item_id)
    now = datetime.now(UTC)
    recent = (now - EARLY_REPORT_WINDOW + timedelta(seconds=30)).isoformat()

    response = await api.http.post(
        api.events,
        params={"secret": SECRET},
        json=[
            grid_event(data(message_id, "ada@example.com", "Delivered")),
            grid_event(data(str(uuid.uuid4()), "ada@example.com", "Delivered", recent)),
        ],
    )

    assert_problem(response, 503, "reports-not-yet-recorded")
    assert response.headers["Retry-After"] == "10"
    for _ in range(100):
        item = await api.item("early-1")
        if item["recipients"][0]["status"] == "delivered":
            break
        await asyncio.sleep(0.05)
    assert item["recipients"][0]["status"] == "delivered"
    older = (now - EARLY_REPORT_WINDOW - timedelta(seconds=30)).isoformat()
    stray = await api.http.post(
        api.events,
        params={"secret": SECRET},
        json=[grid_event(data(str(uuid.uuid4()), "ada@example.com", "Delivered", older))],
    )
    assert stray.status_code == 200 and stray.json()["unknown"] == 1
    metrics = (await api.http.get("/metrics")).text
    assert (
        f'outbox_delivery_reports_total{{destination="{api.email}",result="early"}} 1.0' in metrics
    )


async def test_a_body_that_is_no_event_grid_delivery_is_400(reports_api: ReportsApi) -> None:
    http, url, secret = reports_api.http, reports_api.events, {"secret": SECRET}
    bad_json = await http.post(
        url, params=secret, content=b"{", headers={"Content-Type": "application/json"}
    )
    assert_problem(bad_json, 400)
    assert_problem(await http.post(url, params=secret, json=[1, 2]), 400)
    assert_problem(await http.post(url, params=secret, json={"not": "a cloud event"}), 400)
    assert_problem(await http.post(url, params=secret, json=[{"id": "x"}]), 400)


async def test_an_item_waiting_for_reports_refuses_an_erase_saying_until_when(
    reports_api: ReportsApi,
) -> None:
    api = reports_api
    await api.sent_item("erase-early")

    refused = await api.http.delete("/v1/outboxes/tests/items/erase-early/payload")

    body = assert_problem(refused, 409)
    assert body["code"] == "not-erasable" and "delivery reports until" in body["detail"]
    assert (await api.item("erase-early"))["payload"] == EMAIL


async def test_a_report_on_an_erased_item_is_late_and_no_log_line_names_its_address(
    reports_api: ReportsApi, caplog: pytest.LogCaptureFixture
) -> None:
    api = reports_api
    item_id = await api.sent_item("erased-late")
    message_id = provider_idempotency_key(item_id)
    delivered = [
        grid_event(data(message_id, address, "Delivered"))
        for address in ("ada@example.com", "bob@example.com")
    ]
    answer = await api.http.post(api.events, params={"secret": SECRET}, json=delivered)
    assert answer.json()["applied"] == 2
    await api.stack.result(item_id)  # every recipient settled: the item ends, erasable
    erased = await api.http.delete("/v1/outboxes/tests/items/erased-late/payload")
    assert erased.status_code == 200, erased.text
    caplog.set_level(logging.INFO, logger="outbox.reports")

    bounce = data(message_id, "ada@example.com", "Bounced", "2026-11-24T00:00:00Z")
    late = await api.http.post(api.events, params={"secret": SECRET}, json=[grid_event(bounce)])

    assert (late.json()["late"], late.json()["unknown"]) == (1, 0)
    assert "ada@example.com" not in caplog.text
    item = await api.item("erased-late")
    assert {r["status"] for r in item["recipients"]} == {"delivered"}
    assert "ada@example.com" not in str(item)


async def test_while_rotating_the_replaced_events_secret_is_taken_until_its_window_ends(
    api_factory: Any,
) -> None:
    # The provider's subscription and every API process cannot change over at one instant:
    # reports still carrying the old secret are received until the grace window ends.
    new, old, older = "the-new-events-secret", SECRET, "an-older-events-secret"
    rotating = {
        "events_secret": new,
        "previous_events_secret": old,
        "previous_events_secret_until": datetime.now(UTC) + timedelta(hours=1),
    }
    api = await api_factory(email_overrides=rotating)
    url = f"/v1/destinations/{api.email.name}/events"

    for secret in (new, old):
        taken = await api.http.post(url, headers={"X-Events-Secret": secret}, json=[])
        assert taken.status_code == 200, (secret, taken.text)
    assert_problem(await api.http.post(url, params={"secret": older}, json=[]), 401)

    # Once the window has ended, only the new one.
    ended = {**rotating, "previous_events_secret_until": datetime.now(UTC) - timedelta(seconds=1)}
    after = await api_factory(email_overrides=ended)
    url = f"/v1/destinations/{after.email.name}/events"
    assert (await after.http.post(url, params={"secret": new}, json=[])).status_code == 200
    assert_problem(await after.http.post(url, params={"secret": old}, json=[]), 401)


@pytest.mark.parametrize("mode", ["item", "bulk"])
async def test_the_fakes_reports_after_the_window_reach_the_item(stack_factory, mode: str) -> None:
    """The whole loop, late: the fake's Event Grid posts the reports two seconds after the send,
    past the destination's half-second window, and the item's row still shows them (its
    workflow ended; in bulk mode its shard let it go)."""
    async with run_fake_provider(events_secret=SECRET) as fake:
        destination = email_destination(fake, events_secret=SECRET, report_window_s=0.5, mode=mode)
        stack = await stack_factory(destination)
        async with serve_stack(stack) as url:
            await fake.admin.change_faults(
                report_url=f"{url}/v1/destinations/{destination.name}/events?secret={SECRET}",
                report_delay_s=2.0,
            )
            async with httpx.AsyncClient(base_url=url) as http:
                key = f"late-{uuid.uuid4().hex[:8]}"
                body = {
                    **EMAIL,
                    "recipients": {
                        "to": [{"address": "ada@example.com"}, {"address": "bounce@example.com"}]
                    },
                }
                response = await http.post(
                    "/v1/outboxes/tests/items",
                    json={"destination": destination.name, "payload": body},
                    headers={"Idempotency-Key": key},
                )
                assert response.status_code == 202, response.text
                for _ in range(300):
                    item = (await http.get(f"/v1/outboxes/tests/items/{key}")).json()
                    statuses = {r["status"] for r in item["recipients"]}
                    if statuses and "pending" not in statuses:
                        break
                    await asyncio.sleep(0.05)
                events = (await http.get(f"/v1/outboxes/tests/items/{key}/events")).json()

        assert (await fake.admin.stats())["totals"]["reports_sent"] == 2
    assert item["status"] == "sent" and item["delivery"] == "bounced", item
    assert {r["address"]: r["status"] for r in item["recipients"]} == {
        "ada@example.com": "delivered",
        "bounce@example.com": "bounced",
    }
    assert [e["type"] for e in events][-2:] == ["delivery-report", "delivery-report"]
