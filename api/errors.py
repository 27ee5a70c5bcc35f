"""RFC 9457 problem+json for every error, mapped in one place.

Bad input is always a 4xx with a `detail` that says what to fix; an unexpected failure is a 500
whose body carries no stack trace (it is logged server-side with the request id).
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DBAPIError
from starlette.exceptions import HTTPException as StarletteHTTPException
from temporalio.service import RPCError, RPCStatusCode

from common.client import (
    CannotCancel,
    IdempotencyConflict,
    InvalidRequest,
    ItemFailedUseRedrive,
    ItemNotFound,
    NotRedrivable,
    OutboxError,
    UnknownDestination,
)
from readmodel.store import InvalidCursor

log = logging.getLogger("outbox.api")

PROBLEM_JSON = "application/problem+json"

# (HTTP status, problem slug, title) per client error.
_OUTBOX_ERRORS: dict[type[OutboxError], tuple[int, str, str]] = {
    InvalidRequest: (422, "invalid-request", "Invalid request"),
    UnknownDestination: (404, "unknown-destination", "Unknown destination"),
    IdempotencyConflict: (409, "idempotency-conflict", "Idempotency-Key reused"),
    ItemFailedUseRedrive: (409, "item-failed", "Item failed; redrive it"),
    ItemNotFound: (404, "item-not-found", "Item not found"),
    CannotCancel: (409, "cannot-cancel", "Item can no longer be cancelled"),
    NotRedrivable: (409, "not-redrivable", "Item is not failed"),
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
    """Raise anywhere in the API to answer with a problem; `extra` adds members to the body."""

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
        self.status, self.slug, self.title, self.detail = status, slug, title, detail
        self.headers = headers or {}
        self.extra = extra


def problem_body(
    request: Request | None, status: int, slug: str, title: str, detail: str, **extra: Any
) -> dict[str, Any]:
    """The JSON members of a problem; `type` is a stable URI per kind of problem."""
    body: dict[str, Any] = {
        "type": f"/problems/{slug}" if slug != "about:blank" else slug,
        "title": title,
        "status": status,
        "detail": detail,
    }
    if request is not None:
        body["instance"] = request.url.path
    body.update(extra)
    return body


def problem(
    request: Request | None,
    status: int,
    slug: str,
    title: str,
    detail: str,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> JSONResponse:
    return JSONResponse(
        problem_body(request, status, slug, title, detail, **extra),
        status_code=status,
        media_type=PROBLEM_JSON,
        headers=headers,
    )


def outbox_error_problem(request: Request | None, err: OutboxError) -> tuple[int, dict[str, Any]]:
    """Status and body for a client error (also used per item in batch results)."""
    status, slug, title = _OUTBOX_ERRORS.get(type(err), (400, "bad-request", "Bad request"))
    return status, problem_body(request, status, slug, title, str(err))


def install_error_handlers(app: FastAPI) -> None:
    """Route every exception the API can meet to a problem+json response."""

    @app.exception_handler(ApiProblem)
    async def _api_problem(request: Request, err: ApiProblem) -> JSONResponse:
        return problem(
            request, err.status, err.slug, err.title, err.detail, err.headers, **err.extra
        )

    @app.exception_handler(OutboxError)
    async def _outbox_error(request: Request, err: OutboxError) -> JSONResponse:
        status, body = outbox_error_problem(request, err)
        return JSONResponse(body, status_code=status, media_type=PROBLEM_JSON)

    @app.exception_handler(InvalidCursor)
    async def _invalid_cursor(request: Request, err: InvalidCursor) -> JSONResponse:
        return problem(request, 422, "invalid-cursor", "Invalid cursor", str(err))

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, err: RequestValidationError) -> JSONResponse:
        errors = [
            {
                "location": [str(part) for part in error.get("loc", ())],
                "message": error.get("msg", ""),
                "type": error.get("type", ""),
            }
            for error in err.errors()
        ]
        if any(error["type"] == "json_invalid" for error in errors):
            return problem(
                request, 400, "malformed-json", "Malformed JSON", "the body is not valid JSON"
            )
        summary = "; ".join(
            f"{'.'.join(e['location'][1:] or e['location'])}: {e['message']}" for e in errors
        )
        return problem(request, 422, "invalid-request", "Invalid request", summary, errors=errors)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, err: StarletteHTTPException) -> JSONResponse:
        title = _HTTP_TITLES.get(err.status_code, "Error")
        detail = err.detail if isinstance(err.detail, str) else title
        if err.status_code == 404 and detail == "Not Found":
            detail = f"no route {request.method} {request.url.path}"
        headers = dict(err.headers) if err.headers else None
        return problem(request, err.status_code, "about:blank", title, detail, headers)

    @app.exception_handler(RPCError)
    async def _temporal(request: Request, err: RPCError) -> JSONResponse:
        if err.status in (RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED):
            log.warning("Temporal unavailable: %s", err)
            return problem(
                request,
                503,
                "temporal-unavailable",
                "Temporal unavailable",
                "the workflow service did not answer; retry later",
                {"Retry-After": "5"},
            )
        log.exception("Temporal error on %s %s", request.method, request.url.path)
        return problem(request, 500, "internal", "Internal error", "unexpected workflow error")

    @app.exception_handler(DBAPIError)
    async def _database(request: Request, err: DBAPIError) -> JSONResponse:
        log.warning("read model error on %s %s: %s", request.method, request.url.path, err)
        return problem(
            request,
            503,
            "database-unavailable",
            "Database unavailable",
            "the read-model database did not answer; retry later",
            {"Retry-After": "5"},
        )

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, err: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return problem(
            request, 500, "internal", "Internal error", "an unexpected error occurred; it is logged"
        )
