"""What the fake provider remembers of a request, and for how long: as the real services do.

- ACS Email's repeatable requests (learn.microsoft.com/rest/api/communication/repeatable-requests,
  after OASIS Repeatable Requests 1.0): a send carrying `Repeatability-Request-Id` (a GUID) and
  `Repeatability-First-Sent` (an IMF-fixdate) is tracked for the window after its first-sent time.
  Within it a repeat that matches (same first-sent, same body) gets the first send's answer and
  is not executed again; one that does not match is a 400. A first-sent older than the window is
  refused with 412, whether or not the request was seen. A malformed header is a 400. A send
  without the headers is not repeatable: it is executed every time.
- A Standard Webhooks receiver's dedupe by `webhook-id`: an id seen within the window is not
  delivered again; after it, the same id is a new delivery.
- A payment API's `Idempotency-Key` (Stripe's rules, docs.stripe.com/api/idempotent_requests): a
  key is remembered with its first answer for the window (24 hours) after its first use; a repeat
  with the same body gets that answer again, one with another body is refused; after the window
  the key is forgotten and a repeat is executed as a new request.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime

REQUEST_ID = "repeatability-request-id"
FIRST_SENT = "repeatability-first-sent"
# The OASIS spec's answer header: whether the server took the request as repeatable.
RESULT = "Repeatability-Result"


@dataclass(frozen=True)
class Refusal:
    """A repeatable request ACS refuses: the status and its error body's code and message."""

    status: int
    code: str
    message: str


@dataclass
class _Tracked:
    first_sent: str
    body_hash: str
    expires_at: float
    operation_id: str


class RepeatableRequests:
    """The repeatable sends ACS tracks, each until `window_s` after its first-sent time."""

    def __init__(self) -> None:
        self._tracked: dict[str, _Tracked] = {}

    def check(
        self, headers: Mapping[str, str], body: bytes, now: float, window_s: float
    ) -> tuple[Refusal | None, str | None]:
        """(a refusal, None) for a send ACS refuses; (None, operation id) for a repeat it
        answers with the first send's operation; (None, None) for a send to execute."""
        self._forget(now)
        request_id, first_sent = headers.get(REQUEST_ID), headers.get(FIRST_SENT)
        if request_id is None and first_sent is None:
            return None, None
        problem = _header_problem(request_id, first_sent)
        if problem is not None:
            return Refusal(400, "BadRequest", problem), None
        assert request_id is not None and first_sent is not None
        if now - parsedate_to_datetime(first_sent).timestamp() > window_s:
            return Refusal(
                412,
                "PreconditionFailed",
                f"The Repeatability-First-Sent header is not within the {window_s:g}"
                " second window.",
            ), None
        tracked = self._tracked.get(request_id.lower())
        if tracked is None:
            return None, None
        if tracked.first_sent != first_sent or tracked.body_hash != _hash(body):
            return Refusal(
                400,
                "BadRequest",
                "The request does not match the earlier request with this"
                " Repeatability-Request-Id.",
            ), None
        return None, tracked.operation_id

    def executed(
        self, headers: Mapping[str, str], body: bytes, operation_id: str, window_s: float
    ) -> None:
        """Remember a repeatable send that was executed (a send without the headers is not)."""
        request_id, first_sent = headers.get(REQUEST_ID), headers.get(FIRST_SENT)
        if request_id is None or first_sent is None:
            return
        expires_at = parsedate_to_datetime(first_sent).timestamp() + window_s
        self._tracked[request_id.lower()] = _Tracked(
            first_sent, _hash(body), expires_at, operation_id
        )

    def _forget(self, now: float) -> None:
        for request_id in [k for k, tracked in self._tracked.items() if tracked.expires_at < now]:
            del self._tracked[request_id]


class SeenIds:
    """Ids a receiver has delivered, each remembered for `window_s` after its first delivery."""

    def __init__(self) -> None:
        self._first_seen: dict[str, float] = {}

    def first_time(self, message_id: str, now: float, window_s: float) -> bool:
        """Whether `message_id` is new (never seen, or last delivered beyond the window); a new
        one is remembered from `now`."""
        seen_at = self._first_seen.get(message_id)
        if seen_at is not None and now - seen_at <= window_s:
            return False
        self._first_seen[message_id] = now
        return True


@dataclass(frozen=True)
class RememberedAnswer:
    """The first answer to a key, replayed to every repeat within the window."""

    body_hash: str
    status: int
    body: bytes
    headers: dict[str, str]
    expires_at: float


class IdempotencyKeys:
    """Keys a payment API has answered, each until `window_s` after its first use."""

    def __init__(self) -> None:
        self._answers: dict[str, RememberedAnswer] = {}

    def recall(self, key: str, body: bytes, now: float) -> tuple[RememberedAnswer | None, bool]:
        """(the first answer, whether `body` matches the first request's) for a key within its
        window; (None, True) for a key never used or forgotten."""
        answer = self._answers.get(key)
        if answer is None or answer.expires_at <= now:
            self._answers.pop(key, None)
            return None, True
        return answer, answer.body_hash == _hash(body)

    def remember(
        self,
        key: str,
        body: bytes,
        answer: tuple[int, bytes, dict[str, str]],
        now: float,
        window_s: float,
    ) -> None:
        status, answer_body, headers = answer
        self._answers[key] = RememberedAnswer(
            _hash(body), status, answer_body, headers, now + window_s
        )


def _header_problem(request_id: str | None, first_sent: str | None) -> str | None:
    if request_id is None or first_sent is None:
        return "Repeatability-Request-Id and Repeatability-First-Sent go together."
    try:
        uuid.UUID(request_id)
    except ValueError:
        return "The Repeatability-Request-Id header must be a GUID."
    try:
        sent = parsedate_to_datetime(first_sent)
    except (TypeError, ValueError, IndexError):
        sent = None
    if sent is None or sent.tzinfo is None or not first_sent.endswith(" GMT"):
        return "The Repeatability-First-Sent header must be an IMF-fixdate in GMT."
    return None


def _hash(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()
