"""Liveness, readiness and Prometheus metrics; open even when a token is configured."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from temporalio.api.workflowservice.v1 import GetSystemInfoRequest

from api.deps import ResourcesDep
from api.errors import ApiProblem
from readmodel.db import ping

router = APIRouter(tags=["health"])

_READY_TIMEOUT = timedelta(seconds=2)


@router.get("/healthz", summary="The process is up")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", summary="Temporal and the read-model database answer")
async def readyz(resources: ResourcesDep) -> dict[str, str]:
    problems: list[str] = []
    try:
        await resources.outbox.client.workflow_service.get_system_info(
            GetSystemInfoRequest(), timeout=_READY_TIMEOUT
        )
    except Exception as err:  # any failure means not ready; the reason goes in the detail
        problems.append(f"temporal: {type(err).__name__}: {err}")
    try:
        await asyncio.wait_for(
            asyncio.to_thread(ping, resources.engine), _READY_TIMEOUT.total_seconds()
        )
    except Exception as err:
        problems.append(f"database: {type(err).__name__}")
    if problems:
        raise ApiProblem(503, "not-ready", "Not ready", "; ".join(problems))
    return {"status": "ready"}


@router.get("/metrics", summary="Prometheus metrics")
async def metrics(request: Request) -> Response:
    return Response(
        generate_latest(request.app.state.metrics.registry), media_type=CONTENT_TYPE_LATEST
    )
