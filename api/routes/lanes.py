"""Ordering lanes: list an outbox's lanes, read one, and resume a halted one (redrive or skip
its failed head item). Items enter lanes by enqueueing them with an `ordering_key`."""

from __future__ import annotations

from typing import Annotated, Any, Literal
from urllib.parse import quote

from durable_outbox_temporal.contract.lane import LanePolicy, LaneStatus, LaneView
from fastapi import APIRouter, Body, Depends, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from api.deps import resources_of
from api.schemas import problem_responses
from service.lanes import LaneService, LaneSnapshot

router = APIRouter(
    prefix="/v1/outboxes/{outbox}/lanes",
    tags=["lanes"],
    responses=problem_responses(401, 403, 404, 422, 503),
)


async def get_lane_service(request: Request) -> LaneService:
    resources = resources_of(request)
    return LaneService(resources.outbox, resources.engine)


LaneServiceDep = Annotated[LaneService, Depends(get_lane_service)]


class LaneResponse(BaseModel):
    """One ordering lane: its items waiting, its head, whether it is halted and why."""

    id: str
    outbox: str
    ordering_key: str
    status: LaneStatus = Field(description="running, idle (ends soon) or halted")
    policy: LanePolicy = Field(description="what a permanently failed item does to the lane")
    length: int = Field(description="items in the lane: its head and those waiting behind it")
    head_key: str | None = Field(description="the item at the head: running, or failed (halted)")
    halted_reason: str | None
    halted_at: Any
    sent: int
    failed: int
    cancelled: int
    updated_at: Any
    waiting: list[str] | None = Field(
        default=None, description="the first keys waiting behind the head (live lanes only)"
    )
    source: Literal["workflow", "read-model"]
    links: dict[str, str]

    @classmethod
    def of(
        cls, view: LaneView, waiting: list[str] | None, source: Literal["workflow", "read-model"]
    ) -> LaneResponse:
        base = (
            f"/v1/outboxes/{quote(view.outbox, safe='')}/lanes/{quote(view.ordering_key, safe='')}"
        )
        return cls(
            **{name: getattr(view, name) for name in cls.model_fields if hasattr(view, name)},
            waiting=waiting,
            source=source,
            links={"self": base, "redrive": f"{base}/redrive", "skip": f"{base}/skip"},
        )


class LanePage(BaseModel):
    lanes: list[LaneResponse]
    next_cursor: str | None


class SkipRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str = Field(default="skipped by operator", max_length=500)


class ResumeResponse(BaseModel):
    """Which item the lane was resumed on; it goes on asynchronously."""

    ordering_key: str
    head_key: str
    action: Literal["redrive", "skip"]


def _response(snapshot: LaneSnapshot) -> LaneResponse:
    return LaneResponse.of(snapshot.view, snapshot.waiting, snapshot.source)


@router.get("", response_model=LanePage, summary="The outbox's ordering lanes")
async def list_lanes(
    outbox: str,
    lanes: LaneServiceDep,
    status: LaneStatus | None = None,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> LanePage:
    """Lanes by ordering key from the read model (a lane that ended idle shows `idle`);
    `?status=halted` lists the ones waiting for an operator."""
    views, next_cursor = await lanes.list(outbox, status=status, after=cursor, limit=limit)
    return LanePage(
        lanes=[LaneResponse.of(view, None, "read-model") for view in views],
        next_cursor=next_cursor,
    )


@router.get("/{ordering_key}", response_model=LaneResponse, summary="One ordering lane")
async def get_lane(outbox: str, ordering_key: str, lanes: LaneServiceDep) -> LaneResponse:
    """Live from the lane while it runs (with the first keys waiting); projected after."""
    return _response(await lanes.get(outbox, ordering_key))


@router.post(
    "/{ordering_key}/redrive",
    response_model=ResumeResponse,
    status_code=202,
    responses=problem_responses(409),
    summary="Redrive a halted lane's failed head item",
)
async def redrive_head(outbox: str, ordering_key: str, lanes: LaneServiceDep) -> ResumeResponse:
    """The head item runs again (a new provider key); the items behind it follow once it is
    sent. 409 unless the lane is halted."""
    head = await lanes.redrive_head(outbox, ordering_key)
    return ResumeResponse(ordering_key=ordering_key, head_key=head, action="redrive")


@router.post(
    "/{ordering_key}/skip",
    response_model=ResumeResponse,
    status_code=202,
    responses=problem_responses(409),
    summary="Skip a halted lane's failed head item",
)
async def skip_head(
    outbox: str,
    ordering_key: str,
    lanes: LaneServiceDep,
    body: Annotated[SkipRequest | None, Body()] = None,
) -> ResumeResponse:
    """The head item stays failed (a dead letter) and the lane goes on. 409 unless halted."""
    reason = (body or SkipRequest()).reason
    head = await lanes.skip_head(outbox, ordering_key, reason)
    return ResumeResponse(ordering_key=ordering_key, head_key=head, action="skip")
