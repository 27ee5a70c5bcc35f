"""RFC 9457 problem+json for every error, mapped in one place.

Bad input is always a 4xx with a `detail` that says what to fix; Temporal or the database being
unreachable, or a Temporal call cancelled or past its deadline, is a 503 with `Retry-After`;
anything else is a 500 whose body carries no stack trace (the trace is logged server-side).

Every problem carries a stable `code` (`item-not-found`, `seat-taken`) beside its `type`, the URI
of a page the API serves: `/problems/<code>`, or the broader code's a refinement keeps
(`seat-taken` keeps `/problems/command-conflict`); `PUBLIC_BASE_URL` makes it absolute. The
codes, their statuses and what to do about each are listed in `api/problem_codes.py`.

A request body whose arrays and objects nest deeper than `MAX_JSON_DEPTH` is refused (422)
before anything parses it: FastAPI's JSON parser, pydantic and the JSON encoders all recurse.
So is one holding a value no JSON body can carry on (a lone surrogate, which has no UTF-8 form,
or NaN, Infinity, 1e400): it would fail a hash, a response, a read-model row or a provider's
body later. `items:batch` refuses such values per item instead (its item model checks them).
"""

from __future__ import annotations

import json
import logging
import re
from collections import deque
from collections.abc import Sequence
from itertools import accumulate
from typing import Any

from durable_outbox_temporal import (
    CannotCancel,
    CommandConflict,
    EffectNotFailed,
    IdempotencyConflict,
    InvalidCommand,
    InvalidRequest,
    ItemErased,
    ItemFailedUseRedrive,
    ItemNotFound,
    LaneFull,
    LaneNotFound,
    LaneNotHalted,
    NotErasable,
    NotRedrivable,
    OutboxError,
    PayloadPruned,
    PayloadTooLarge,
    TemporalUnavailable,
    UnknownAggregate,
    UnknownCommand,
    UnknownDestination,
    UnknownEffect,
    is_temporal_unavailable,
)
from durable_outbox_temporal.contract.sealing import SealedValueError
from durable_outbox_temporal.validation import MAX_JSON_DEPTH, unsendable_json_value
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DBAPIError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from temporalio.client import RPCTimeoutOrCancelledError
from temporalio.service import RPCError, RPCStatusCode

from api.problem_codes import FALLBACK_CODE, PROBLEM_CODES, STATUS_CODES, domain_code
from readmodel.db import missing_schema_object
from readmodel.store import InvalidCursor
from service.dead_letters import NotADeadLetter, RedriveBatchNotFound
from service.items import ItemPruned
from service.replays import ReplayNeedsConfirmation, ReplayNotFound
from service.schedules import InvalidSchedule, ScheduleExists, ScheduleNotFound

log = logging.getLogger("outbox.api")

PROBLEM_JSON = "application/problem+json"
RETRY_AFTER_S = "5"

# Besides the client's "unavailable" codes (down, deadline exceeded, throttling): a call the
# server cancelled, as it does under load. Retrying later is the fix, so it is a 503 too.
_TEMPORAL_RETRY_LATER = (RPCStatusCode.CANCELLED,)

# (HTTP status, problem code, title) per client error.
_OUTBOX_ERRORS: dict[type[OutboxError], tuple[int, str, str]] = {
    InvalidRequest: (422, "invalid-request", "Invalid request"),
    PayloadTooLarge: (413, "request-too-large", "Request body too large"),
    UnknownDestination: (404, "unknown-destination", "Unknown destination"),
    IdempotencyConflict: (409, "idempotency-conflict", "Idempotency-Key reused"),
    ItemFailedUseRedrive: (409, "item-failed", "Item failed; redrive it"),
    ItemNotFound: (404, "item-not-found", "Item not found"),
    ItemPruned: (410, "item-pruned", "Item pruned by retention"),
    CannotCancel: (409, "cannot-cancel", "Item can no longer be cancelled"),
    NotRedrivable: (409, "not-redrivable", "Item is not failed"),
    ItemErased: (409, "item-erased", "Item's payload erased"),
    PayloadPruned: (409, "payload-pruned", "Item's payload pruned"),
    NotErasable: (409, "not-erasable", "Item has not ended"),
    LaneNotFound: (404, "lane-not-found", "Ordering lane not found"),
    LaneNotHalted: (409, "lane-not-halted", "Ordering lane is not halted"),
    UnknownAggregate: (404, "unknown-aggregate", "Unknown aggregate"),
    UnknownCommand: (404, "unknown-command", "Unknown command"),
    CommandConflict: (409, "command-conflict", "Command refused"),
    InvalidCommand: (422, "invalid-command", "Invalid command"),
    UnknownEffect: (404, "unknown-effect", "Unknown effect"),
    EffectNotFailed: (409, "effect-not-failed", "Effect has not failed"),
    ScheduleNotFound: (404, "schedule-not-found", "Schedule not found"),
    NotADeadLetter: (409, "not-a-dead-letter", "Item has not failed"),
    RedriveBatchNotFound: (404, "redrive-batch-not-found", "Redrive batch not found"),
    ReplayNotFound: (404, "replay-not-found", "Replay not found"),
    ReplayNeedsConfirmation: (409, "replay-confirmation-required", "Replay needs confirm_count"),
    ScheduleExists: (409, "schedule-exists", "Schedule exists"),
}
_HTTP_TITLES = {
    400: "Bad request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not found",
    405: "Method not allowed",
    413: "Request body too large",
    422: "Invalid request",
    503: "Service unavailable",
}


class ApiProblem(Exception):
    """Raise anywhere in the API to answer with a problem; `extra` adds members to the body.
    `slug` names the problem's kind, its `type` (listed in `api/problem_codes.py`; `about:blank`
    takes the status's general one), and is its `code` unless `code` is set to refine it."""

    def __init__(
        self,
        status: int,
        slug: str,
        title: str,
        detail: str,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(detail)
        self.status, self.title, self.detail = status, title, detail
        self.slug = problem_code(status, slug)
        self.code = self.slug
        self.headers = headers or {}
        self.extra = extra

    @classmethod
    def from_outbox_error(cls, err: OutboxError, **extra: Any) -> ApiProblem:
        """The client error's problem, optionally with extra members (a link, say)."""
        if isinstance(err, TemporalUnavailable):
            return _temporal_unavailable()
        status, slug, title = _OUTBOX_ERRORS.get(type(err), (400, "bad-request", "Bad request"))
        # The domain's own reason is the more precise code (`SeatTaken`: `seat-taken`).
        reason = domain_code(err.reason) if err.reason else None
        problem = cls(status, slug, title, str(err), **extra)
        if reason in PROBLEM_CODES:
            problem.code = reason
        return problem

    def body(self, request: Request | None) -> dict[str, Any]:
        """The JSON members; `instance` is the request path when there is a request."""
        return problem_body(
            request, self.status, self.slug, self.title, self.detail, code=self.code, **self.extra
        )


def problem_code(status: int, slug: str) -> str:
    """The problem's code: `slug` itself, or for `about:blank` the status's general code."""
    if slug == "about:blank":
        return STATUS_CODES.get(status, FALLBACK_CODE)
    return slug


def problem_type(request: Request | None, code: str) -> str:
    """The URI of the code's page: under `PUBLIC_BASE_URL` when set, else relative to the API
    (behind the proxy's path prefix, if any)."""
    base = ""
    if request is not None:
        app = request.scope.get("app")
        base = getattr(getattr(app, "state", None), "public_base_url", "") or str(
            request.scope.get("root_path", "")
        )
    return f"{base.rstrip('/')}/problems/{code}"


def problem_body(
    request: Request | None,
    status: int,
    slug: str,
    title: str,
    detail: str,
    *,
    code: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """The JSON members of a problem: `type` is the URI of the page of its kind (`slug`),
    `code` the kind or, given, a refinement of it."""
    kind = problem_code(status, slug)
    body: dict[str, Any] = {
        "type": problem_type(request, kind),
        "code": code or kind,
        "title": title,
        "status": status,
        "detail": detail,
    }
    if request is not None:
        body["instance"] = request.url.path
    body.update(extra)
    return body


def problem_response(request: Request | None, problem: ApiProblem) -> JSONResponse:
    """The problem as an `application/problem+json` response."""
    return JSONResponse(
        problem.body(request),
        status_code=problem.status,
        media_type=PROBLEM_JSON,
        headers=problem.headers or None,
    )


def known_problem(err: Exception) -> ApiProblem | None:
    """The problem an expected error stands for; None for anything else (a bug: 500)."""
    if isinstance(err, ApiProblem):
        return err
    if isinstance(err, LaneFull):
        # Backpressure, not a refusal: the same request succeeds once the lane has drained.
        return ApiProblem(
            429, "lane-full", "Ordering lane is full", str(err), {"Retry-After": RETRY_AFTER_S}
        )
    if isinstance(err, InvalidSchedule):
        # Found past pydantic (unknown destination, placeholder, the server's cron parse): listed
        # per field like pydantic's own errors.
        errors = [
            {"location": ["body", *location.split(".")], "message": message, "type": "value_error"}
            for location, message in err.errors
        ]
        return ApiProblem(422, "invalid-request", "Invalid request", str(err), errors=errors)
    if isinstance(err, ItemPruned):
        # How it ended, from its key's memory, on every route that asks for the item.
        pruned = err.pruned
        return ApiProblem.from_outbox_error(
            err,
            item_status=str(pruned.status),
            finished_at=pruned.finished_at.isoformat() if pruned.finished_at else None,
            pruned_at=pruned.pruned_at.isoformat(),
        )
    if isinstance(err, OutboxError):
        return ApiProblem.from_outbox_error(err)
    if isinstance(err, InvalidCursor):
        return ApiProblem(422, "invalid-cursor", "Invalid cursor", str(err))
    if isinstance(err, SealedValueError):
        # The data is there, sealed; this API cannot open it until it is given the key.
        return ApiProblem(
            503, "payload-key-missing", "Payload key missing", str(err), key_id=err.key_id
        )
    if is_temporal_unavailable(err) or (
        isinstance(err, RPCError) and err.status in _TEMPORAL_RETRY_LATER
    ):
        return _temporal_unavailable()
    if isinstance(err, RPCError) and err.status == RPCStatusCode.UNIMPLEMENTED:
        # E.g. task-queue configuration on Temporal's time-skipping test server.
        return ApiProblem(
            501,
            "not-supported-by-temporal",
            "Not supported by this Temporal server",
            f"the Temporal server does not support this: {err.message}",
        )
    if isinstance(err, RPCError) and err.status == RPCStatusCode.NOT_FOUND:
        # The item ended or vanished between two calls of one request: a race, not a bug.
        return ApiProblem(404, "item-not-found", "Item not found", "no such item")
    if isinstance(err, DBAPIError) and (missing := missing_schema_object(err)) is not None:
        # Retrying cannot help: the schema must be migrated (or this release rolled back).
        return ApiProblem(
            503,
            "schema-not-at-head",
            "Read model schema not at head",
            f"the read model's database has no {missing}: its schema is behind this release;"
            " run `alembic upgrade heads` with this release's DATABASE_URL",
            missing=missing,
        )
    if isinstance(err, DBAPIError):
        return ApiProblem(
            503,
            "database-unavailable",
            "Database unavailable",
            "the read-model database did not answer; retry later",
            {"Retry-After": RETRY_AFTER_S},
        )
    return None


def validation_problem(
    errors: Sequence[Any], location_prefix: Sequence[str | int] = ()
) -> ApiProblem:
    """A 422 listing each invalid field from pydantic's errors (never echoing the input)."""
    listed = [
        {
            "location": [_printable(part) for part in (*location_prefix, *error.get("loc", ()))],
            "message": error.get("msg", ""),
            "type": error.get("type", ""),
        }
        for error in errors
    ]
    summary = "; ".join(f"{_field_name(e['location'])}: {e['message']}" for e in listed)
    return ApiProblem(422, "invalid-request", "Invalid request", summary, errors=listed)


def install_error_handlers(app: FastAPI) -> None:
    """Route every exception the API can meet to a problem+json response, and refuse bodies
    nested too deeply to parse safely."""
    # Added first, so it runs innermost: the body size limit has bounded the body by then.
    app.add_middleware(JsonBodyCheck, max_depth=MAX_JSON_DEPTH)

    async def _known(request: Request, err: Exception) -> JSONResponse:
        problem = known_problem(err)
        if problem is None:
            log.exception("unhandled error on %s %s", request.method, request.url.path)
            return problem_response(request, internal_error())
        if problem.status >= 500 and problem is not err:
            log.warning("%s on %s %s: %s", problem.title, request.method, request.url.path, err)
        return problem_response(request, problem)

    for error_type in (
        ApiProblem,
        OutboxError,
        InvalidCursor,
        RPCError,
        RPCTimeoutOrCancelledError,
        DBAPIError,
        SealedValueError,
    ):
        app.add_exception_handler(error_type, _known)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, err: RequestValidationError) -> JSONResponse:
        errors = err.errors()
        if any(error.get("type") == "json_invalid" for error in errors):
            malformed = ApiProblem(
                400, "malformed-json", "Malformed JSON", "the body is not valid JSON"
            )
            return problem_response(request, malformed)
        if not _is_json(request.headers.get("content-type")) and any(
            tuple(error.get("loc", ())) == ("body",) for error in errors
        ):
            # FastAPI reads a body as JSON only when it says so (a CSRF defence we keep).
            unsupported = ApiProblem(
                415,
                "unsupported-media-type",
                "Unsupported media type",
                "send the body as JSON with 'Content-Type: application/json'",
            )
            return problem_response(request, unsupported)
        return problem_response(request, validation_problem(errors))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, err: StarletteHTTPException) -> JSONResponse:
        title = _HTTP_TITLES.get(err.status_code, "Error")
        detail = err.detail if isinstance(err.detail, str) else title
        if err.status_code == 404 and detail == "Not Found":
            detail = f"no route {request.method} {request.url.path}"
        elif err.status_code == 405 and detail == "Method Not Allowed":
            detail = f"{request.method} is not allowed on {request.url.path}"
        headers = dict(err.headers) if err.headers else None
        problem = ApiProblem(err.status_code, "about:blank", title, detail, headers)
        return problem_response(request, problem)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, err: Exception) -> JSONResponse:
        # Starlette re-raises after this answer, so the server logs the traceback itself.
        log.error("unhandled %s on %s %s", type(err).__name__, request.method, request.url.path)
        return problem_response(request, internal_error())


def _printable(part: object) -> str:
    """A location part as text with a UTF-8 form: a lone surrogate (in an unknown field's name,
    say) is written as its escape, or the answer itself could not be encoded."""
    return str(part).encode("utf-8", "backslashreplace").decode("utf-8")


def _field_name(location: list[str]) -> str:
    # Locations start with "body", "query", "path" or "header"; a leading "body" is dropped
    # since almost every mistake is there ("payload", not "body.payload").
    if location[:1] == ["body"] and len(location) > 1:
        location = location[1:]
    return ".".join(location)


def _is_json(content_type: str | None) -> bool:
    media_type = (content_type or "").partition(";")[0].strip().lower()
    return media_type == "application/json" or (
        media_type.startswith("application/") and media_type.endswith("+json")
    )


def internal_error() -> ApiProblem:
    """The 500 of an unexpected error: logged where it is caught, its body says nothing more."""
    return ApiProblem(
        500, "internal", "Internal error", "an unexpected error occurred; it is logged"
    )


def _temporal_unavailable() -> ApiProblem:
    return ApiProblem(
        503,
        "temporal-unavailable",
        "Temporal unavailable",
        "the workflow service did not answer; retry later",
        {"Retry-After": RETRY_AFTER_S},
    )


# A JSON string (escapes included), then anything but a bracket: what is left of a body once
# both are removed is its brackets, in order.
_JSON_STRING = re.compile(rb'"(?:[^"\\]++|\\.)*+"')
_NOT_A_BRACKET = re.compile(rb"[^\[\]{}]+")
_NESTING_STEP = [0] * 256
for _opening in b"[{":
    _NESTING_STEP[_opening] = 1
for _closing in b"]}":
    _NESTING_STEP[_closing] = -1


def json_nesting_exceeds(body: bytes, max_depth: int) -> bool:
    """Whether arrays and objects nest deeper than `max_depth` in the JSON text `body`; counts
    without parsing (nor recursing), brackets inside strings aside. Text that is not JSON gets
    an answer too: the parser refuses it afterwards anyway."""
    if body.count(b"[") + body.count(b"{") <= max_depth:
        return False
    brackets = _NOT_A_BRACKET.sub(b"", _JSON_STRING.sub(b"", body))
    return max(accumulate(map(_NESTING_STEP.__getitem__, brackets)), default=0) > max_depth


def too_deeply_nested(max_depth: int) -> ApiProblem:
    """The 422 for a body (or a document inside one) nested deeper than `max_depth`."""
    return ApiProblem(
        422,
        "too-deeply-nested",
        "JSON nested too deeply",
        f"arrays and objects may nest at most {max_depth} levels deep in a request body",
        max_depth=max_depth,
    )


# What a body needs to hold for a value in it to be unsendable: a surrogate's escape (or its
# bytes, which Python's JSON parser takes too), NaN, Infinity, or a number that may overflow
# (an exponent of 100 or more, or 200 digits and one below 100).
_MAYBE_UNSENDABLE = re.compile(
    rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]|NaN|Infinity|[0-9][eE]\+?0*[1-9][0-9]{2}|[0-9]{200}"
)
# The batch answers each item on its own, and its item model refuses these values per item:
# one bad item must not refuse the others.
_CHECKS_VALUES_PER_ITEM = re.compile(r"/items:batch$")
# The codec's bodies (up to CODEC_MAX_REQUEST_BYTES of base64) are parsed off the event loop,
# in the codec's processes, into a shape of fixed depth whose strings are base64: scanning them
# here held every other request of the process (docs/decisions/codec-off-the-loop.md).
_PARSED_OFF_THE_LOOP = re.compile(r"^/codec/(?:encode|decode)$")


def unsendable_json_problem(body: bytes) -> ApiProblem | None:
    """The 422 naming a value of the JSON text `body` that no JSON body can carry on (see
    `unsendable_json_value`); None when there is none, or `body` is no JSON (the parser's
    answer stands then)."""
    if not _MAYBE_UNSENDABLE.search(body):
        return None
    try:
        document = json.loads(body)
    except ValueError:
        return None
    unsendable = unsendable_json_value(document)
    if unsendable is None:
        return None
    path, problem = unsendable
    return validation_problem([{"loc": ("body", *path), "msg": problem, "type": "value_error"}])


class JsonBodyCheck:
    """422 problem+json for a request body nested deeper than `max_depth`, or holding a value no
    JSON body can carry on, before any route (or FastAPI's parser) reads it; the body is then
    handed on unchanged."""

    def __init__(self, app: ASGIApp, max_depth: int) -> None:
        self.app = app
        self.max_depth = max_depth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or _PARSED_OFF_THE_LOOP.match(scope.get("path", "")):
            await self.app(scope, receive, send)
            return
        received: deque[Message] = deque()
        while True:
            message = await receive()
            received.append(message)
            if message["type"] != "http.request" or not message.get("more_body", False):
                break
        body = b"".join(m.get("body", b"") for m in received if m["type"] == "http.request")
        problem: ApiProblem | None = None
        if json_nesting_exceeds(body, self.max_depth):
            problem = too_deeply_nested(self.max_depth)
        elif not _CHECKS_VALUES_PER_ITEM.search(scope.get("path", "")):
            problem = unsendable_json_problem(body)
        if problem is not None:
            members = problem.body(Request(scope)) | {"instance": scope.get("path", "")}
            content = json.dumps(members)
            await send(
                {
                    "type": "http.response.start",
                    "status": problem.status,
                    "headers": [
                        (b"content-type", PROBLEM_JSON.encode()),
                        (b"content-length", str(len(content.encode())).encode()),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": content.encode()})
            return

        async def replay() -> Message:
            return received.popleft() if received else await receive()

        await self.app(scope, replay, send)
