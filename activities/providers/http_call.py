"""JSON APIs called with an `Idempotency-Key` (payment APIs such as Stripe's): one request per
item, the payload as its JSON body, the destination's method and URL template.

Exactly once across retries: every attempt carries the item's provider key as `Idempotency-Key`,
a Structured Field string as the IETF httpapi draft (draft-ietf-httpapi-idempotency-key-header)
writes it. The API answers a repeat within its key window (Stripe: 24 hours) with the first
call's answer; a repeat with another body is refused (Stripe: 400 `idempotency_error`; the
draft: 422), a permanent failure naming the key; a repeat while the first call still runs is a
409, retried. Past the window the API has forgotten the key and would execute the call again,
so a retry then first looks the call up at the destination's `status_url` (the reconcile step):
found, it is adopted; only one the API has no trace of (404) is sent again. Without a
`status_url` such a retry is sent: at-least-once (docs/explanation/provider-dedupe.md).

Credentials (`auth`) come from the destinations file and go only to the destination's own
origin; the attempt log keeps no `Authorization` or other credential header
(`readmodel/attempts.py` keeps an allowlist).
"""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta
from typing import ClassVar
from urllib.parse import urljoin, urlsplit

import httpx
from durable_outbox_temporal.contract import http_call
from durable_outbox_temporal.contract.item import (
    OperationStatus,
    PollRequest,
    PollResult,
    SubmitRequest,
    SubmitResult,
)

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
from configuration.providers import HttpCallSettings

# An operation's status words beyond ACS's (`OperationStatus`), as JSON APIs spell them.
_STATUSES = {
    **{status.value: status for status in OperationStatus},
    "pending": OperationStatus.RUNNING,
    "processing": OperationStatus.RUNNING,
    "inprogress": OperationStatus.RUNNING,
    "in_progress": OperationStatus.RUNNING,
    "cancelled": OperationStatus.CANCELED,
}
# How the API says a key was first used with another body: the IETF draft's 422, or Stripe's
# error type on a 400.
_KEY_REUSED_STATUS = 422
_KEY_REUSED_TYPE = "idempotency_error"


def idempotency_key_header(key: str) -> str:
    """`key` as a Structured Field string (RFC 8941), the draft's form of the header."""
    escaped = key.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


class HttpCallProvider:
    """Calls a JSON API once per item, the item's provider key as `Idempotency-Key`."""

    kind: ClassVar[str] = "http"

    def __init__(self, settings: HttpCallSettings, http_client: httpx.AsyncClient) -> None:
        self._method = settings.method
        self._url = settings.url
        self._status_url = settings.status_url
        self._origin = origin(urlsplit(settings.url))
        self._window = timedelta(seconds=settings.idempotency_window_s)
        self._poll_operations = settings.poll_operations
        self._max_body_bytes = settings.max_body_bytes
        self._max_retry_after_s = settings.max_retry_after_s
        self._headers = {**settings.headers, **_auth_headers(settings)}
        self._timeout = httpx.Timeout(settings.timeout_s)
        self._client = http_client

    async def submit(self, request: SubmitRequest) -> SubmitResult:
        key = request.idempotency_key
        try:
            body = http_call.body_bytes(request.payload)
            url = http_call.render_url(self._url, key, request.payload)
        except ValueError as err:
            # Enqueue refuses these; an item from before the destination changed fails.
            raise PermanentProviderError(f"http call: {err}") from None
        if len(body) > self._max_body_bytes:
            raise PermanentProviderError(
                f"http call: the body is {len(body)} bytes, over max_body_bytes"
                f" ({self._max_body_bytes})"
            )
        if self._status_url is not None and past_window(request, datetime.now(UTC), self._window):
            # An earlier attempt may have been taken with its answer lost, and the API no
            # longer knows the key: ask before calling again.
            found = await self.find_call(request)
            if found is not None:
                return found
        http_request = self._client.build_request(
            self._method,
            url,
            content=body,
            headers={
                **self._headers,
                "Content-Type": "application/json",
                "Idempotency-Key": idempotency_key_header(key),
            },
            timeout=self._timeout,
        )
        response = await send(self._client, http_request, "http call")
        if response.status_code == 409:
            raise TransientProviderError(
                f"http call: HTTP 409: the first call with Idempotency-Key {key} is still in"
                " progress",
                status_code=409,
                retry_after_s=self._retry_after(response, "http call"),
            )
        if _key_reused(response):
            raise PermanentProviderError(
                f"http call: Idempotency-Key {key} was first used with another body; the API"
                f" refused this one (HTTP {response.status_code}: {response.text[:300]})",
                status_code=response.status_code,
                error_code=_KEY_REUSED_TYPE,
            )
        raise_for_status(response, "http call", self._max_retry_after_s)
        return self._result(response, url, key, found_by_lookup=False)

    async def find_call(self, request: SubmitRequest) -> SubmitResult | None:
        """The reconcile step: `GET status_url`. The call as made if the API has it (2xx); None
        if it has no trace of it (404), so a new call cannot make it twice."""
        if self._status_url is None:
            return None
        try:
            url = http_call.render_url(self._status_url, request.idempotency_key, request.payload)
        except ValueError as err:
            raise PermanentProviderError(f"http status lookup: {err}") from None
        http_request = self._client.build_request(
            "GET",
            self._on_origin(url, "http status lookup"),
            headers=self._headers,
            timeout=self._timeout,
        )
        response = await send(self._client, http_request, "http status lookup")
        if response.status_code == 404:
            return None
        raise_for_status(response, "http status lookup", self._max_retry_after_s)
        return self._result(response, url, request.idempotency_key, found_by_lookup=True)

    def _result(
        self, response: httpx.Response, url: str, key: str, *, found_by_lookup: bool
    ) -> SubmitResult:
        """A finished call, or with `poll_operations` a 202's operation to poll."""
        message_id = str(json_object(response).get("id") or key)
        location = response.headers.get("Operation-Location") or response.headers.get("Location")
        if self._poll_operations and response.status_code == 202 and location:
            return SubmitResult(
                delivered=False,
                operation_url=self._on_origin(urljoin(url, location), "http call"),
                retry_after_s=self._retry_after(response, "http call: operation accepted"),
                provider_message_id=message_id,
                found_by_lookup=found_by_lookup,
            )
        return SubmitResult(
            delivered=True, provider_message_id=message_id, found_by_lookup=found_by_lookup
        )

    async def poll(self, request: PollRequest) -> PollResult:
        operation_url = self._on_origin(request.operation_url, "http poll")
        http_request = self._client.build_request(
            "GET", operation_url, headers=self._headers, timeout=self._timeout
        )
        response = await send(self._client, http_request, "http poll")
        retry_after_s = self._retry_after(response, "http poll")
        if response.status_code == 202:
            return PollResult(status=OperationStatus.RUNNING, retry_after_s=retry_after_s)
        if response.status_code == 303:
            # RFC 9110's "see the result there": the operation has ended.
            return PollResult(status=OperationStatus.SUCCEEDED)
        raise_for_status(response, "http poll", self._max_retry_after_s)
        body = json_object(response)
        word = str(body.get("status", "succeeded")).lower()
        status = _STATUSES.get(word)
        if status is None:
            raise PermanentProviderError(f"http poll: unknown operation status {word!r:.100}")
        error = body.get("error") or {}
        message = error.get("message") if isinstance(error, dict) else str(error)
        code = error.get("code") if isinstance(error, dict) else None
        return PollResult(
            status=status,
            retry_after_s=retry_after_s,
            error=message or None,
            error_code=str(code) if code else None,
        )

    async def probe(self) -> str:
        """`HEAD` of the API's origin, without credentials: it calls nothing."""
        scheme, host, port = self._origin
        return await probe_url(self._client, f"{scheme}://{host}:{port}/", self._timeout, "http")

    def _on_origin(self, url: str, what: str) -> str:
        """`url` if it is on the destination's origin: the credentials go nowhere else,
        whatever an answer's `Location` says."""
        if origin(urlsplit(url)) != self._origin:
            parts = urlsplit(url)
            raise PermanentProviderError(
                f"{what}: {parts.scheme}://{parts.hostname}{parts.path} is not on the"
                " destination's origin; not following it"
            )
        return url

    def _retry_after(self, response: httpx.Response, what: str) -> float | None:
        return check_retry_after(
            parse_retry_after(response.headers.get("Retry-After")),
            self._max_retry_after_s,
            what,
            response.status_code,
        )


def _auth_headers(settings: HttpCallSettings) -> dict[str, str]:
    """The credentials' header; the settings model has checked they are complete."""
    token = settings.token.get_secret_value() if settings.token is not None else ""
    if settings.auth == "bearer":
        return {"Authorization": f"Bearer {token}"}
    if settings.auth == "basic":
        assert settings.username is not None and settings.password is not None
        pair = f"{settings.username}:{settings.password.get_secret_value()}".encode()
        return {"Authorization": f"Basic {base64.b64encode(pair).decode()}"}
    if settings.auth == "header":
        assert settings.auth_header is not None
        return {settings.auth_header: token}
    return {}


def _key_reused(response: httpx.Response) -> bool:
    if response.status_code == _KEY_REUSED_STATUS:
        return True
    error = json_object(response).get("error")
    return (
        response.status_code == 400
        and isinstance(error, dict)
        and error.get("type") == _KEY_REUSED_TYPE
    )
