"""The fake provider's ACS SMS: `POST /sms`, with ACS's per-recipient repeatability and reports.

Mounted on the fake provider (`devstack/fake_provider.py`), whose signature check, fault steps,
counters and delivery log it shares; a request's key there is its send options' `tag` (the item's
message id, as `activities/providers/acs_sms.py` sets it).

Each recipient is answered on its own, as ACS does (`httpStatusCode`, `messageId`, `successful`,
`repeatabilityResult`). Repeatability follows ACS's documented rules: a request id is remembered
for the window (5 minutes unless `--sms-repeatability-window-s` or `PATCH /_admin/sms {"window_s":
...}` says otherwise) and then forgotten; a repeat inside it gets the first answer back, a repeat
that does not match the first is refused (400), and a first-sent time older than the window is
refused with 412, since ACS can no longer tell whether it sent it. A number in the unassigned
country code +999 is refused (400), as a number ACS cannot reach. With `--sms-report-url`, each
message sent with `enableDeliveryReport` is reported there as `Microsoft.Communication.SMSDelivery
ReportReceived` through the fake's Event Grid (`devstack/fake_reports.py`), as an Event Grid
subscription filtered to that event type would deliver it; `--bounce-rate` fails that share.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

from durable_outbox_temporal.contract.sms import MAX_SMS_RECIPIENTS, is_e164
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from devstack import fake_provider
from devstack.fake_reports import ReportSettings

log = logging.getLogger("fake_provider.sms")

# ACS tracks a repeatable request this long (its documented window).
REPEATABILITY_WINDOW_S = 300.0
UNREACHABLE_PREFIX = "+999"
# The delivery log's endpoint for SMS sends.
ENDPOINT = "sms"


@dataclass
class Remembered:
    """A recipient's first answer, kept for the window from when it was first seen."""

    fingerprint: tuple[str, str, str]
    answer: dict[str, Any]
    expires_at: float


@dataclass
class SmsMemory:
    """What the fake's SMS service remembers: request ids within the window."""

    window_s: float = REPEATABILITY_WINDOW_S
    requests: dict[str, Remembered] = field(default_factory=dict)

    def recall(self, request_id: str, now: float) -> Remembered | None:
        self._forget_expired(now)
        remembered = self.requests.get(request_id)
        if remembered is not None and remembered.expires_at <= now:
            del self.requests[request_id]  # forgotten, as ACS forgets
            return None
        return remembered

    def _forget_expired(self, now: float) -> None:
        """Drop what the window has passed, oldest first: the dict is in arrival order."""
        while self.requests:
            oldest = next(iter(self.requests))
            if self.requests[oldest].expires_at > now:
                return
            del self.requests[oldest]


def routes(state: fake_provider.FakeProviderState) -> list[BaseRoute]:
    """The SMS routes over the fake provider's `state`."""

    async def send(request: Request) -> Response:
        body = await request.body()
        document = _json(body)
        options = document.get("smsSendOptions")
        options = options if isinstance(options, dict) else {}
        key = str(options.get("tag") or uuid.uuid4())
        stats = state.record(key, request.url.path, "submit")
        if not fake_provider._valid_acs_signature(request, body, state.acs_access_key):
            return fake_provider._acs_error(
                401, "Denied", "Denied by the HMAC-SHA256 authentication policy"
            )
        problem = _body_problem(document)
        if problem is not None:
            log.info("ACS SMS send %s -> 400 (%s)", key, problem)
            return fake_provider._acs_error(400, "BadRequest", problem)
        step = state.next_step(key, request, ENDPOINT)
        fault = await fake_provider._apply_fault(state, step, stats)
        if fault is not None:
            log.info("ACS SMS send %s -> %s (injected)", key, fault.status_code)
            return fault
        answers = [
            _answer(state, key, document, recipient, request, body)
            for recipient in document["smsRecipients"]
        ]
        answer = JSONResponse({"value": answers}, 202)
        if step.drop_response:
            log.info("ACS SMS send %s -> 202, connection dropped (injected)", key)
            return fake_provider.LostResponse(answer)
        log.info("ACS SMS send %s -> 202 (%d recipients)", key, len(answers))
        return answer

    async def admin(request: Request) -> Response:
        """`GET` the SMS service's window; `PATCH {"window_s": ...}` to change it."""
        if request.method == "PATCH":
            changes = await request.json()
            window_s = changes.get("window_s") if isinstance(changes, dict) else None
            if not isinstance(window_s, int | float) or window_s <= 0:
                return JSONResponse({"error": "window_s must be a number above 0"}, 422)
            state.sms.window_s = float(window_s)
        return JSONResponse({"window_s": state.sms.window_s, "remembered": len(state.sms.requests)})

    return [
        Route("/sms", send, methods=["POST"]),
        Route("/_admin/sms", admin, methods=["GET", "PATCH"]),
    ]


def _answer(
    state: fake_provider.FakeProviderState,
    key: str,
    document: dict[str, Any],
    recipient: dict[str, Any],
    request: Request,
    body: bytes,
) -> dict[str, Any]:
    """One recipient's entry in the answer, sending its message if it is new."""
    number = str(recipient.get("to"))
    request_id, first_sent = (
        recipient.get("repeatabilityRequestId"),
        recipient.get("repeatabilityFirstSent"),
    )
    now = time.time()
    repeatable = request_id is not None or first_sent is not None
    if repeatable:
        refused = _repeatability_problem(request_id, first_sent, state.sms.window_s, now)
        if refused is not None:
            status, message = refused
            return _failed(number, status, message, "rejected")
        remembered = state.sms.recall(str(request_id), now)
        fingerprint = (number, str(document["from"]), str(document["message"]))
        if remembered is not None:
            if remembered.fingerprint != fingerprint:
                return _failed(
                    number, 400, "The repeated request does not match the first.", "rejected"
                )
            return remembered.answer
    if not is_e164(number):
        answer = _failed(number, 400, "Invalid To phone number format.", None)
    elif number.startswith(UNREACHABLE_PREFIX):
        answer = _failed(number, 400, "The recipient's number cannot receive messages.", None)
    else:
        answer = {
            "to": number,
            "messageId": f"Outgoing_{datetime.now(UTC):%Y%m%d%H%M%S}{uuid.uuid4()}_noam",
            "httpStatusCode": 202,
            "successful": True,
        }
        _deliver(state, key, document, answer, request, body)
    if repeatable:
        answer["repeatabilityResult"] = "accepted"
        state.sms.requests[str(request_id)] = Remembered(
            fingerprint, answer, now + state.sms.window_s
        )
    return answer


def _deliver(
    state: fake_provider.FakeProviderState,
    key: str,
    document: dict[str, Any],
    answer: dict[str, Any],
    request: Request,
    body: bytes,
) -> None:
    """Count the message as sent and, if asked for, report its fate later."""
    # One delivery per message: a key per item and number, so each number's repeat shows.
    state.log_delivery(f"{key}/{answer['to']}", ENDPOINT, request, body)
    options = document.get("smsSendOptions") or {}
    faults = state.faults
    if faults.sms_report_url is None or options.get("enableDeliveryReport") is not True:
        return
    settings = ReportSettings(
        url=fake_provider.with_secret(faults.sms_report_url, state.events_secret),
        schema=faults.report_schema,
        delay_s=faults.report_delay_s,
        bounce_rate=faults.bounce_rate,
        duplicate=faults.duplicate_reports,
        out_of_order=False,
        unknown_rate=0.0,
    )
    failed = state.rng.random() < faults.bounce_rate
    at = datetime.now(UTC).isoformat(timespec="microseconds")
    data = {
        "messageId": answer["messageId"],
        "from": document["from"],
        "to": answer["to"],
        "deliveryStatus": "Failed" if failed else "Delivered",
        "deliveryStatusDetails": "Not delivered (injected failure)" if failed else "No error.",
        "receivedTimestamp": at,
        "deliveryAttempts": [
            {
                "timestamp": at,
                "segmentsSucceeded": 0 if failed else 1,
                "segmentsFailed": int(failed),
            }
        ],
    }
    if options.get("tag") is not None:
        data["tag"] = options["tag"]
    state.reports.schedule_sms(settings, data)


def _repeatability_problem(
    request_id: object, first_sent: object, window_s: float, now: float
) -> tuple[int, str] | None:
    """Why ACS refuses a recipient's repeatability fields: (status, message), or None."""
    if not isinstance(request_id, str) or not _is_uuid(request_id):
        return 400, "Invalid RepeatabilityRequestId: a GUID is required."
    if not isinstance(first_sent, str):
        return 400, "Missing RepeatabilityFirstSent."
    try:
        sent_at = parsedate_to_datetime(first_sent).timestamp()
    except (TypeError, ValueError, IndexError):
        return 400, "Invalid RepeatabilityFirstSent: an IMF-fixdate is required."
    # An IMF-fixdate has whole seconds: the request may have gone up to a second after it.
    if now - (sent_at + 1.0) > window_s:
        return 412, "Repeatability-First-Sent is outside the tracked window."
    return None


def _is_uuid(value: str) -> bool:
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return len(value) == 36


def _failed(number: str, status: int, message: str, repeatability: str | None) -> dict[str, Any]:
    answer: dict[str, Any] = {
        "to": number,
        "httpStatusCode": status,
        "errorMessage": message,
        "successful": False,
    }
    if repeatability is not None:
        answer["repeatabilityResult"] = repeatability
    return answer


def _body_problem(document: dict[str, Any]) -> str | None:
    """Why ACS refuses the whole request with a 400; None if it reads each recipient."""
    if not isinstance(document.get("from"), str) or not document["from"]:
        return "The from field is required."
    if not isinstance(document.get("message"), str):
        return "The message field is required."
    recipients = document.get("smsRecipients")
    if not isinstance(recipients, list) or not recipients:
        return "The smsRecipients field must have at least one recipient."
    if len(recipients) > MAX_SMS_RECIPIENTS:
        return f"The smsRecipients field has more than {MAX_SMS_RECIPIENTS} recipients."
    if not all(isinstance(r, dict) and isinstance(r.get("to"), str) for r in recipients):
        return "Each smsRecipients entry must have a to field."
    return None


def _json(body: bytes) -> dict[str, Any]:
    try:
        document = json.loads(body)
    except ValueError:
        return {}
    return document if isinstance(document, dict) else {}
