"""Async projectors: their status, a rebuild, and the rows of their read models.

`GET /v1/projectors/labour_history/rows?mother=m1` is a mother's labours with status and counts;
each projector declares the columns its rows may be filtered by, and any other query parameter
is refused (422), never ignored.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel

from api.deps import resources_of
from api.errors import ApiProblem
from api.schemas import problem_responses
from readmodel.projectors.base import MAX_ROWS_PAGE, ProjectorStatus, UnknownProjector
from service.projectors import ProjectorService

router = APIRouter(
    prefix="/v1/projectors", tags=["projectors"], responses=problem_responses(401, 403, 404, 503)
)


async def get_projector_service(request: Request) -> ProjectorService:
    resources = resources_of(request)
    return ProjectorService(resources.engine, resources.aggregate_types.projectors)


ProjectorServiceDep = Annotated[ProjectorService, Depends(get_projector_service)]


class ProjectorRows(BaseModel):
    """A page of a projector's rows by key; pass `next_after` back as `after`."""

    items: list[dict[str, Any]]
    next_after: str | None


def _unknown(err: UnknownProjector) -> ApiProblem:
    return ApiProblem(404, "unknown-projector", "Unknown projector", str(err.args[0]))


@router.get("", response_model=list[ProjectorStatus], summary="Every projector's status")
async def list_projectors(service: ProjectorServiceDep) -> list[ProjectorStatus]:
    return await service.statuses()


@router.get("/{name}", response_model=ProjectorStatus, summary="One projector's status")
async def get_projector(name: str, service: ProjectorServiceDep) -> ProjectorStatus:
    try:
        return await service.status(name)
    except UnknownProjector as err:
        raise _unknown(err) from err


@router.post(
    "/{name}/rebuild",
    response_model=ProjectorStatus,
    summary="Empty the read model and project every event again",
)
async def rebuild_projector(name: str, service: ProjectorServiceDep) -> ProjectorStatus:
    """Resets the checkpoint to the first event and un-faults the projector, in one
    transaction with emptying its table; its runner rebuilds from the event store."""
    try:
        return await service.rebuild(name)
    except UnknownProjector as err:
        raise _unknown(err) from err


@router.get("/{name}/rows", response_model=ProjectorRows, summary="The projector's read model")
async def projector_rows(
    name: str,
    request: Request,
    service: ProjectorServiceDep,
    after: Annotated[str | None, Query(max_length=200)] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_ROWS_PAGE)] = 50,
) -> ProjectorRows:
    """Filter by the projector's columns as query parameters (`labour_history`: `mother`,
    `status`)."""
    try:
        projector = service.get(name)
    except UnknownProjector as err:
        raise _unknown(err) from err
    filters = {k: v for k, v in request.query_params.items() if k not in ("after", "limit")}
    unknown = sorted(set(filters) - set(projector.filters))
    if unknown:
        allowed = ", ".join(sorted(projector.filters)) or "none"
        raise ApiProblem(
            422,
            "invalid-request",
            "Invalid request",
            f"{name} rows cannot be filtered by {', '.join(unknown)} (filters: {allowed})",
        )
    items, next_after = await service.rows(name, filters, after=after, limit=limit)
    return ProjectorRows(items=items, next_after=next_after)
