"""The API's problem+json answers (RFC 9457) as typed exceptions, one class per status."""

from __future__ import annotations

from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import httpx

# A non-problem body (a proxy's HTML page, say) is quoted in `detail` up to this many characters.
_MAX_QUOTED_BODY = 500


class ProblemError(Exception):
    """The API refused a call: its problem's members, and `retry_after` in seconds if it said.
    `code` is the problem's stable name (`seat-taken`, `item-not-found`): branch on it, not on
    `title` or `detail`; `type` is the URI of its page on the API."""

    def __init__(
        self,
        status: int,
        type: str,
        title: str,
        detail: str,
        *,
        code: str | None = None,
        instance: str | None = None,
        errors: list[dict[str, Any]] | None = None,
        body: dict[str, Any] | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(f"{status} {title}: {detail}")
        self.status = status
        self.type = type
        self.title = title
        self.detail = detail
        self.code = code
        self.instance = instance
        # Validation problems list each invalid field: `location`, `message`, `type`.
        self.errors = errors
        # The whole problem, with any member this client does not name (`redrive`, `actor`...).
        self.body = body if body is not None else {}
        self.retry_after = retry_after


class BadRequest(ProblemError):
    """400: the request is malformed (not JSON, say)."""


class Unauthorized(ProblemError):
    """401: no token, or not a bearer token."""


class Forbidden(ProblemError):
    """403: the token is wrong, or lacks the scope, outbox or actor the call needs."""


class NotFound(ProblemError):
    """404: no such item, destination, lane, aggregate, command or route."""


class Conflict(ProblemError):
    """409: an Idempotency-Key reused with another payload, or the state forbids the action."""


class Gone(ProblemError):
    """410: retention deleted the item; `body` says how it ended (`item_status`,
    `finished_at`) and when its row went (`pruned_at`)."""


class PayloadTooLarge(ProblemError):
    """413: the body is above the API's `MAX_REQUEST_BYTES`."""


class UnsupportedMediaType(ProblemError):
    """415: the body was not sent as JSON."""


class Unprocessable(ProblemError):
    """422: the request is well-formed but invalid; `errors` lists each field."""


class RateLimited(ProblemError):
    """429: backpressure (a full ordering lane); the same call succeeds after `retry_after`."""


class InternalError(ProblemError):
    """500: a bug in the API (it logged the details)."""


class NotSupported(ProblemError):
    """501: the Temporal server behind the API does not support the call."""


class Unavailable(ProblemError):
    """503: Temporal or the database did not answer; retry after `retry_after`."""


_BY_STATUS: dict[int, type[ProblemError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    410: Gone,
    413: PayloadTooLarge,
    415: UnsupportedMediaType,
    422: Unprocessable,
    429: RateLimited,
    500: InternalError,
    501: NotSupported,
    503: Unavailable,
}


def problem_error(response: httpx.Response) -> ProblemError:
    """The exception for an error response: its status's class, filled from its problem."""
    error_class = _BY_STATUS.get(response.status_code, ProblemError)
    retry_after = parse_retry_after(response.headers.get("retry-after"))
    body = _problem_body(response)
    if body is None:
        text = response.text[:_MAX_QUOTED_BODY]
        return error_class(
            response.status_code,
            "about:blank",
            response.reason_phrase or "Error",
            text or f"HTTP {response.status_code}",
            retry_after=retry_after,
        )
    errors = body.get("errors")
    return error_class(
        response.status_code,
        str(body.get("type", "about:blank")),
        str(body.get("title", response.reason_phrase)),
        str(body.get("detail", "")),
        code=_optional_text(body.get("code")) or _code_from_type(body.get("type")),
        instance=_optional_text(body.get("instance")),
        errors=errors if isinstance(errors, list) else None,
        body=body,
        retry_after=retry_after,
    )


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """`Retry-After` in seconds from now: delay-seconds or an HTTP-date; None if absent or bad."""
    if value is None:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


def _problem_body(response: httpx.Response) -> dict[str, Any] | None:
    media_type = response.headers.get("content-type", "").partition(";")[0].strip().lower()
    if not media_type.endswith("json"):
        return None
    try:
        body = response.json()
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def _code_from_type(problem_type: Any) -> str | None:
    # An API that answers without `code` still names it as its `type`'s last segment.
    if isinstance(problem_type, str) and "/problems/" in problem_type:
        return problem_type.rsplit("/", 1)[-1] or None
    return None


def _optional_text(value: Any) -> str | None:
    return None if value is None else str(value)
