"""Liveness, readiness and Prometheus metrics. Liveness and readiness are open; `/metrics` checks
a token sent to it, and with `METRICS_TOKEN_REQUIRED` needs one (`api.metrics`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable

from durable_outbox_temporal.connection import (
    missing_search_attributes,
    missing_search_attributes_message,
)
from fastapi import APIRouter, Depends, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from temporalio.api.workflowservice.v1 import GetSystemInfoRequest

from api.deps import MetricsDep, Resources, ResourcesDep
from api.errors import RETRY_AFTER_S, ApiProblem
from api.metrics import require_metrics_token
from api.schemas import problem_responses
from configuration.version import VERSION
from readmodel.db import ping, schema_not_at_head

log = logging.getLogger("outbox.api")

router = APIRouter(tags=["health"])

# Each dependency gets this long to answer; probes run both at once, so /readyz stays under it.
READY_TIMEOUT_S = 2.0


@router.get("/healthz", summary="The process is up, and which release it runs")
async def healthz() -> dict[str, str]:
    """Answers as long as the event loop runs; checks nothing else, so restarts stay rare.
    `version` is the release (CHANGELOG.md), so a rolling deploy shows which process runs which."""
    return {"status": "ok", "version": VERSION}


@router.get(
    "/readyz",
    summary="Temporal and the read-model database answer, schema and search attributes in place",
    responses=problem_responses(503),
)
async def readyz(resources: ResourcesDep, request: Request) -> dict[str, str | list[str]]:
    """200 when both answer within the timeout, the read model's schema is at this release's
    head and the namespace has the product's search attributes; else 503 naming what is down,
    behind or missing. An API running open (in development, or in production with
    `ALLOW_INSECURE`) lists what is open under `insecure`, ready or not: no token, no payload
    keys (the read model then holds callers' data in plain text), a published credential."""
    insecure: list[str] = request.app.state.insecure
    checks: dict[str, Awaitable[object]] = {
        "temporal": _temporal_answers(resources),
        "database": asyncio.to_thread(ping, resources.engine),
    }
    answered = await asyncio.gather(*(_answers(name, check) for name, check in checks.items()))
    down = [name for name, ok in zip(checks, answered, strict=True) if not ok]
    if down:
        raise ApiProblem(
            503,
            "not-ready",
            "Not ready",
            f"not reachable: {', '.join(down)}",
            {"Retry-After": RETRY_AFTER_S},
            down=down,
            **({"insecure": insecure} if insecure else {}),
        )
    behind = await _schema_not_at_head(resources, request)
    if behind:
        raise ApiProblem(
            503,
            "not-ready",
            "Not ready",
            behind,
            {"Retry-After": RETRY_AFTER_S},
            down=["schema"],
            **({"insecure": insecure} if insecure else {}),
        )
    missing = await _missing_search_attributes(resources, request)
    if missing:
        raise ApiProblem(
            503,
            "not-ready",
            "Not ready",
            missing_search_attributes_message(missing),
            {"Retry-After": RETRY_AFTER_S},
            down=["search_attributes"],
            missing_search_attributes=missing,
            **({"insecure": insecure} if insecure else {}),
        )
    return {"status": "ready", **({"insecure": insecure} if insecure else {})}


@router.get(
    "/metrics",
    summary="Prometheus metrics",
    dependencies=[Depends(require_metrics_token)],
    responses=problem_responses(401, 403),
)
async def metrics(api_metrics: MetricsDep) -> Response:
    """HTTP requests by route template and status, enqueues by outcome, and the backlog
    (items per status, oldest queued age, sent and failed, lanes) from the read model."""
    await asyncio.gather(api_metrics.backlog.refresh(), api_metrics.destinations.refresh())
    return Response(generate_latest(api_metrics.registry), media_type=CONTENT_TYPE_LATEST)


async def _temporal_answers(resources: Resources) -> None:
    client = await resources.outbox.temporal()
    await client.workflow_service.get_system_info(GetSystemInfoRequest())


async def _schema_not_at_head(resources: Resources, request: Request) -> str | None:
    """Why the read model's schema is not at head, asked until it is once (a running release's
    schema only moves forward). A database that will not say was reported down already."""
    if getattr(request.app.state, "schema_at_head", False):
        return None
    try:
        behind = await asyncio.wait_for(
            asyncio.to_thread(
                schema_not_at_head, resources.engine, resources.aggregate_types.migrations
            ),
            READY_TIMEOUT_S,
        )
    except Exception as err:
        log.warning("readiness: schema revision not read: %s: %s", type(err).__name__, err)
        return None
    if behind:
        log.error("readiness: %s", behind)
    else:
        request.app.state.schema_at_head = True
    return behind


async def _missing_search_attributes(resources: Resources, request: Request) -> list[str]:
    """The search attributes the namespace lacks, asked until all are there once (they are not
    taken away at run time). A server that will not list them is taken at its word."""
    if getattr(request.app.state, "search_attributes_registered", False):
        return []
    try:
        client = await resources.outbox.temporal()
        missing = await asyncio.wait_for(missing_search_attributes(client), READY_TIMEOUT_S)
    except Exception as err:
        log.warning("readiness: search attributes not listed: %s: %s", type(err).__name__, err)
        return []
    if missing:
        log.error("readiness: %s", missing_search_attributes_message(missing))
    else:
        request.app.state.search_attributes_registered = True
    return missing


async def _answers(name: str, check: Awaitable[object]) -> bool:
    try:
        await asyncio.wait_for(check, READY_TIMEOUT_S)
    except Exception as err:  # any failure means not ready
        # The reason goes to the log only: /readyz is unauthenticated.
        log.warning("readiness: %s is down: %s: %s", name, type(err).__name__, err)
        return False
    return True
