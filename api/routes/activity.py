"""`GET /v1/destinations/{name}/activity`: sent and failed per minute and the queue held, for the
dashboard's health strip (`readmodel.activity`)."""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field

from api.deps import DestinationsDep, EngineDep
from api.errors import ApiProblem
from api.schemas import problem_responses
from readmodel.activity import MAX_MINUTES, destination_activity

router = APIRouter(
    prefix="/v1/destinations",
    tags=["destinations"],
    responses=problem_responses(401, 403, 404, 422),
)


class MinuteInfo(BaseModel):
    at: datetime = Field(description="The minute's start (UTC)")
    sent: int = Field(description="Items that ended sent within the minute")
    failed: int = Field(description="Items that ended failed within the minute")


class ActivityInfo(BaseModel):
    """One destination's recent deliveries, oldest minute first, and its queue."""

    minutes: list[MinuteInfo]
    queued: int = Field(description="Items waiting for the destination")
    oldest_queued_age_s: float | None = Field(
        description="Seconds the oldest waiting item has waited (null: none waiting)"
    )


@router.get(
    "/{name}/activity", response_model=ActivityInfo, summary="Sent and failed per minute, queue"
)
async def get_activity(
    name: str,
    engine: EngineDep,
    destinations: DestinationsDep,
    minutes: Annotated[int, Query(ge=1, le=MAX_MINUTES)] = 60,
) -> ActivityInfo:
    """Items sent and failed per minute over the last `minutes`, the queued count and the age
    of the oldest queued item."""
    if destinations.get(name) is None:
        raise ApiProblem(404, "not-found", "Not found", f"no destination {name!r}")
    activity = await asyncio.to_thread(destination_activity, engine, name, minutes)
    return ActivityInfo(
        minutes=[MinuteInfo(at=m.at, sent=m.sent, failed=m.failed) for m in activity.minutes],
        queued=activity.queued,
        oldest_queued_age_s=activity.oldest_queued_age_s,
    )
