"""The fake provider's Event Grid: ACS email and SMS delivery reports POSTed to a callback URL.

Real ACS reports each recipient's fate as a `Microsoft.Communication.EmailDeliveryReportReceived`
event that Event Grid delivers to a subscriber; this sends the same events, in the Event Grid
schema or as CloudEvents 1.0, with the faults a receiver must survive: bounces, duplicates,
reports out of order, reports before the operation has succeeded, reports nobody asked for.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from configuration.redaction import redact
from configuration.tls import shared_tls_context

log = logging.getLogger("fake_provider.reports")

EVENT_TYPE = "Microsoft.Communication.EmailDeliveryReportReceived"
SMS_EVENT_TYPE = "Microsoft.Communication.SMSDeliveryReportReceived"
TOPIC = (
    "/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/fake/providers"
    "/microsoft.communication/communicationservices/fake-acs"
)
SCHEMAS = ("eventgrid", "cloudevents")
DELIVERED_DETAIL = "250 2.0.0 OK"
BOUNCED_DETAIL = "550 5.1.1 mailbox unavailable (injected bounce)"
QUARANTINED_DETAIL = "held for review (injected interim report)"
# Event Grid retries a failed delivery on a growing schedule (10 s, 30 s, 1 min, ... for a day);
# the fake tries a few times on the same shape, quickly: after 0.5, 1, 2 and 4 s.
ATTEMPTS = 5
RETRY_DELAY_S = 0.5


@dataclass
class ReportSettings:
    """How one operation's reports go out (a snapshot of the fake's fault config)."""

    url: str
    schema: str
    delay_s: float
    bounce_rate: float
    duplicate: bool
    out_of_order: bool
    unknown_rate: float


def bounces(address: str) -> bool:
    """Addresses whose local part starts with `bounce` always bounce (like SES's simulator)."""
    return address.partition("@")[0].lower().startswith("bounce")


class ReportSender:
    """Builds and POSTs delivery reports in background tasks; counts what it sent."""

    def __init__(self) -> None:
        self.sent = 0
        self.failures = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._client: httpx.AsyncClient | None = None

    def schedule(
        self,
        settings: ReportSettings,
        message_id: str,
        sender: str,
        recipients: list[str],
        rng: random.Random,
    ) -> None:
        """Send the reports of one succeeded operation after `settings.delay_s`."""
        finals, interims = [], []
        now = datetime.now(UTC)
        for address in recipients:
            bounced = bounces(address) or rng.random() < settings.bounce_rate
            status, detail = (
                ("Bounced", BOUNCED_DETAIL) if bounced else ("Delivered", DELIVERED_DETAIL)
            )
            finals.append(_data(sender, address, message_id, status, detail, now))
            if settings.out_of_order:
                earlier = now - timedelta(seconds=1)
                interims.append(
                    _data(sender, address, message_id, "Quarantined", QUARANTINED_DETAIL, earlier)
                )
        if rng.random() < settings.unknown_rate:
            stray = str(uuid.uuid4())
            finals.append(
                _data(
                    sender,
                    recipients[0] if recipients else "nobody@example.com",
                    stray,
                    "Delivered",
                    DELIVERED_DETAIL,
                    now,
                )
            )
        posts = [_events(finals, settings.schema)]
        if interims:
            posts.append(_events(interims, settings.schema))  # older news, delivered last
        self._start(settings, posts)

    def schedule_sms(self, settings: ReportSettings, data: dict[str, Any]) -> None:
        """Send one SMS message's report (its data from `devstack/fake_sms.py`) after
        `settings.delay_s`."""
        self._start(settings, [_events([data], settings.schema, SMS_EVENT_TYPE)])

    def _start(self, settings: ReportSettings, posts: list[list[dict[str, Any]]]) -> None:
        if settings.duplicate:
            posts = [post for post in posts for _ in range(2)]
        task = asyncio.create_task(self._send(settings, posts))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, settings: ReportSettings, posts: list[list[dict[str, Any]]]) -> None:
        await asyncio.sleep(settings.delay_s)
        for events in posts:
            if events:
                await self._post(settings, events)

    async def _post(self, settings: ReportSettings, events: list[dict[str, Any]]) -> None:
        body: dict[str, Any] | list[dict[str, Any]]
        if settings.schema == "eventgrid":
            body, content_type = events, "application/json"
        elif len(events) == 1:
            body, content_type = events[0], "application/cloudevents+json; charset=utf-8"
        else:
            body, content_type = events, "application/cloudevents-batch+json; charset=utf-8"
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=10, verify=shared_tls_context())
        for attempt in range(ATTEMPTS):
            headers = {
                "Content-Type": content_type,
                "aeg-event-type": "Notification",
                "aeg-subscription-name": "FAKE-PROVIDER",
                "aeg-delivery-count": str(attempt),
            }
            try:
                response = await self._client.post(
                    settings.url, content=json.dumps(body), headers=headers
                )
                if response.is_success:
                    self.sent += len(events)
                    return
                problem = f"HTTP {response.status_code}"
            except httpx.HTTPError as err:
                problem = type(err).__name__
            log.info("delivery report POST failed (%s), attempt %d", problem, attempt + 1)
            if attempt + 1 < ATTEMPTS:
                await asyncio.sleep(RETRY_DELAY_S * 2**attempt)
        self.failures += 1
        log.warning("gave up delivering %d reports to %s", len(events), redact(settings.url))

    async def close(self) -> None:
        """Cancel reports not yet sent and close the HTTP client."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._client is not None:
            await self._client.aclose()
            self._client = None


def _data(
    sender: str, recipient: str, message_id: str, status: str, detail: str, at: datetime
) -> dict[str, Any]:
    return {
        "sender": sender,
        "recipient": recipient,
        "messageId": message_id,
        "status": status,
        "deliveryStatusDetails": {"statusMessage": detail},
        "deliveryAttemptTimestamp": at.isoformat(timespec="microseconds"),
    }


def _events(
    reports: list[dict[str, Any]], schema: str, event_type: str = EVENT_TYPE
) -> list[dict[str, Any]]:
    events = []
    for data in reports:
        event_id = str(uuid.uuid4())
        subject = (
            f"phonenumber/{data['to']}"
            if event_type == SMS_EVENT_TYPE
            else f"sender/{data['sender']}/message/{data['messageId']}"
        )
        event_time = datetime.now(UTC).isoformat().replace("+00:00", "Z")
        if schema == "eventgrid":
            events.append(
                {
                    "id": event_id,
                    "topic": TOPIC,
                    "subject": subject,
                    "eventType": event_type,
                    "eventTime": event_time,
                    "dataVersion": "1.0",
                    "metadataVersion": "1",
                    "data": data,
                }
            )
        else:
            events.append(
                {
                    "specversion": "1.0",
                    "id": event_id,
                    "source": TOPIC,
                    "subject": subject,
                    "type": event_type,
                    "time": event_time,
                    "datacontenttype": "application/json",
                    "data": data,
                }
            )
    return events
