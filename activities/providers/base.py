"""The provider protocol: a new provider is one class here, its settings model in configuration.

Providers classify every outcome. A failure the next attempt may fix (timeout, connection error,
408/429/5xx) raises `TransientProviderError`, carrying the provider's `Retry-After` if it sent
one; anything else (other 4xx, a rejected payload) raises `PermanentProviderError`.
"""

from __future__ import annotations

import email.utils
import math
import re
import time
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar, Protocol
from urllib.parse import SplitResult

import httpx
from durable_outbox_temporal.contract.item import (
    PollRequest,
    PollResult,
    SubmitRequest,
    SubmitResult,
)
from durable_outbox_temporal.contract.limits import DEFAULT_MAX_RETRY_AFTER_S

from readmodel import attempts


class ProviderError(Exception):
    """Base of the errors a provider raises; `status_code` is the HTTP status, if any."""

    def __init__(
        self, message: str, status_code: int | None = None, error_code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.error_code = error_code


class TransientProviderError(ProviderError):
    """Worth retrying; `retry_after_s` is the provider's own `Retry-After`, never to be undercut."""

    def __init__(
        self,
        message: str,
        status_code: int | None = None,
        retry_after_s: float | None = None,
        error_code: str | None = None,
    ) -> None:
        super().__init__(message, status_code, error_code)
        self.retry_after_s = retry_after_s


class PermanentProviderError(ProviderError):
    """Retrying cannot help (bad request, unauthorised)."""


class EndpointGoneError(ProviderError):
    """The receiver disabled the endpoint (HTTP 410 Gone): nothing should go there until an
    operator says so, but the item itself is not at fault. `endpoint` is the URL, without its
    query or credentials, for the operator to read."""

    def __init__(self, message: str, endpoint: str) -> None:
        super().__init__(message, status_code=410)
        self.endpoint = endpoint


class Provider(Protocol):
    """Submits an item and, for providers with long-running operations, polls it."""

    kind: ClassVar[str]

    async def submit(self, request: SubmitRequest) -> SubmitResult: ...

    async def poll(self, request: PollRequest) -> PollResult: ...

    async def probe(self) -> str:
        """One request that delivers nothing, to see whether the destination answers (an open
        circuit's probe, `flowcontrol/breaker.py`): what it answered; raises
        `TransientProviderError` when it did not answer or answered a 5xx."""
        ...


async def probe_url(client: httpx.AsyncClient, url: str, limits: httpx.Timeout, what: str) -> str:
    """`HEAD url`: any answer but a 5xx means the host is up (a 405 too: it is there)."""
    response = await send(client, client.build_request("HEAD", url, timeout=limits), what)
    if response.status_code >= 500:
        raise TransientProviderError(
            f"{what} probe: HTTP {response.status_code}",
            status_code=response.status_code,
            retry_after_s=parse_retry_after(response.headers.get("Retry-After")),
        )
    return f"HTTP {response.status_code}"


def past_window(request: SubmitRequest, now: datetime, window: timedelta) -> bool:
    """Whether the provider may have forgotten the item's first submit (its dedupe window has
    passed): its first submit is older than `window`, or unknown on a retry."""
    first_sent = request.first_submitted_at
    if first_sent is None:
        return request.attempt > 1
    return now - first_sent > window


_DEFAULT_PORTS = {"http": 80, "https": 443}


def origin(url: SplitResult) -> tuple[str, str, int | None]:
    """Scheme, host and port, as a browser's same-origin rule compares them: a URL a provider
    answered with gets the destination's credentials only on the destination's origin."""
    scheme = url.scheme.lower()
    try:
        port = url.port or _DEFAULT_PORTS.get(scheme)
    except ValueError:
        port = -1
    return scheme, (url.hostname or "").lower(), port


TRANSIENT_STATUS_CODES = frozenset({408, 425, 429, 500, 502, 503, 504})


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds to wait from a `Retry-After` header: delta-seconds or an HTTP-date (RFC 9110).

    None for a value that is neither (negative, fractional, garbage); `math.inf` for a number
    too large for a float. The caller bounds it (`check_retry_after`)."""
    if value is None or not value.strip():
        return None
    value = value.strip()
    # ASCII digits only: `str.isdigit` also takes '²' and other digits `float` refuses.
    if _DELTA_SECONDS.fullmatch(value):
        return float(value) if len(value) <= _MAX_EXACT_DIGITS else math.inf
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, OverflowError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    now = now or datetime.now(UTC)
    # An HTTP-date has whole-second precision; round up so we never come back early.
    return max(0.0, (when - now).total_seconds() + 1.0)


_DELTA_SECONDS = re.compile(r"[0-9]+")
# Longer digit strings are beyond any bound; `float` would turn them into inf anyway.
_MAX_EXACT_DIGITS = 300


def check_retry_after(
    retry_after_s: float | None,
    max_retry_after_s: float,
    what: str,
    status_code: int | None = None,
    error_code: str | None = None,
) -> float | None:
    """`retry_after_s`, unless the provider asked to wait longer than the destination allows:
    then `PermanentProviderError` (waiting less would break its word; that long is a refusal)."""
    if retry_after_s is not None and retry_after_s > max_retry_after_s:
        raise PermanentProviderError(
            f"{what}: provider asked to retry after {retry_after_s:.0f} s, beyond"
            f" max_retry_after_s ({max_retry_after_s:g} s)",
            status_code=status_code,
            error_code=error_code,
        )
    return retry_after_s


def raise_for_status(
    response: httpx.Response, what: str, max_retry_after_s: float = DEFAULT_MAX_RETRY_AFTER_S
) -> None:
    """Turn a non-2xx response into the matching transient or permanent error; a transient one
    whose `Retry-After` is beyond `max_retry_after_s` is permanent."""
    if response.is_success:
        return
    body = response.text[:500]
    message = f"{what}: HTTP {response.status_code}: {body}".rstrip(": ")
    status_code, code = response.status_code, error_code(response)
    if status_code in TRANSIENT_STATUS_CODES:
        retry_after_s = check_retry_after(
            parse_retry_after(response.headers.get("Retry-After")),
            max_retry_after_s,
            message,
            status_code,
            code,
        )
        raise TransientProviderError(
            message, status_code=status_code, retry_after_s=retry_after_s, error_code=code
        )
    raise PermanentProviderError(message, status_code=status_code, error_code=code)


def json_object(response: httpx.Response) -> dict[str, Any]:
    """The response's JSON body if it is an object; empty otherwise."""
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def error_code(response: httpx.Response) -> str | None:
    """The `error.code` of a JSON error body (the Azure REST convention ACS follows), if any."""
    error = json_object(response).get("error")
    code = error.get("code") if isinstance(error, dict) else None
    return str(code) if code else None


async def send(client: httpx.AsyncClient, request: httpx.Request, what: str) -> httpx.Response:
    """Send `request`, mapping timeouts and connection errors to transient errors."""
    started_at, began = datetime.now(UTC), time.monotonic()
    try:
        response = await client.send(request)
    except httpx.HTTPError as err:
        _note(request, started_at, began, error=err)
        if isinstance(err, httpx.TimeoutException):
            raise TransientProviderError(f"{what}: timed out ({type(err).__name__})") from err
        if isinstance(err, httpx.TransportError):
            raise TransientProviderError(f"{what}: connection failed: {err!r}") from err
        raise
    _note(request, started_at, began, response=response)
    return response


def _note(
    request: httpx.Request,
    started_at: datetime,
    began: float,
    response: httpx.Response | None = None,
    error: BaseException | None = None,
) -> None:
    """The exchange, in the item's attempt log (`readmodel/attempts.py`)."""
    attempts.note(
        request.method,
        str(request.url),
        request.headers,
        started_at,
        round((time.monotonic() - began) * 1000),
        status=None if response is None else response.status_code,
        response_headers=None if response is None else response.headers,
        body=None if response is None else response.text,
        error=error,
    )
