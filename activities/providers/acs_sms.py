"""Azure Communication Services SMS: `POST {endpoint}/sms`, one request for up to 100 numbers.

Each recipient carries its own repeatability fields: `repeatabilityRequestId`, derived from the
item's idempotency key and the number, and `repeatabilityFirstSent`, the time of the key's first
attempt, so every attempt repeats both. Within ACS's window (5 minutes) a repeat is answered
with the first result instead of a second message; past it ACS refuses the repeat with 412, not
knowing whether it sent it, and the number stays pending until its delivery report settles it.

The answer is per recipient (`messageId`, `httpStatusCode`, `successful`), and so is the item's
recipients view: a number ACS took is `pending` (its detail names the message id) until its
delivery report; one refused for good is `failed` with ACS's status and message. A recipient
that failed transiently (429, 5xx) fails the attempt, whose retry repeats the request (the
others are answered from ACS's memory); the item fails only if every recipient was refused.

Delivery reports (`Microsoft.Communication.SMSDeliveryReportReceived`) carry each message's
`tag`, which the provider sets to the item's message id: that is how a report finds its item
(`api/eventgrid.py`). Requests are signed as for email (`activities/providers/acs_signing.py`).
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from email.utils import formatdate
from typing import Any, ClassVar

import httpx
from durable_outbox_temporal.contract.item import (
    PollRequest,
    PollResult,
    Recipient,
    RecipientStatus,
    SubmitRequest,
    SubmitResult,
)
from durable_outbox_temporal.contract.sms import PROVIDER_TAG, check_sms_payload, sms_recipients

from activities.providers.acs_signing import sign_request
from activities.providers.base import (
    TRANSIENT_STATUS_CODES,
    PermanentProviderError,
    TransientProviderError,
    check_retry_after,
    parse_retry_after,
    probe_url,
    raise_for_status,
    send,
)
from configuration.providers import AcsSmsSettings

API_VERSION = "2021-03-07"
# The namespace of each recipient's `repeatabilityRequestId` (a UUID, as ACS requires).
_REPEATABILITY_NAMESPACE = uuid.UUID("4f1c1a52-5d0e-4d7e-9a51-7b0f3f0c9c11")
# ACS's answer for a repeat whose first-sent time is older than its window (5 minutes): it no
# longer knows whether it sent that message.
PRECONDITION_FAILED = 412
# A first attempt whose first-sent time is older than this (a backlog under the destination's
# rate) sends its own time instead, safely inside ACS's 5-minute window.
FRESH_FIRST_SENT = timedelta(minutes=4)


def repeatability_request_id(idempotency_key: str, number: str) -> str:
    """The recipient's `repeatabilityRequestId`: the same for every attempt of the item."""
    return str(uuid.uuid5(_REPEATABILITY_NAMESPACE, f"{idempotency_key}\n{number}"))


def first_sent_at(request: SubmitRequest, now: datetime | None = None) -> datetime:
    """The recipients' `repeatabilityFirstSent`: when the key's first attempt was submitted, the
    same on every retry; now for a first attempt that waited in its queue too long for that
    time to pass ACS's check (nothing can have been sent under the key before it)."""
    now = now or datetime.now(UTC)
    first = request.first_submitted_at
    if first is None or (request.attempt == 1 and now - first > FRESH_FIRST_SENT):
        return now
    return first


class AcsSmsProvider:
    """Sends ACS SMS requests; delivered once ACS took the message for at least one number."""

    kind: ClassVar[str] = "acs-sms"

    def __init__(self, settings: AcsSmsSettings, http_client: httpx.AsyncClient) -> None:
        self._endpoint = settings.endpoint.rstrip("/")
        self._access_key = settings.access_key
        self._max_retry_after_s = settings.max_retry_after_s
        self._headers = settings.headers
        self._timeout = httpx.Timeout(settings.timeout_s)
        self._client = http_client

    async def submit(self, request: SubmitRequest) -> SubmitResult:
        try:
            check_sms_payload(request.payload)
        except ValueError as err:
            # Enqueue refuses these; an item from before this check fails rather than retries.
            raise PermanentProviderError(f"ACS SMS send: {err}") from None
        body = self._body(request)
        http_request = self._client.build_request(
            "POST",
            f"{self._endpoint}/sms",
            params={"api-version": API_VERSION},
            content=json.dumps(body, separators=(",", ":")).encode(),
            headers={**self._headers, "Content-Type": "application/json"},
            timeout=self._timeout,
        )
        sign_request(http_request, self._access_key)
        response = await send(self._client, http_request, "ACS SMS send")
        raise_for_status(response, "ACS SMS send", self._max_retry_after_s)
        results = _results(response, sms_recipients(request.payload))
        transient = [r for r in results if not r.successful and r.status in TRANSIENT_STATUS_CODES]
        if transient:
            raise TransientProviderError(
                f"ACS SMS send: {_describe(transient)}",
                status_code=transient[0].status,
                retry_after_s=check_retry_after(
                    parse_retry_after(response.headers.get("Retry-After")),
                    self._max_retry_after_s,
                    "ACS SMS send",
                    transient[0].status,
                ),
            )
        refused = [r for r in results if not r.successful and r.status != PRECONDITION_FAILED]
        if len(refused) == len(results):
            raise PermanentProviderError(
                f"ACS SMS send: every recipient refused: {_describe(refused)}",
                status_code=refused[0].status,
            )
        # Without reports nothing settles a pending number: only the refused ones are shown.
        reports = body["smsSendOptions"]["enableDeliveryReport"]
        shown = results if reports else refused
        return SubmitResult(
            delivered=True,
            provider_message_id=request.idempotency_key,
            recipients=[r.to for r in shown],
            recipient_results=[r.recipient() for r in shown],
        )

    def _body(self, request: SubmitRequest) -> dict[str, Any]:
        """The send body: the payload with each recipient's repeatability fields and the tag
        delivery reports carry back (delivery reports on unless the payload turns them off)."""
        first_sent = formatdate(first_sent_at(request).timestamp(), usegmt=True)
        options = dict(request.payload.get("smsSendOptions") or {})
        options.setdefault("enableDeliveryReport", True)
        options[PROVIDER_TAG] = request.idempotency_key
        return {
            **request.payload,
            "smsRecipients": [
                {
                    "to": number,
                    "repeatabilityRequestId": repeatability_request_id(
                        request.idempotency_key, number
                    ),
                    "repeatabilityFirstSent": first_sent,
                }
                for number in sms_recipients(request.payload)
            ],
            "smsSendOptions": options,
        }

    async def probe(self) -> str:
        """`HEAD` of the endpoint: unsigned, it sends nothing and reaches no phone."""
        return await probe_url(self._client, f"{self._endpoint}/", self._timeout, "ACS SMS")

    async def poll(self, request: PollRequest) -> PollResult:
        raise PermanentProviderError("ACS SMS has no long-running operation to poll")


class _RecipientResult:
    """One recipient's entry in ACS's answer."""

    def __init__(self, entry: dict[str, Any]) -> None:
        self.to = str(entry.get("to", ""))
        status = entry.get("httpStatusCode")
        self.status = status if isinstance(status, int) else 0
        self.successful = entry.get("successful") is True
        message_id = entry.get("messageId")
        self.message_id = str(message_id) if message_id else None
        self.error = str(entry.get("errorMessage") or "")

    def recipient(self) -> Recipient:
        """What the item's recipients view shows of the recipient until its delivery report."""
        if self.successful:
            return Recipient(
                address=self.to,
                status=RecipientStatus.PENDING,
                detail=f"accepted as message {self.message_id}" if self.message_id else None,
            )
        if self.status == PRECONDITION_FAILED:
            # Past the window ACS cannot tell whether an earlier attempt sent it: its delivery
            # report (tagged with the item's message id) settles it, if one comes.
            return Recipient(
                address=self.to,
                status=RecipientStatus.PENDING,
                detail=f"HTTP 412: {self.error or 'repeatability window passed'}; sent by an"
                " earlier attempt or not at all, its delivery report says which",
            )
        return Recipient(
            address=self.to,
            status=RecipientStatus.FAILED,
            detail=f"HTTP {self.status}: {self.error}".rstrip(": "),
        )


def _results(response: httpx.Response, numbers: list[str]) -> list[_RecipientResult]:
    """Each recipient's result, checked to answer for exactly the numbers sent."""
    try:
        body = response.json()
    except ValueError:
        body = None
    entries = body.get("value") if isinstance(body, dict) else None
    if response.status_code != 202 or not isinstance(entries, list):
        raise PermanentProviderError(
            f"ACS SMS send: expected 202 with a result per recipient, got"
            f" {response.status_code}: {response.text[:200]}",
            status_code=response.status_code,
        )
    results = [_RecipientResult(entry) for entry in entries if isinstance(entry, dict)]
    if sorted(result.to for result in results) != sorted(numbers):
        raise PermanentProviderError(
            "ACS SMS send: the answer's recipients are not the numbers sent"
            f" ({len(results)} results for {len(numbers)} numbers)",
            status_code=response.status_code,
        )
    return results


def _describe(results: list[_RecipientResult]) -> str:
    return "; ".join(f"{r.to}: HTTP {r.status} {r.error}".rstrip() for r in results[:5]) + (
        f" (and {len(results) - 5} more)" if len(results) > 5 else ""
    )
