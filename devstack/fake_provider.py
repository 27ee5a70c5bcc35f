"""A local provider that speaks the ACS Email, ACS SMS (`devstack/fake_sms.py`), Standard
Webhooks and payment API (`devstack/fake_payments.py`) contracts, with faults.

For development, demos, tests and benchmarks: it checks signatures like the real services, dedupes
as they do and forgets as they do (ACS's repeatable requests for `repeatability_window_s`, a
receiver's `webhook-id` for `webhook_dedupe_window_s`: `devstack/fake_memory.py`), and counts
what it sees so tests can assert "delivered exactly once", "rate never exceeded", "no request
before Retry-After elapsed".
Given `--report-url`, it also reports each email recipient's fate there as Event Grid would
(`devstack/fake_reports.py`), with the events secret from `FAKE_EMAIL_EVENTS_SECRET` (never on
the command line, where `ps` would show it); an address whose local part starts with `bounce`
always bounces. A send-email body the real service would refuse (see `email_body_problem`) gets
its 400 `BadRequest`, after the signature check and before any fault.

Faults come from four places, most specific first: a per-key script (`POST /_admin/script`),
per-request headers (`X-Fake-Status`, `X-Fake-Retry-After`, `X-Fake-Latency-Ms`, `X-Fake-Hang-S`,
`X-Fake-Running-Polls`, `X-Fake-Operation-Result`, `X-Fake-Drop-Response`), a per-endpoint
fault that holds until cleared (`PUT /_admin/endpoints/{endpoint}` with a step such as
`{"status": 410}`, `DELETE` to clear; the endpoint is a webhook's path after `/webhook/`,
`emails`, `sms` or `payments`), and the global fault config (`PUT /_admin/faults`, or at
start-up one flag per FaultConfig field). A hidden limit (`hidden_limit`, or per endpoint
`PUT /_admin/limits/{endpoint}` with `{"limit": 20}`) admits that many submits a second, as a
provider's token bucket would, and answers the rest 429 with `Retry-After`.
`GET /_admin/deliveries?endpoint=` lists deliveries (each request taken as new, not as a repeat)
in arrival order, each with a global sequence number and the request's `traceparent` header.
Run it with `python -m devstack.fake_provider --port 8025 [--error-rate 0.1 ...]` (`--help` lists
the flags).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import bisect
import contextlib
import dataclasses
import hashlib
import hmac
import json
import logging
import os
import random
import time
import typing
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from email.utils import formatdate
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from configuration.redaction import install_log_redaction
from configuration.settings import (
    DEV_EVENTS_SECRET,
    PUBLIC_ACS_ACCESS_KEY,
    PUBLIC_PAYMENT_TOKEN,
    PUBLIC_WEBHOOK_SECRET,
)
from configuration.tls import shared_tls_context
from devstack import fake_payments, fake_sms
from devstack.fake_memory import RESULT, RepeatableRequests, SeenIds
from devstack.fake_reports import SCHEMAS, ReportSender, ReportSettings
from devstack.serving import serve_in_background

log = logging.getLogger("fake_provider")

# Published (config/destinations.toml's fallbacks): production processes refuse them.
DEFAULT_ACS_ACCESS_KEY = PUBLIC_ACS_ACCESS_KEY
DEFAULT_WEBHOOK_SECRET = PUBLIC_WEBHOOK_SECRET
# The bearer token of the fake's payment API (`devstack/fake_payments.py`).
DEFAULT_PAYMENT_TOKEN = PUBLIC_PAYMENT_TOKEN
# Standard Webhooks receivers reject timestamps further than this from their clock.
WEBHOOK_TOLERANCE_S = 300


def _help(text: str) -> dict[str, str]:
    return {"help": text}


@dataclass
class FaultConfig:
    """Random faults applied to every submit (and `running_polls` to every new operation).

    Each field is also a command-line flag (`error_rate` is `--error-rate`), its help text here.
    """

    error_rate: float = field(default=0.0, metadata=_help("share of submits answered 503"))
    throttle_rate: float = field(default=0.0, metadata=_help("share of submits answered 429"))
    retry_after: str = field(default="1", metadata=_help("Retry-After seconds on a 429"))
    retry_after_http_date: bool = field(
        default=False, metadata=_help("send a 429's Retry-After as an HTTP-date")
    )
    timeout_rate: float = field(default=0.0, metadata=_help("share of submits left hanging"))
    lost_response_rate: float = field(
        default=0.0,
        metadata=_help("share of submits taken, then the connection dropped before the answer"),
    )
    hang_s: float = field(default=30.0, metadata=_help("how long a hanging submit hangs"))
    latency_ms: float = field(default=0.0, metadata=_help("delay added to every submit"))
    running_polls: int = field(
        default=0, metadata=_help("polls answered 'Running' before an operation ends")
    )
    operation_fail_rate: float = field(
        default=0.0, metadata=_help("share of operations that end 'Failed'")
    )
    poll_retry_after: str | None = field(
        default=None, metadata=_help("Retry-After seconds on every operation poll")
    )
    seed: int | None = field(default=None, metadata=_help("seed of the random fault draws"))
    report_url: str | None = field(
        default=None, metadata=_help("where ACS delivery reports are POSTed (none: no reports)")
    )
    sms_report_url: str | None = field(
        default=None, metadata=_help("where ACS SMS delivery reports are POSTed (none: no reports)")
    )
    report_schema: str = field(
        default="eventgrid", metadata=_help("reports as 'eventgrid' (array) or 'cloudevents'")
    )
    report_delay_s: float = field(
        default=0.2, metadata=_help("delay before an operation's reports are POSTed")
    )
    bounce_rate: float = field(
        default=0.0, metadata=_help("share of recipients that bounce (bounce*@ always does)")
    )
    duplicate_reports: bool = field(default=False, metadata=_help("POST every report twice"))
    reports_out_of_order: bool = field(
        default=False, metadata=_help("also POST an older 'Quarantined' report after the final")
    )
    report_before_success: bool = field(
        default=False, metadata=_help("POST reports right after the 202, while still Running")
    )
    unknown_report_rate: float = field(
        default=0.0, metadata=_help("share of operations that add a report for an unknown id")
    )
    repeatability_window_s: float = field(
        default=300.0,
        metadata=_help("how long ACS tracks a repeatable send after its first-sent time"),
    )
    sms_repeatability_window_s: float = field(
        default=300.0,
        metadata=_help("how long ACS SMS tracks a number's repeatable send (PATCH /_admin/sms)"),
    )
    webhook_dedupe_window_s: float = field(
        default=300.0, metadata=_help("how long the webhook receiver remembers a webhook-id")
    )
    payment_key_window_s: float = field(
        default=24 * 3600.0,
        metadata=_help("how long the payment API remembers an Idempotency-Key and its answer"),
    )

    hidden_limit: float = field(
        default=0.0,
        metadata=_help(
            "submits a second the provider admits, as a token bucket holding a second's worth;"
            " above it a 429 with Retry-After `retry_after` (0: no limit)"
        ),
    )

    def __post_init__(self) -> None:
        if self.hidden_limit < 0:
            raise ValueError("hidden_limit must be 0 (none) or more")
        if self.report_schema not in SCHEMAS:
            raise ValueError(f"report_schema must be one of {', '.join(SCHEMAS)}")


@dataclass
class Step:
    """How to answer one submit: an error status, a delay, or how its operation should go."""

    status: int | None = None
    retry_after: str | None = None
    body: str | None = None
    latency_ms: float = 0.0
    hang_s: float | None = None
    running_polls: int | None = None
    operation_result: str | None = None
    # Take the request, then drop the connection before the answer is out (a lost response).
    drop_response: bool = False


@dataclass
class Operation:
    id: str
    polls_left: int
    result: str
    error: str | None = None
    sender: str = ""
    recipients: list[str] = field(default_factory=list)
    reported: bool = False


@dataclass
class KeyStats:
    """What one idempotency key saw: requests, first-time deliveries, Retry-After violations."""

    submits: int = 0
    deliveries: int = 0
    polls: int = 0
    early_requests: int = 0
    request_times: list[float] = field(default_factory=list)
    not_before: float = 0.0


def with_secret(url: str, secret: str | None) -> str:
    """`url` with `secret=` in its query, unless it has one already or there is no secret."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    if not secret or any(name == "secret" for name, _ in query):
        return url
    return parts._replace(query=urlencode([*query, ("secret", secret)])).geturl()


class FakeProviderState:
    """Everything the fake remembers; reset with `POST /_admin/reset`."""

    def __init__(
        self,
        acs_access_key: str,
        webhook_secret: str,
        faults: FaultConfig,
        events_secret: str | None = None,
        payment_token: str = DEFAULT_PAYMENT_TOKEN,
    ) -> None:
        self.acs_access_key = acs_access_key
        self.webhook_secret = webhook_secret
        self.payment_token = payment_token
        # What the reports carry to the report URL, as its subscription's `?secret=` would.
        self.events_secret = events_secret
        self.faults = faults
        self.reports = ReportSender()
        self.reset()

    def report_on(self, operation: Operation) -> None:
        """Send the operation's delivery reports once, if reports are configured."""
        faults = self.faults
        if faults.report_url is None or operation.reported or operation.result != "Succeeded":
            return
        operation.reported = True
        settings = ReportSettings(
            url=with_secret(faults.report_url, self.events_secret),
            schema=faults.report_schema,
            delay_s=faults.report_delay_s,
            bounce_rate=faults.bounce_rate,
            duplicate=faults.duplicate_reports,
            out_of_order=faults.reports_out_of_order,
            unknown_rate=faults.unknown_report_rate,
        )
        self.reports.schedule(
            settings, operation.id, operation.sender, operation.recipients, self.rng
        )

    def reset(self) -> None:
        self.rng = random.Random(self.faults.seed)
        self.reports.sent = self.reports.failures = 0
        self.keys: dict[str, KeyStats] = defaultdict(KeyStats)
        self.scripts: dict[str, list[Step]] = {}
        # Endpoint -> how every request to it is answered, until cleared.
        self.endpoint_faults: dict[str, Step] = {}
        self.operations: dict[str, Operation] = {}
        self.repeatable = RepeatableRequests()
        self.webhook_ids = SeenIds()
        # Every first delivery in arrival order: what ordering tests check.
        self.delivery_log: list[dict[str, Any]] = []
        # (monotonic time, path) of every request, for max-rate-in-window questions.
        self.requests: list[tuple[float, str]] = []
        # Each webhook request's (start, end, path, JSON payload): what was out at once, and
        # per payload field (a tenant), for the caps' and quotas' questions.
        self.spans: list[tuple[float, float, str, dict[str, Any]]] = []
        # Endpoint -> `HEAD` probes received (an open circuit's, `flowcontrol/breaker.py`).
        self.probes: dict[str, int] = defaultdict(int)
        self.sms = fake_sms.SmsMemory(window_s=self.faults.sms_repeatability_window_s)
        self.payments = fake_payments.PaymentMemory()
        # Endpoint -> its own hidden limit (submits a second; else `faults.hidden_limit`), each
        # endpoint's token bucket (tokens, monotonic time of the last refill), and the (monotonic
        # time, endpoint) of each submit the hidden limits refused.
        self.endpoint_limits: dict[str, float] = {}
        self.buckets: dict[str, tuple[float, float]] = {}
        self.hidden_refused: list[tuple[float, str]] = []

    def next_step(self, key: str, request: Request, endpoint: str) -> Step:
        """The scripted step for `key`, else one built from headers, else the endpoint's fault,
        else one from random faults."""
        script = self.scripts.get(key)
        if script:
            return script.pop(0)
        headers = request.headers
        if any(name.startswith("x-fake-") for name in headers):
            return Step(
                status=int(headers["x-fake-status"]) if "x-fake-status" in headers else None,
                retry_after=headers.get("x-fake-retry-after"),
                latency_ms=float(headers.get("x-fake-latency-ms", 0)),
                hang_s=float(headers["x-fake-hang-s"]) if "x-fake-hang-s" in headers else None,
                running_polls=(
                    int(headers["x-fake-running-polls"])
                    if "x-fake-running-polls" in headers
                    else None
                ),
                operation_result=headers.get("x-fake-operation-result"),
                drop_response=headers.get("x-fake-drop-response", "").lower() in ("1", "true"),
            )
        if not self._admitted(endpoint):
            self.hidden_refused.append((time.monotonic(), endpoint))
            return Step(status=429, retry_after=self._retry_after_value(self.faults.retry_after))
        if endpoint in self.endpoint_faults:
            return dataclasses.replace(self.endpoint_faults[endpoint])
        return self._random_step()

    def _admitted(self, endpoint: str) -> bool:
        """Whether the endpoint's hidden limit has a token for one more submit (taking it): a
        bucket holding a second's worth, refilled at the limit."""
        limit = self.endpoint_limits.get(endpoint, self.faults.hidden_limit)
        if limit <= 0:
            return True
        now = time.monotonic()
        tokens, last = self.buckets.get(endpoint, (limit, now))
        tokens = min(max(limit, 1.0), tokens + (now - last) * limit)
        admitted = tokens >= 1
        self.buckets[endpoint] = (tokens - 1 if admitted else tokens, now)
        return admitted

    def _random_step(self) -> Step:
        faults, draw = self.faults, self.rng.random()
        step = Step(latency_ms=faults.latency_ms)
        if draw < faults.error_rate:
            step.status = 503
        elif draw < faults.error_rate + faults.throttle_rate:
            step.status = 429
            step.retry_after = self._retry_after_value(faults.retry_after)
        elif draw < faults.error_rate + faults.throttle_rate + faults.timeout_rate:
            step.hang_s = faults.hang_s
        elif (
            draw
            < faults.error_rate
            + faults.throttle_rate
            + faults.timeout_rate
            + faults.lost_response_rate
        ):
            step.drop_response = True
        if self.rng.random() < faults.operation_fail_rate:
            step.operation_result = "Failed"
        return step

    def _retry_after_value(self, seconds: str) -> str:
        if self.faults.retry_after_http_date:
            return formatdate(time.time() + float(seconds), usegmt=True)
        return seconds

    def record(self, key: str | None, path: str, kind: str) -> KeyStats | None:
        now = time.monotonic()
        self.requests.append((now, path))
        if key is None:
            return None
        stats = self.keys[key]
        if kind == "submit":
            stats.submits += 1
            if now < stats.not_before:
                stats.early_requests += 1
            stats.request_times.append(time.time())
        else:
            stats.polls += 1
        return stats

    def log_delivery(self, key: str, endpoint: str, request: Request, body: bytes) -> None:
        """Count a key's first delivery and give it the next global sequence number.

        The W3C `traceparent` header is kept so tracing tests can tie the request to its trace."""
        self.keys[key].deliveries += 1
        try:
            payload = json.loads(body)
        except ValueError:
            payload = None
        self.delivery_log.append(
            {
                "seq": len(self.delivery_log) + 1,
                "key": key,
                "endpoint": endpoint,
                "at": time.time(),
                "payload": payload,
                "traceparent": request.headers.get("traceparent"),
            }
        )

    def max_in_window(
        self, prefix: str, window_s: float, where: Mapping[str, str] | None = None
    ) -> int:
        """Most requests to paths starting with `prefix` inside any `window_s`-second window;
        with `where`, only webhook requests whose JSON payload has those fields."""
        if where:
            times = sorted(start for start, _, _, _ in self._spans(prefix, where))
        else:
            times = [at for at, path in self.requests if path.startswith(prefix)]
        best = 0
        for index, start in enumerate(times):
            best = max(best, bisect.bisect_left(times, start + window_s) - index)
        return best

    def max_in_flight(self, prefix: str, where: Mapping[str, str] | None = None) -> int:
        """Most webhook requests to paths starting with `prefix` out at once (answered or not),
        with `where`: only those whose JSON payload has those fields."""
        edges = sorted(
            edge
            for start, end, _, _ in self._spans(prefix, where or {})
            for edge in ((start, 1), (end, -1))
        )
        best = out = 0
        for _, change in edges:  # at one instant an end sorts before a start
            out += change
            best = max(best, out)
        return best

    def _spans(
        self, prefix: str, where: Mapping[str, str]
    ) -> list[tuple[float, float, str, dict[str, Any]]]:
        return [
            span
            for span in self.spans
            if span[2].startswith(prefix)
            and all(str(span[3].get(field)) == value for field, value in where.items())
        ]


def _valid_acs_signature(request: Request, body: bytes, access_key: str) -> bool:
    authorization = request.headers.get("authorization", "")
    date = request.headers.get("x-ms-date", "")
    content_hash = request.headers.get("x-ms-content-sha256", "")
    if not authorization.startswith("HMAC-SHA256 ") or "&Signature=" not in authorization:
        return False
    if base64.b64encode(hashlib.sha256(body).digest()).decode() != content_hash:
        return False
    path_and_query = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    host = request.headers.get("host", "")
    string_to_sign = f"{request.method}\n{path_and_query}\n{date};{host};{content_hash}"
    expected = base64.b64encode(
        hmac.new(base64.b64decode(access_key), string_to_sign.encode(), hashlib.sha256).digest()
    ).decode()
    return hmac.compare_digest(expected, authorization.split("&Signature=", 1)[1])


def _valid_webhook_signature(request: Request, body: bytes, secret: str) -> bool:
    message_id = request.headers.get("webhook-id", "")
    timestamp = request.headers.get("webhook-timestamp", "")
    if not message_id or not timestamp.isdigit():
        return False
    if abs(time.time() - int(timestamp)) > WEBHOOK_TOLERANCE_S:
        return False
    key = base64.b64decode(secret.removeprefix("whsec_"))
    digest = hmac.new(key, f"{message_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    expected = base64.b64encode(digest).decode()
    offered = request.headers.get("webhook-signature", "").split()
    return any(hmac.compare_digest(expected, signature.split(",", 1)[-1]) for signature in offered)


class LostResponse(Response):
    """`answer`'s status line and headers, then the connection closes before its body: the
    request was taken, and the sender cannot tell (an `httpx.RemoteProtocolError` there)."""

    def __init__(self, answer: Response) -> None:
        super().__init__(answer.body, answer.status_code)
        self.raw_headers = answer.raw_headers

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )


def _acs_error(status: int, code: str, message: str, **headers: str) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status, headers=headers)


async def _apply_fault(
    state: FakeProviderState, step: Step, stats: KeyStats | None
) -> Response | None:
    """Delay and/or an error response for `step`; None when the request should succeed."""
    if step.latency_ms:
        await asyncio.sleep(step.latency_ms / 1000)
    if step.hang_s is not None:
        await asyncio.sleep(step.hang_s)
        return _acs_error(504, "GatewayTimeout", "hung request released")
    if step.status is None or step.status < 300:
        return None
    headers = {}
    if step.retry_after is not None:
        headers["Retry-After"] = step.retry_after
        if stats is not None:
            stats.not_before = time.monotonic() + _retry_after_seconds(step.retry_after)
    return _acs_error(
        step.status, "Injected", step.body or f"injected HTTP {step.status}", **headers
    )


def _retry_after_seconds(value: str) -> float:
    if value.strip().isdigit():
        return float(value)
    from email.utils import parsedate_to_datetime

    # Whole-second HTTP-dates: allow the second it names to start, not finish.
    return max(0.0, parsedate_to_datetime(value).timestamp() - time.time() - 1.0)


def create_app(state: FakeProviderState) -> Starlette:
    """The fake provider's ASGI app over `state`."""

    async def acs_send(request: Request) -> Response:
        body = await request.body()
        key = request.headers.get("operation-id") or str(uuid.uuid4())
        stats = state.record(key, request.url.path, "submit")
        if not _valid_acs_signature(request, body, state.acs_access_key):
            return _acs_error(401, "Denied", "Denied by the HMAC-SHA256 authentication policy")
        problem = email_body_problem(body)
        if problem is not None:
            log.info("ACS send %s -> 400 (%s)", key, problem)
            return _acs_error(400, "BadRequest", problem)
        window_s = state.faults.repeatability_window_s
        refusal, repeat_of = state.repeatable.check(request.headers, body, time.time(), window_s)
        if refusal is not None:
            log.info("ACS send %s -> %s (%s)", key, refusal.status, refusal.message)
            return _acs_error(refusal.status, refusal.code, refusal.message, **{RESULT: "rejected"})
        step = state.next_step(key, request, "emails")
        fault = await _apply_fault(state, step, stats)
        if fault is not None:
            log.info("ACS send %s -> %s (injected)", key, fault.status_code)
            return fault
        operation_id = repeat_of
        if operation_id is None:
            # Not a repeat ACS tracks: executed, even under an Operation-Id it has seen before.
            operation_id = key
            running = step.running_polls
            sender, recipients = _email_parties(body)
            operation = Operation(
                id=operation_id,
                polls_left=state.faults.running_polls if running is None else running,
                result=step.operation_result or "Succeeded",
                sender=sender,
                recipients=recipients,
            )
            state.operations[operation_id] = operation
            state.repeatable.executed(request.headers, body, operation_id, window_s)
            state.log_delivery(key, "emails", request, body)
            if state.faults.report_before_success:
                state.report_on(operation)
        base = str(request.base_url).rstrip("/")
        api_version = request.query_params.get("api-version", "")
        location = f"{base}/emails/operations/{operation_id}?api-version={api_version}"
        answer = JSONResponse(
            {"id": operation_id, "status": "Running"},
            202,
            headers={"Operation-Location": location, RESULT: "accepted"},
        )
        if step.drop_response:
            log.info("ACS send %s -> 202, connection dropped (injected)", key)
            return LostResponse(answer)
        log.info("ACS send %s -> 202", key)
        return answer

    async def acs_operation(request: Request) -> Response:
        operation = state.operations.get(request.path_params["operation_id"])
        state.record(operation.id if operation else None, request.url.path, "poll")
        if not _valid_acs_signature(request, await request.body(), state.acs_access_key):
            return _acs_error(401, "Denied", "Denied by the HMAC-SHA256 authentication policy")
        if operation is None:
            return _acs_error(404, "NotFound", "no such operation")
        headers = {}
        if state.faults.poll_retry_after is not None:
            headers["Retry-After"] = state.faults.poll_retry_after
        if operation.polls_left > 0:
            operation.polls_left -= 1
            return JSONResponse({"id": operation.id, "status": "Running"}, headers=headers)
        body: dict[str, Any] = {"id": operation.id, "status": operation.result}
        state.report_on(operation)
        if operation.result != "Succeeded":
            body["error"] = {
                "code": "EmailDroppedAllRecipientsSuppressed",
                "message": "injected operation failure",
            }
        return JSONResponse(body, headers=headers)

    async def webhook(request: Request) -> Response:
        began = time.monotonic()
        try:
            return await _webhook(request)
        finally:
            payload = _json_object(await request.body())
            state.spans.append((began, time.monotonic(), request.url.path, payload))

    async def webhook_probe(request: Request) -> Response:
        """`HEAD` of a webhook URL (an open circuit's probe): the endpoint's fault status if it
        has one, else 405, as a receiver that only takes POSTs answers."""
        endpoint = request.path_params["endpoint"]
        state.probes[endpoint] += 1
        step = state.endpoint_faults.get(endpoint)
        status = step.status if step is not None and step.status is not None else 405
        return Response(status_code=status if status >= 300 else 405)

    async def _webhook(request: Request) -> Response:
        body = await request.body()
        key = request.headers.get("webhook-id")
        stats = state.record(key, request.url.path, "submit")
        if key is None or not _valid_webhook_signature(request, body, state.webhook_secret):
            return JSONResponse({"error": "invalid signature"}, 401)
        endpoint = request.path_params["endpoint"]
        step = state.next_step(key, request, endpoint)
        fault = await _apply_fault(state, step, stats)
        if fault is not None:
            log.info("webhook %s %s -> %s (injected)", request.url.path, key, fault.status_code)
            return fault
        window_s = state.faults.webhook_dedupe_window_s
        if state.webhook_ids.first_time(key, time.time(), window_s):
            state.log_delivery(key, endpoint, request, body)
        if step.drop_response:
            log.info("webhook %s %s -> connection dropped (injected)", request.url.path, key)
            # A 204 would be whole once its headers are out: a body is what gets cut off.
            return LostResponse(Response(b"received", 200))
        log.info("webhook %s %s -> 204", request.url.path, key)
        return Response(status_code=204)

    async def admin_stats(request: Request) -> Response:
        return JSONResponse(
            {
                "keys": {key: _stats_json(stats) for key, stats in state.keys.items()},
                "totals": {
                    "requests": len(state.requests),
                    "submits": sum(s.submits for s in state.keys.values()),
                    "deliveries": sum(s.deliveries for s in state.keys.values()),
                    "duplicates": sum(max(0, s.deliveries - 1) for s in state.keys.values()),
                    "early_requests": sum(s.early_requests for s in state.keys.values()),
                    "reports_sent": state.reports.sent,
                    "report_failures": state.reports.failures,
                    "hidden_limit_refused": len(state.hidden_refused),
                },
            }
        )

    async def admin_key(request: Request) -> Response:
        stats = state.keys.get(request.path_params["key"], KeyStats())
        return JSONResponse(_stats_json(stats))

    async def admin_max_rate(request: Request) -> Response:
        prefix = request.query_params.get("prefix", "/")
        window_s = float(request.query_params.get("window_s", "1"))
        where = _where(request)
        return JSONResponse(
            {
                "prefix": prefix,
                "window_s": window_s,
                "max": state.max_in_window(prefix, window_s, where),
            }
        )

    async def admin_max_in_flight(request: Request) -> Response:
        prefix = request.query_params.get("prefix", "/")
        return JSONResponse({"prefix": prefix, "max": state.max_in_flight(prefix, _where(request))})

    async def admin_probes(request: Request) -> Response:
        return JSONResponse(dict(state.probes))

    async def admin_faults(request: Request) -> Response:
        """GET the faults; PUT replaces them all (unnamed fields back to their defaults, the
        report URL included); PATCH changes only the fields it names."""
        if request.method in ("PUT", "PATCH"):
            base = state.faults if request.method == "PATCH" else FaultConfig()
            try:
                changes = await request.json()
                if not isinstance(changes, dict):
                    raise ValueError("expected a JSON object of fault fields")
                state.faults = dataclasses.replace(base, **changes)
            except (TypeError, ValueError) as err:
                return JSONResponse({"error": str(err)}, 422)
            state.rng = random.Random(state.faults.seed)
        return JSONResponse(dataclasses.asdict(state.faults))

    async def admin_script(request: Request) -> Response:
        spec = await request.json()
        state.scripts[spec["key"]] = [Step(**step) for step in spec["steps"]]
        return JSONResponse({"key": spec["key"], "steps": len(spec["steps"])})

    async def admin_endpoint(request: Request) -> Response:
        endpoint = request.path_params["endpoint"]
        if request.method == "DELETE":
            state.endpoint_faults.pop(endpoint, None)
            return Response(status_code=204)
        try:
            step = Step(**await request.json())
        except (TypeError, ValueError) as err:
            return JSONResponse({"error": str(err)}, 422)
        state.endpoint_faults[endpoint] = step
        return JSONResponse({"endpoint": endpoint, **dataclasses.asdict(step)})

    async def admin_limit(request: Request) -> Response:
        """PUT `{"limit": 20}`: the endpoint admits that many submits a second (a token bucket;
        above it a 429 with the faults' `retry_after`); DELETE: back to `hidden_limit`."""
        endpoint = request.path_params["endpoint"]
        if request.method == "DELETE":
            state.endpoint_limits.pop(endpoint, None)
            return Response(status_code=204)
        try:
            limit = float((await request.json())["limit"])
            if limit < 0:
                raise ValueError("limit must be 0 (none) or more")
        except (TypeError, ValueError, KeyError) as err:
            return JSONResponse({"error": str(err)}, 422)
        state.endpoint_limits[endpoint] = limit
        return JSONResponse({"endpoint": endpoint, "limit": limit})

    async def admin_deliveries(request: Request) -> Response:
        endpoint = request.query_params.get("endpoint")
        return JSONResponse(
            [entry for entry in state.delivery_log if endpoint in (None, entry["endpoint"])]
        )

    async def admin_reset(request: Request) -> Response:
        # Reports still waiting to go out would land after the reset and count against it.
        await state.reports.close()
        state.reset()
        return Response(status_code=204)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # Under `uvicorn.run` (main) this is where reports in flight are cancelled on shutdown.
        yield
        await state.reports.close()

    return Starlette(
        lifespan=lifespan,
        middleware=[Middleware(_HungUpCallers)],
        routes=[
            Route("/emails:send", acs_send, methods=["POST"]),
            Route("/emails/operations/{operation_id}", acs_operation, methods=["GET"]),
            *fake_sms.routes(state),
            *fake_payments.routes(state),
            Route("/webhook/{endpoint:path}", webhook, methods=["POST"]),
            Route("/webhook/{endpoint:path}", webhook_probe, methods=["HEAD"]),
            Route("/_admin/stats", admin_stats),
            Route("/_admin/keys/{key}", admin_key),
            Route("/_admin/max-rate", admin_max_rate),
            Route("/_admin/max-in-flight", admin_max_in_flight),
            Route("/_admin/probes", admin_probes),
            Route("/_admin/faults", admin_faults, methods=["GET", "PUT", "PATCH"]),
            Route("/_admin/script", admin_script, methods=["POST"]),
            Route("/_admin/endpoints/{endpoint:path}", admin_endpoint, methods=["PUT", "DELETE"]),
            Route("/_admin/limits/{endpoint:path}", admin_limit, methods=["PUT", "DELETE"]),
            Route("/_admin/reset", admin_reset, methods=["POST"]),
            Route("/_admin/deliveries", admin_deliveries),
        ],
    )


class _HungUpCallers:
    """A caller that hangs up before its request's body arrived (a worker killed while it
    sent) is gone: the request never reached the service, so nothing records it, nothing
    answers, and nothing is logged as an error, as with a real service."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        with contextlib.suppress(ClientDisconnect):
            await self.app(scope, receive, send)


def _json_object(body: bytes) -> dict[str, Any]:
    try:
        found = json.loads(body)
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


# `where.tenant=a`: only requests whose JSON payload's `tenant` is `a`.
_WHERE = "where."


def _where(request: Request) -> dict[str, str]:
    return {
        name[len(_WHERE) :]: value
        for name, value in request.query_params.items()
        if name.startswith(_WHERE)
    }


def _where_params(where: Mapping[str, str] | None) -> dict[str, str]:
    return {f"{_WHERE}{field}": value for field, value in (where or {}).items()}


# The service's limit on to + cc + bcc addresses in one send.
MAX_EMAIL_RECIPIENTS = 50


def email_body_problem(body: bytes) -> str | None:
    """Why ACS would refuse this send-email body with a 400, naming the field; None if valid."""
    try:
        email = json.loads(body)
    except ValueError:
        return "The request body is not valid JSON."
    if not isinstance(email, dict):
        return "The request body must be a JSON object."
    if not _non_empty_string(email.get("senderAddress")):
        return "The senderAddress field is required and must be a non-empty string."
    problem = _recipients_problem(email.get("recipients"))
    if problem is not None:
        return problem
    problem = _content_problem(email.get("content"))
    if problem is not None:
        return problem
    return _attachments_problem(email.get("attachments"))


def _non_empty_string(value: object) -> bool:
    return isinstance(value, str) and value != ""


def _recipients_problem(recipients: object) -> str | None:
    if not isinstance(recipients, dict):
        return "The recipients field is required and must be an object."
    count = 0
    for kind in ("to", "cc", "bcc"):
        entries = recipients.get(kind)
        if entries is None:
            continue
        if not isinstance(entries, list):
            return f"The recipients.{kind} field must be an array of email addresses."
        for index, entry in enumerate(entries):
            where = f"recipients.{kind}[{index}]"
            if not isinstance(entry, dict) or not _non_empty_string(entry.get("address")):
                return f"The {where}.address field is required and must be a non-empty string."
            if "displayName" in entry and not isinstance(entry["displayName"], str):
                return f"The {where}.displayName field must be a string."
        count += len(entries)
    if count == 0:
        return "The recipients field must have at least one address in to, cc or bcc."
    if count > MAX_EMAIL_RECIPIENTS:
        return (
            f"The recipients field has {count} addresses in to, cc and bcc;"
            f" at most {MAX_EMAIL_RECIPIENTS} are allowed."
        )
    return None


def _content_problem(content: object) -> str | None:
    if not isinstance(content, dict):
        return "The content field is required and must be an object."
    if not _non_empty_string(content.get("subject")):
        return "The content.subject field is required and must be a non-empty string."
    for part in ("plainText", "html"):
        if part in content and not isinstance(content[part], str):
            return f"The content.{part} field must be a string."
    if not (_non_empty_string(content.get("plainText")) or _non_empty_string(content.get("html"))):
        return "The content field must have a non-empty content.plainText or content.html."
    return None


def _attachments_problem(attachments: object) -> str | None:
    if attachments is None:
        return None
    if not isinstance(attachments, list):
        return "The attachments field must be an array."
    for index, attachment in enumerate(attachments):
        if not isinstance(attachment, dict):
            return f"The attachments[{index}] field must be an object."
        for name in ("name", "contentType", "contentInBase64"):
            if not _non_empty_string(attachment.get(name)):
                return (
                    f"The attachments[{index}].{name} field is required"
                    " and must be a non-empty string."
                )
    return None


def _email_parties(body: bytes) -> tuple[str, list[str]]:
    """The sender and the to/cc/bcc addresses of an ACS send-email body (empty if unreadable)."""
    try:
        email = json.loads(body)
    except ValueError:
        return "", []
    if not isinstance(email, dict):
        return "", []
    recipients = email.get("recipients")
    if not isinstance(recipients, dict):
        return str(email.get("senderAddress", "")), []
    addresses = [
        entry["address"]
        for kind in ("to", "cc", "bcc")
        for entry in recipients.get(kind) or []
        if isinstance(entry, dict) and isinstance(entry.get("address"), str)
    ]
    return str(email.get("senderAddress", "")), addresses


def _stats_json(stats: KeyStats) -> dict[str, Any]:
    return {
        "submits": stats.submits,
        "deliveries": stats.deliveries,
        "polls": stats.polls,
        "early_requests": stats.early_requests,
        "request_times": stats.request_times,
    }


class FakeProviderAdmin:
    """Reads counters and sets faults over HTTP, for a fake in this process or another."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")

    async def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        async with httpx.AsyncClient(
            base_url=self.url, timeout=10, verify=shared_tls_context()
        ) as client:
            response = await client.request(method, path, **kwargs)
            response.raise_for_status()
            return response.json() if response.content else None

    async def stats(self) -> dict[str, Any]:
        return dict(await self._call("GET", "/_admin/stats"))

    async def key_stats(self, key: str) -> dict[str, Any]:
        return dict(await self._call("GET", f"/_admin/keys/{key}"))

    async def max_rate(
        self, prefix: str, window_s: float, where: Mapping[str, str] | None = None
    ) -> int:
        """Most requests in any `window_s` window (with `where`: webhook payload fields)."""
        params = {"prefix": prefix, "window_s": window_s, **_where_params(where)}
        answer = await self._call("GET", "/_admin/max-rate", params=params)
        return int(answer["max"])

    async def max_in_flight(self, prefix: str, where: Mapping[str, str] | None = None) -> int:
        """Most webhook requests out at once (with `where`: whose payload has those fields)."""
        params = {"prefix": prefix, **_where_params(where)}
        answer = await self._call("GET", "/_admin/max-in-flight", params=params)
        return int(answer["max"])

    async def probes(self) -> dict[str, int]:
        """`HEAD` probes received, by webhook endpoint."""
        return dict(await self._call("GET", "/_admin/probes"))

    async def set_faults(self, **faults: Any) -> None:
        """Replace every fault: fields not named go back to their defaults."""
        await self._call("PUT", "/_admin/faults", json=faults)

    async def change_faults(self, **faults: Any) -> dict[str, Any]:
        """Change only the named faults (PATCH); the answer is the whole config."""
        return dict(await self._call("PATCH", "/_admin/faults", json=faults))

    async def script(self, key: str, steps: list[dict[str, Any]]) -> None:
        await self._call("POST", "/_admin/script", json={"key": key, "steps": steps})

    async def set_endpoint_fault(self, endpoint: str, **step: Any) -> None:
        """Answer every request to `endpoint` with `step` (e.g. `status=410`) until cleared."""
        await self._call("PUT", f"/_admin/endpoints/{endpoint}", json=step)

    async def clear_endpoint_fault(self, endpoint: str) -> None:
        await self._call("DELETE", f"/_admin/endpoints/{endpoint}")

    async def set_hidden_limit(self, endpoint: str, limit: float) -> None:
        """Admit at most `limit` submits a second to `endpoint` (429 above it) until cleared."""
        await self._call("PUT", f"/_admin/limits/{endpoint}", json={"limit": limit})

    async def clear_hidden_limit(self, endpoint: str) -> None:
        await self._call("DELETE", f"/_admin/limits/{endpoint}")

    async def deliveries(self, endpoint: str | None = None) -> list[dict[str, Any]]:
        """First deliveries in arrival order (`seq`), optionally of one endpoint."""
        params = {"endpoint": endpoint} if endpoint is not None else {}
        return list(await self._call("GET", "/_admin/deliveries", params=params))

    async def reset(self) -> None:
        await self._call("POST", "/_admin/reset")


@dataclass
class FakeProvider:
    """A fake provider running in this process: its base URL, state and admin client."""

    url: str
    state: FakeProviderState
    admin: FakeProviderAdmin


@contextlib.asynccontextmanager
async def run_fake_provider(
    faults: FaultConfig | None = None,
    acs_access_key: str = DEFAULT_ACS_ACCESS_KEY,
    webhook_secret: str = DEFAULT_WEBHOOK_SECRET,
    events_secret: str | None = None,
    payment_token: str = DEFAULT_PAYMENT_TOKEN,
) -> AsyncIterator[FakeProvider]:
    """Serve the fake on a free loopback port for the duration of the block."""
    state = FakeProviderState(
        acs_access_key, webhook_secret, faults or FaultConfig(), events_secret, payment_token
    )
    try:
        async with serve_in_background(create_app(state)) as url:
            yield FakeProvider(url=url, state=state, admin=FakeProviderAdmin(url))
    finally:
        await state.reports.close()


def command_line_parser() -> argparse.ArgumentParser:
    """--host and --port, then one flag per FaultConfig field, derived so the two cannot drift."""
    parser = argparse.ArgumentParser(
        description="Fake ACS Email + Standard Webhooks provider",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        allow_abbrev=False,  # a shortened flag would break silently when a field is added
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=8025, help="port to listen on")
    faults = parser.add_argument_group("faults (at run time: PUT /_admin/faults)")
    types = typing.get_type_hints(FaultConfig)  # field.type is a string under __future__
    for fault in dataclasses.fields(FaultConfig):
        flag, kind = "--" + fault.name.replace("_", "-"), types[fault.name]
        help_text = fault.metadata.get("help")
        if kind is bool:
            faults.add_argument(
                flag, action=argparse.BooleanOptionalAction, default=fault.default, help=help_text
            )
            continue
        # `int | None` parses as int: leaving the flag out is what keeps it None.
        convert = next((arg for arg in typing.get_args(kind) if arg is not type(None)), kind)
        faults.add_argument(flag, type=convert, default=fault.default, help=help_text)
    return parser


def faults_from(args: argparse.Namespace) -> FaultConfig:
    """The FaultConfig the parsed flags describe."""
    return FaultConfig(
        **{fault.name: getattr(args, fault.name) for fault in dataclasses.fields(FaultConfig)}
    )


def configure_logging() -> None:
    """INFO lines of the fake, with the events secret its report URLs carry written `***`
    (httpx logs each request's URL)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s fake: %(message)s")
    install_log_redaction()


def main(argv: list[str] | None = None) -> None:
    parser = command_line_parser()
    args = parser.parse_args(argv)
    try:
        faults = faults_from(args)
    except ValueError as err:  # a value argparse cannot check, such as --report-schema
        parser.error(str(err))
    configure_logging()
    state = FakeProviderState(
        os.environ.get("FAKE_ACS_ACCESS_KEY", DEFAULT_ACS_ACCESS_KEY),
        os.environ.get("FAKE_WEBHOOK_SECRET", DEFAULT_WEBHOOK_SECRET),
        faults,
        # config/destinations.toml's fallback too, so an unset variable still pairs them.
        os.environ.get("FAKE_EMAIL_EVENTS_SECRET") or DEV_EVENTS_SECRET,
        os.environ.get("FAKE_PAYMENT_TOKEN", DEFAULT_PAYMENT_TOKEN),
    )
    uvicorn.run(create_app(state), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
