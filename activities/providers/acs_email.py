"""Azure Communication Services Email: `POST {endpoint}/emails:send`, then poll the operation.

Requests are signed with ACS's HMAC-SHA256 scheme (`activities/providers/acs_signing.py`, the one
the official SDK uses), so the real service, the real SDK's peers and our fake provider all
accept them.

Exactly once across retries: each send carries the item's key as `Operation-Id` and ACS's
repeatable-request headers, `Repeatability-Request-Id` and `Repeatability-First-Sent` (the time
of the item's first submit attempt, the same on every retry). ACS answers a repeat within its
window (5 minutes) with the first send's answer, and refuses one older than that with 412. So a
retry past the window, and any 412, first looks the operation up by its id (the reconcile
step): an operation that exists is adopted and polled; only one ACS has no trace of is sent
again, as a new repeatable request (docs/explanation/provider-dedupe.md).
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from email.utils import formatdate
from typing import Any, ClassVar
from urllib.parse import quote, urljoin, urlsplit

import httpx
from durable_outbox_temporal.contract.item import (
    OperationStatus,
    PollRequest,
    PollResult,
    SubmitRequest,
    SubmitResult,
)

from activities.providers.acs_signing import sign_request
from activities.providers.base import (
    PermanentProviderError,
    TransientProviderError,
    check_retry_after,
    json_object,
    origin,
    parse_retry_after,
    past_window,
    probe_url,
    raise_for_status,
    send,
)
from configuration.providers import AcsEmailSettings

API_VERSION = "2023-03-31"
_STATUSES = {status.value: status for status in OperationStatus}
# `Repeatability-Request-Id` must be a GUID: derived from the item's key (and, for a send made
# anew after the window, from its own first-sent time), so every retry names the same request.
_REPEATABILITY_NAMESPACE = uuid.UUID("6f1f5a52-4d0e-4c55-9a43-2a7c1f0e8b31")


class AcsEmailProvider:
    """Sends ACS email requests; `Operation-Id` carries the item's stable idempotency key."""

    kind: ClassVar[str] = "acs-email"
    # False only in tests: the naive retry the reconcile step replaces (the first send's request
    # again, past the window too), to show what the step prevents.
    reconcile: bool = True

    def __init__(self, settings: AcsEmailSettings, http_client: httpx.AsyncClient) -> None:
        self._endpoint = settings.endpoint.rstrip("/")
        self._origin = origin(urlsplit(self._endpoint))
        self._access_key = settings.access_key
        self._max_retry_after_s = settings.max_retry_after_s
        self._repeatability_window = timedelta(seconds=settings.repeatability_window_s)
        self._headers = settings.headers
        self._timeout = httpx.Timeout(settings.timeout_s)
        self._client = http_client

    async def submit(self, request: SubmitRequest) -> SubmitResult:
        try:
            body = json.dumps(request.payload, separators=(",", ":"), allow_nan=False).encode()
        except ValueError as err:
            # NaN or Infinity: ACS's JSON parser refuses them, and no retry changes that.
            raise PermanentProviderError(f"ACS send: the payload is not JSON: {err}") from None
        now = datetime.now(UTC)
        first_sent = request.first_submitted_at
        if self.reconcile and past_window(request, now, self._repeatability_window):
            # An earlier attempt may have been accepted with its answer lost, and ACS no longer
            # dedupes a repeat of it: ask before sending.
            adopted = await self.find_operation(request)
            if adopted is not None:
                return adopted
            first_sent = None
        response = await self._send(request, body, first_sent, now)
        if response.status_code == 412 and self.reconcile:
            # ACS says the first send is beyond its window (its clock ahead of ours): the same
            # lookup, then a send anew only if it has no trace of the operation.
            adopted = await self.find_operation(request)
            if adopted is not None:
                return adopted
            response = await self._send(request, body, None, datetime.now(UTC))
        if response.status_code == 409:
            # A repeat of a send ACS is still executing: its answer comes on the next try.
            raise TransientProviderError(
                "ACS send: HTTP 409: the first send of this request is still in progress",
                status_code=409,
                retry_after_s=self._retry_after(response, "ACS send"),
            )
        raise_for_status(response, "ACS send", self._max_retry_after_s)
        location = response.headers.get("Operation-Location")
        if response.status_code != 202 or not location:
            raise PermanentProviderError(
                f"ACS send: expected 202 with Operation-Location, got {response.status_code}",
                status_code=response.status_code,
            )
        operation_url = self._on_endpoint(urljoin(f"{self._endpoint}/", location), "ACS send")
        return SubmitResult(
            delivered=False,
            operation_url=operation_url,
            retry_after_s=self._retry_after(response, "ACS send: operation accepted"),
            provider_message_id=json_object(response).get("id") or request.idempotency_key,
            recipients=recipient_addresses(request.payload),
        )

    async def _send(
        self, request: SubmitRequest, body: bytes, first_sent: datetime | None, now: datetime
    ) -> httpx.Response:
        """`POST /emails:send` as a repeatable request: the item's first send if `first_sent`
        is given, else a send anew, first sent `now`, with a request id of its own."""
        first_sent_header = formatdate((first_sent or now).timestamp(), usegmt=True)
        request_name = request.idempotency_key
        if first_sent is None:
            request_name = f"{request_name}@{first_sent_header}"
        http_request = self._client.build_request(
            "POST",
            f"{self._endpoint}/emails:send",
            params={"api-version": API_VERSION},
            content=body,
            headers={
                **self._headers,
                "Content-Type": "application/json",
                "Operation-Id": request.idempotency_key,
                "Repeatability-Request-Id": str(uuid.uuid5(_REPEATABILITY_NAMESPACE, request_name)),
                "Repeatability-First-Sent": first_sent_header,
            },
            timeout=self._timeout,
        )
        sign_request(http_request, self._access_key)
        return await send(self._client, http_request, "ACS send")

    async def find_operation(self, request: SubmitRequest) -> SubmitResult | None:
        """The reconcile step: `GET /emails/operations/{Operation-Id}`. The operation as an
        accepted submit if ACS has it (its poll then tells how it went); None if ACS has no
        trace of it (404), so a send cannot deliver it twice."""
        operation_url = (
            f"{self._endpoint}/emails/operations/{quote(request.idempotency_key, safe='')}"
            f"?api-version={API_VERSION}"
        )
        http_request = self._client.build_request(
            "GET", operation_url, headers=self._headers, timeout=self._timeout
        )
        sign_request(http_request, self._access_key)
        response = await send(self._client, http_request, "ACS operation lookup")
        if response.status_code == 404:
            return None
        raise_for_status(response, "ACS operation lookup", self._max_retry_after_s)
        return SubmitResult(
            delivered=False,
            operation_url=operation_url,
            provider_message_id=json_object(response).get("id") or request.idempotency_key,
            recipients=recipient_addresses(request.payload),
            found_by_lookup=True,
        )

    async def probe(self) -> str:
        """`HEAD` of the endpoint: unsigned, it sends nothing and reaches no mailbox."""
        return await probe_url(self._client, f"{self._endpoint}/", self._timeout, "ACS")

    async def poll(self, request: PollRequest) -> PollResult:
        operation_url = self._on_endpoint(request.operation_url, "ACS poll")
        http_request = self._client.build_request(
            "GET", operation_url, headers=self._headers, timeout=self._timeout
        )
        sign_request(http_request, self._access_key)
        response = await send(self._client, http_request, "ACS poll")
        raise_for_status(response, "ACS poll", self._max_retry_after_s)
        body = json_object(response)
        status = _STATUSES.get(str(body.get("status", "")).lower())
        if status is None:
            raise PermanentProviderError(f"ACS poll: unknown operation status {body!r:.200}")
        error = body.get("error") or {}
        message = error.get("message") if isinstance(error, dict) else str(error)
        code = error.get("code") if isinstance(error, dict) else None
        return PollResult(
            status=status,
            retry_after_s=self._retry_after(response, "ACS poll"),
            error=message or None,
            error_code=str(code) if code else None,
        )

    def _on_endpoint(self, operation_url: str, what: str) -> str:
        """`operation_url` if it is on the endpoint's scheme, host and port: the poll is signed
        with the access key, which must never go to another host whatever the answer said."""
        if origin(urlsplit(operation_url)) != self._origin:
            raise PermanentProviderError(
                f"{what}: Operation-Location {_without_query(operation_url)!r} is not on the"
                f" endpoint's host {self._endpoint!r}; not following it"
            )
        return operation_url

    def _retry_after(self, response: httpx.Response, what: str) -> float | None:
        return check_retry_after(
            parse_retry_after(response.headers.get("Retry-After")),
            self._max_retry_after_s,
            what,
            response.status_code,
        )


def _without_query(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}{parts.path}"


def recipient_addresses(payload: dict[str, Any]) -> list[str]:
    """The addresses ACS sends delivery reports for: `recipients.to`, `.cc` and `.bcc`."""
    recipients = payload.get("recipients")
    if not isinstance(recipients, dict):
        return []
    addresses: list[str] = []
    for kind in ("to", "cc", "bcc"):
        for entry in recipients.get(kind) or []:
            address = entry.get("address") if isinstance(entry, dict) else None
            if isinstance(address, str) and address and address not in addresses:
                addresses.append(address)
    return addresses
