"""Provider delivery reports: `POST /v1/destinations/{destination}/events`, for Event Grid.

Not behind the API's bearer token: Event Grid cannot send one. Each destination that takes
reports has its own secret (`events_secret`), which the subscription's endpoint URL carries as
`?secret=` or a delivery property sends as the `X-Events-Secret` header. Answers are 2xx for
everything Event Grid should not send again (reports for unknown or finished items included),
and 503 when Temporal or the database is down, or when a recent report names a message no item
holds yet (`service/reports.py` `EARLY_REPORT_WINDOW`), so Event Grid retries and nothing is
lost.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from durable_outbox_temporal.destinations import Destination
from fastapi import APIRouter, Depends, Header, Query, Request, Response
from pydantic import BaseModel

from api.auth import secret_is_valid
from api.deps import DestinationsDep, MetricsDep, ReportServiceDep
from api.errors import ApiProblem
from api.eventgrid import read_delivery
from api.schemas import problem_responses

router = APIRouter(
    prefix="/v1/destinations/{destination}",
    tags=["delivery reports"],
    responses=problem_responses(400, 401, 404, 413, 503),
)


class ValidationResponse(BaseModel):
    """Event Grid's subscription handshake: the validation code, echoed."""

    validationResponse: str  # noqa: N815 - Event Grid's spelling


class ReportsReceived(BaseModel):
    """What became of a delivery's events."""

    received: int
    applied: int
    unknown: int
    late: int
    ignored: int
    invalid: int


async def reporting_destination(
    destination: str,
    destinations: DestinationsDep,
    secret: Annotated[str | None, Query(description="The destination's events_secret")] = None,
    x_events_secret: Annotated[str | None, Header(description="Or the secret here")] = None,
) -> Destination:
    """The destination, once the request carries its secret: 404 if it takes no reports,
    401 without the right secret."""
    target = destinations.get(destination)
    if target is None or target.events_secret is None:
        raise ApiProblem(
            404,
            "no-event-endpoint",
            "No event endpoint",
            f"destination {destination!r} takes no delivery reports (set its events_secret)",
        )
    offered = x_events_secret or secret or ""
    # Each compared in constant time; during a rotation, the one replaced is taken too.
    taken = [secret_is_valid(offered, s) for s in target.events_secrets(datetime.now(UTC))]
    if not offered or not any(taken):
        raise ApiProblem(
            401,
            "bad-events-secret",
            "Unauthorized",
            "send the destination's events_secret as ?secret= or the X-Events-Secret header",
        )
    return target


ReportingDestination = Annotated[Destination, Depends(reporting_destination)]

# Asked of a provider delivering reports the items do not hold yet: the send's record is
# seconds behind at most, unless the worker is down (Event Grid waits longer on its own).
EARLY_REPORT_RETRY_S = 10


@router.options("/events", summary="CloudEvents webhook validation (abuse protection)")
async def validate_webhook(
    target: ReportingDestination,
    webhook_request_origin: Annotated[str | None, Header()] = None,
) -> Response:
    """Event Grid's CloudEvents handshake: allow the origin that asks."""
    if not webhook_request_origin:
        raise ApiProblem(
            400,
            "missing-origin",
            "Missing WebHook-Request-Origin",
            "the CloudEvents validation request names its origin in WebHook-Request-Origin",
        )
    return Response(
        status_code=200,
        headers={"WebHook-Allowed-Origin": webhook_request_origin, "WebHook-Allowed-Rate": "*"},
    )


@router.post(
    "/events",
    response_model=ReportsReceived | ValidationResponse,
    summary="Receive Event Grid deliveries (ACS email and SMS delivery reports)",
)
async def receive_events(
    request: Request,
    target: ReportingDestination,
    reports: ReportServiceDep,
    metrics: MetricsDep,
) -> ReportsReceived | ValidationResponse:
    """Event Grid schema (an array) or CloudEvents 1.0 (one event or a batch). Each
    `Microsoft.Communication.EmailDeliveryReportReceived` and `...SMSDeliveryReportReceived`
    event is signalled to its item."""
    delivery = read_delivery(await request.body())
    if delivery.validation_code is not None:
        return ValidationResponse(validationResponse=delivery.validation_code)
    tally = await reports.receive(target.name, delivery.reports)
    counts = {
        "applied": tally.applied,
        "unknown": tally.unknown,
        "late": tally.late,
        "ignored": delivery.ignored,
        "invalid": delivery.invalid,
    }
    for result, count in {**counts, "early": tally.early}.items():
        metrics.count_reports(target.name, result, count)
    if tally.early:
        # The others are applied; delivered again with these, they change nothing.
        raise ApiProblem(
            503,
            "reports-not-yet-recorded",
            "Reports not yet recorded",
            f"{tally.early} report(s) name a message no item holds yet (its send may not be"
            " recorded yet): deliver them again",
            headers={"Retry-After": str(EARLY_REPORT_RETRY_S)},
        )
    return ReportsReceived(received=sum(counts.values()), **counts)
