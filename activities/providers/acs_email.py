"""Azure Communication Services Email: `POST {endpoint}/emails:send`, then poll the operation.

Requests are signed with ACS's HMAC-SHA256 scheme (`activities/providers/acs_signing.py`).
"""

from __future__ import annotations

import json
from typing import Any, ClassVar
from urllib.parse import SplitResult, urljoin, urlsplit

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
    check_retry_after,
    parse_retry_after,
    probe_url,
    raise_for_status,
    send,
)
from configuration.providers import AcsEmailSettings

API_VERSION = "2023-03-31"
_STATUSES = {status.value: status for status in OperationStatus}


class AcsEmailProvider:
    """Sends ACS email requests; `Operation-Id` carries the item's stable idempotency key."""

    kind: ClassVar[str] = "acs-email"

    def __init__(self, settings: AcsEmailSettings, http_client: httpx.AsyncClient) -> None:
        self._endpoint = settings.endpoint.rstrip("/")
        self._origin = _origin(urlsplit(self._endpoint))
        self._access_key = settings.access_key
        self._max_retry_after_s = settings.max_retry_after_s
        self._headers = settings.headers
        self._timeout = httpx.Timeout(settings.timeout_s)
        self._client = http_client

    async def submit(self, request: SubmitRequest) -> SubmitResult:
        try:
            body = json.dumps(request.payload, separators=(",", ":"), allow_nan=False).encode()
        except ValueError as err:
            # NaN or Infinity: ACS's JSON parser refuses them, and no retry changes that.
            raise PermanentProviderError(f"ACS send: the payload is not JSON: {err}") from None
        http_request = self._client.build_request(
            "POST",
            f"{self._endpoint}/emails:send",
            params={"api-version": API_VERSION},
            content=body,
            headers={
                **self._headers,
                "Content-Type": "application/json",
                "Operation-Id": request.idempotency_key,
            },
            timeout=self._timeout,
        )
        sign_request(http_request, self._access_key)
        response = await send(self._client, http_request, "ACS send")
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
            provider_message_id=_json(response).get("id") or request.idempotency_key,
            recipients=recipient_addresses(request.payload),
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
        body = _json(response)
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
        if _origin(urlsplit(operation_url)) != self._origin:
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


_DEFAULT_PORTS = {"http": 80, "https": 443}


def _origin(url: SplitResult) -> tuple[str, str, int | None]:
    """Scheme, host and port, as a browser's same-origin rule compares them."""
    scheme = url.scheme.lower()
    try:
        port = url.port or _DEFAULT_PORTS.get(scheme)
    except ValueError:
        port = -1
    return scheme, (url.hostname or "").lower(), port


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


def _json(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}
