"""The fake provider's Event Grid: delivery reports POSTed to a receiver, with their faults."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import httpx
import pytest
import pytest_asyncio
from azure.core.messaging import CloudEvent
from azure.eventgrid import EventGridEvent
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from activities.providers.acs_email import API_VERSION, sign_request
from devstack.fake_provider import FakeProvider, FaultConfig, run_fake_provider
from devstack.serving import serve_in_background
from tests.conftest import ACS_ACCESS_KEY

REPORT = "Microsoft.Communication.EmailDeliveryReportReceived"


@dataclass
class Receiver:
    """An Event Grid subscriber that records each POST; answers `failures` 500s first."""

    url: str = ""
    posts: list[tuple[dict[str, str], Any]] = field(default_factory=list)
    failures: int = 0

    async def wait_for(self, count: int, timeout_s: float = 5.0) -> None:
        for _ in range(int(timeout_s / 0.02)):
            if len(self.posts) >= count:
                return
            await asyncio.sleep(0.02)
        raise AssertionError(f"expected {count} POSTs, got {len(self.posts)}: {self.posts}")

    def events(self) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        for _, body in self.posts:
            found += body if isinstance(body, list) else [body]
        return found


@pytest_asyncio.fixture(loop_scope="session")
async def receiver() -> AsyncIterator[Receiver]:
    received = Receiver()

    async def record(request: Request) -> Response:
        if received.failures:
            received.failures -= 1
            return Response(status_code=500)
        received.posts.append((dict(request.headers), json.loads(await request.body())))
        return Response(status_code=200)

    app = Starlette(routes=[Route("/events", record, methods=["POST"])])
    async with serve_in_background(app) as url:
        received.url = f"{url}/events?secret=s3cret"
        yield received


async def send_email(fake: FakeProvider, key: str, recipients: list[str], **headers: str) -> str:
    """Submit an email to the fake; returns its operation URL."""
    body = json.dumps(
        {
            "senderAddress": "noreply@example.com",
            "recipients": {"to": [{"address": a} for a in recipients]},
            "content": {"subject": "s", "plainText": "p"},
        }
    ).encode()
    async with httpx.AsyncClient() as http:
        request = http.build_request(
            "POST",
            f"{fake.url}/emails:send",
            params={"api-version": API_VERSION},
            content=body,
            headers={"Operation-Id": key, "Content-Type": "application/json", **headers},
        )
        sign_request(request, ACS_ACCESS_KEY)
        response = await http.send(request)
        assert response.status_code == 202, response.text
        return str(response.headers["Operation-Location"])


async def poll(operation_url: str) -> str:
    async with httpx.AsyncClient() as http:
        request = http.build_request("GET", operation_url)
        sign_request(request, ACS_ACCESS_KEY)
        return str((await http.send(request)).json()["status"])


async def fake_reporting_to(receiver: Receiver, **faults: Any) -> AsyncIterator[FakeProvider]:
    async with run_fake_provider(
        FaultConfig(report_url=receiver.url, report_delay_s=0, **faults)
    ) as fake:
        yield fake


async def test_reports_follow_success_in_event_grid_schema(receiver: Receiver) -> None:
    async for fake in fake_reporting_to(receiver, running_polls=1):
        operation = await send_email(fake, "op-1", ["ada@example.com", "bounce@example.com"])
        assert await poll(operation) == "Running"
        await asyncio.sleep(0.2)
        assert receiver.posts == []  # nothing before the operation has succeeded
        assert await poll(operation) == "Succeeded"
        assert await poll(operation) == "Succeeded"  # a later poll sends nothing more
        await receiver.wait_for(1)
        await asyncio.sleep(0.2)
        stats = (await fake.admin.stats())["totals"]

    headers, body = receiver.posts[0]
    assert len(receiver.posts) == 1 and isinstance(body, list)
    assert headers["content-type"] == "application/json"
    assert headers["aeg-event-type"] == "Notification"
    events = [EventGridEvent.from_dict(event) for event in body]
    assert {e.event_type for e in events} == {REPORT}
    assert {(e.data["recipient"], e.data["status"]) for e in events} == {
        ("ada@example.com", "Delivered"),
        ("bounce@example.com", "Bounced"),
    }
    assert {e.data["messageId"] for e in events} == {"op-1"}
    assert all(datetime.fromisoformat(e.data["deliveryAttemptTimestamp"]) for e in events)
    assert stats["reports_sent"] == 2 and stats["report_failures"] == 0


async def test_cloudevents_single_and_batch(receiver: Receiver) -> None:
    async for fake in fake_reporting_to(receiver, report_schema="cloudevents"):
        await poll(await send_email(fake, "one", ["ada@example.com"]))
        await receiver.wait_for(1)
        await poll(await send_email(fake, "two", ["ada@example.com", "bob@example.com"]))
        await receiver.wait_for(2)

    (single_headers, single), (batch_headers, batch) = receiver.posts
    assert single_headers["content-type"].startswith("application/cloudevents+json")
    assert CloudEvent.from_dict(single).type == REPORT
    assert batch_headers["content-type"].startswith("application/cloudevents-batch+json")
    assert [CloudEvent.from_dict(e).data["recipient"] for e in batch] == [
        "ada@example.com",
        "bob@example.com",
    ]


async def test_duplicates_out_of_order_and_unknown_messages(receiver: Receiver) -> None:
    async for fake in fake_reporting_to(
        receiver, duplicate_reports=True, reports_out_of_order=True, unknown_report_rate=1.0
    ):
        await poll(await send_email(fake, "op-2", ["ada@example.com"]))
        await receiver.wait_for(4)

    posts = [body for _, body in receiver.posts]
    finals, interims = posts[0], posts[2]
    assert posts[0] == posts[1] and posts[2] == posts[3]  # each POSTed twice, same event ids
    assert [e["data"]["status"] for e in interims] == ["Quarantined"]
    assert (
        interims[0]["data"]["deliveryAttemptTimestamp"]
        < finals[0]["data"]["deliveryAttemptTimestamp"]
    )
    assert {e["data"]["messageId"] for e in finals} - {"op-2"}  # one stray message id


async def test_bounce_rate_and_report_before_success(receiver: Receiver) -> None:
    async for fake in fake_reporting_to(
        receiver, bounce_rate=1.0, report_before_success=True, running_polls=5, seed=3
    ):
        operation = await send_email(fake, "op-3", ["ada@example.com"])
        await receiver.wait_for(1)
        assert await poll(operation) == "Running"

    assert [e["data"]["status"] for e in receiver.events()] == ["Bounced"]


async def test_no_reports_for_a_failed_operation_and_retries_on_errors(
    receiver: Receiver,
) -> None:
    receiver.failures = 2
    async for fake in fake_reporting_to(receiver):
        failed = await send_email(
            fake, "bad", ["ada@example.com"], **{"X-Fake-Operation-Result": "Failed"}
        )
        assert await poll(failed) == "Failed"
        await poll(await send_email(fake, "good", ["bob@example.com"]))
        await receiver.wait_for(1)
        stats = (await fake.admin.stats())["totals"]

    assert [e["data"]["messageId"] for e in receiver.events()] == ["good"]
    assert receiver.posts[0][0]["aeg-delivery-count"] == "2"
    assert stats["reports_sent"] == 1


async def test_an_unknown_report_schema_is_refused() -> None:
    with pytest.raises(ValueError, match="report_schema"):
        FaultConfig(report_schema="xml")
    async with run_fake_provider() as fake, httpx.AsyncClient() as http:
        response = await http.put(f"{fake.url}/_admin/faults", json={"report_schema": "xml"})
    assert response.status_code == 422


async def test_the_fakes_log_never_shows_the_events_secret_of_a_report_url(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """httpx logs every request line with its URL: the fake's logging writes `secret=***`."""
    from devstack import fake_provider

    fake_provider.configure_logging()
    transport = httpx.MockTransport(lambda request: httpx.Response(200))
    with caplog.at_level("INFO", logger="httpx"):
        async with httpx.AsyncClient(transport=transport) as client:
            await client.post("http://api.test/v1/events/email?secret=dev-events-secret-x")
    assert "HTTP Request: POST" in caplog.text
    assert "dev-events-secret-x" not in caplog.text
    assert "secret=***" in caplog.text
