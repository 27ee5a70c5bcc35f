"""Azure Event Grid deliveries: the Event Grid schema and CloudEvents 1.0, read with the
`azure-eventgrid` package, and ACS email and SMS delivery reports taken out of them.

Event Grid posts an array of events (Event Grid schema), or one CloudEvent
(`application/cloudevents+json`), or a batch of them (`application/cloudevents-batch+json`).
A subscription to an Event Grid-schema endpoint starts with a validation event whose code must
be echoed back; a CloudEvents subscription validates with an `OPTIONS` request instead.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from azure.core.messaging import CloudEvent
from azure.eventgrid import EventGridEvent, SystemEventNames
from durable_outbox_temporal.contract.item import DeliveryReport, RecipientStatus
from durable_outbox_temporal.validation import MAX_JSON_DEPTH

from api.dates import in_utc
from api.errors import ApiProblem, json_nesting_exceeds, too_deeply_nested

log = logging.getLogger("outbox.api.events")

VALIDATION_EVENT = SystemEventNames.EventGridSubscriptionValidationEventName.value
EMAIL_DELIVERY_REPORT = SystemEventNames.AcsEmailDeliveryReportReceivedEventName.value
SMS_DELIVERY_REPORT = SystemEventNames.AcsSmsDeliveryReportReceivedEventName.value

# ACS's statuses, as it spells them, to ours.
_ACS_STATUSES = {
    "Delivered": RecipientStatus.DELIVERED,
    "Expanded": RecipientStatus.EXPANDED,
    "Bounced": RecipientStatus.BOUNCED,
    "Suppressed": RecipientStatus.SUPPRESSED,
    "FilteredSpam": RecipientStatus.FILTERED_SPAM,
    "Quarantined": RecipientStatus.QUARANTINED,
    "Failed": RecipientStatus.FAILED,
}
# An SMS report's `deliveryStatus`, to ours.
_SMS_STATUSES = {"Delivered": RecipientStatus.DELIVERED, "Failed": RecipientStatus.FAILED}
_MAX_DETAIL = 1000
_MAX_ID = 200
_MAX_ADDRESS = 320  # RFC 3696's longest email address


@dataclass
class Delivery:
    """What one POST from Event Grid carried."""

    # Set when the POST is Event Grid's subscription handshake: the code to echo back.
    validation_code: str | None = None
    reports: list[DeliveryReport] = field(default_factory=list)
    # Events of other types (the subscription may carry more than delivery reports).
    ignored: int = 0
    # Delivery-report events whose data is not a report we can read (logged).
    invalid: int = 0


def read_delivery(body: bytes) -> Delivery:
    """Parse a POSTed body; raises a 400 problem when it is not an Event Grid delivery (422 when
    it nests too deeply to parse safely)."""
    if json_nesting_exceeds(body, MAX_JSON_DEPTH):
        # Whatever its content type says: Event Grid's types are not all `application/json`.
        raise too_deeply_nested(MAX_JSON_DEPTH)
    try:
        document = json.loads(body)
    except ValueError as err:
        raise ApiProblem(400, "malformed-json", "Malformed JSON", "the body is not JSON") from err
    if isinstance(document, dict):
        events = [_cloud_event(document, 0)]
    elif isinstance(document, list) and all(isinstance(entry, dict) for entry in document):
        events = [
            _cloud_event(entry, index) if "specversion" in entry else _grid_event(entry, index)
            for index, entry in enumerate(document)
        ]
    else:
        raise _not_a_delivery("expected an array of events or one CloudEvent object")
    delivery = Delivery()
    for event_type, event_id, data in events:
        if event_type == VALIDATION_EVENT:
            code = data.get("validationCode") if isinstance(data, dict) else None
            if not isinstance(code, str) or not code:
                raise _not_a_delivery("subscription validation event without a validationCode")
            delivery.validation_code = code
        elif event_type in (EMAIL_DELIVERY_REPORT, SMS_DELIVERY_REPORT):
            read = _email_report if event_type == EMAIL_DELIVERY_REPORT else _sms_report
            report = read(event_id, data)
            if report is None:
                delivery.invalid += 1
            else:
                delivery.reports.append(report)
        else:
            delivery.ignored += 1
    return delivery


def _grid_event(entry: dict[str, Any], index: int) -> tuple[str, str, Any]:
    missing = [name for name in ("id", "eventType", "data") if name not in entry]
    if missing:
        raise _not_a_delivery(f"event {index}: missing {', '.join(missing)}")
    try:
        event = EventGridEvent.from_dict(entry)
    except (ValueError, LookupError, TypeError, AttributeError) as err:
        # E.g. an `eventTime` that is a number: azure's DeserializationError is a ValueError.
        raise _not_a_delivery(f"event {index}: not an Event Grid event: {err}") from err
    return str(event.event_type), str(event.id), event.data


def _cloud_event(entry: dict[str, Any], index: int) -> tuple[str, str, Any]:
    try:
        event: CloudEvent[Any] = CloudEvent.from_dict(entry)
    except (ValueError, LookupError, TypeError, AttributeError) as err:
        # E.g. a `time` that is a number (TypeError) or not a date (IndexError).
        raise _not_a_delivery(f"event {index}: not a CloudEvent: {err}") from err
    return str(event.type), str(event.id), event.data


def _email_report(event_id: str, data: Any) -> DeliveryReport | None:
    """The report in an `EmailDeliveryReportReceived` event's data; None (logged) if unreadable."""
    try:
        if not isinstance(data, dict):
            raise ValueError("data is not an object")
        status = _ACS_STATUSES[str(data["status"])]
        message_id, recipient = str(data["messageId"]), str(data["recipient"])
        if not 0 < len(message_id) <= _MAX_ID or not 0 < len(recipient) <= _MAX_ADDRESS:
            raise ValueError("messageId or recipient empty or too long")
        at = datetime.fromisoformat(str(data["deliveryAttemptTimestamp"]))
        if at.tzinfo is None:
            raise ValueError("deliveryAttemptTimestamp has no time zone")
        at = in_utc(at)
        details = data.get("deliveryStatusDetails") or {}
        detail = details.get("statusMessage") if isinstance(details, dict) else None
    except (KeyError, ValueError, TypeError) as err:
        log.warning("unreadable email delivery report %s: %s", event_id, err)
        return None
    return DeliveryReport(
        message_id=message_id,
        recipient=recipient,
        status=status,
        at=at,
        detail=str(detail)[:_MAX_DETAIL] if detail else None,
        report_id=event_id,
    )


def _sms_report(event_id: str, data: Any) -> DeliveryReport | None:
    """The report in an `SMSDeliveryReportReceived` event's data; None (logged) if unreadable.

    Its `tag` is the item's message id (`activities/providers/acs_sms.py` sets it); a report
    without one is on a message sent some other way, and its own `messageId` finds no item."""
    try:
        if not isinstance(data, dict):
            raise ValueError("data is not an object")
        status = _SMS_STATUSES[str(data["deliveryStatus"])]
        message_id, recipient = str(data.get("tag") or data["messageId"]), str(data["to"])
        if not 0 < len(message_id) <= _MAX_ID or not 0 < len(recipient) <= _MAX_ADDRESS:
            raise ValueError("tag, messageId or to empty or too long")
        attempts = data.get("deliveryAttempts") or []
        last = attempts[-1] if isinstance(attempts, list) and attempts else None
        when = last.get("timestamp") if isinstance(last, dict) else None
        at = datetime.fromisoformat(str(when or data["receivedTimestamp"]))
        if at.tzinfo is None:
            raise ValueError("the report's timestamp has no time zone")
        detail = data.get("deliveryStatusDetails")
    except (KeyError, ValueError, TypeError) as err:
        log.warning("unreadable SMS delivery report %s: %s", event_id, err)
        return None
    return DeliveryReport(
        message_id=message_id,
        recipient=recipient,
        status=status,
        at=in_utc(at),
        detail=str(detail)[:_MAX_DETAIL] if detail else None,
        report_id=event_id,
    )


def _not_a_delivery(detail: str) -> ApiProblem:
    return ApiProblem(400, "not-an-event-grid-delivery", "Not an Event Grid delivery", detail)
