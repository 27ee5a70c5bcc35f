"""Scheduled fan-out: Temporal Schedules that enqueue a templated batch of items on a cron or
an interval. Create, list, show, pause, unpause, trigger and delete.

Each fire enqueues the template's items into the outbox under the key
`{id}:{fire time YYYYMMDDTHHMMSSZ}:{key_suffix or index}`, with `{{scheduled_at}}`,
`{{fire_date}}`, `{{schedule_id}}` and `{{item_key}}` filled in wherever they appear in a payload
string; running a fire twice enqueues nothing twice.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal, Self
from urllib.parse import quote

from durable_outbox_temporal.contract.limits import (
    MAX_DESTINATION_LENGTH,
    MAX_KEY_LENGTH,
    MAX_OUTBOX_LENGTH,
    OUTBOX_NAME_PATTERN,
    check_ordering_key,
)
from durable_outbox_temporal.contract.schedule import (
    DEFAULT_CATCHUP_WINDOW_S,
    KEY_SUFFIX_PATTERN,
    MAX_CATCHUP_WINDOW_S,
    MAX_INTERVAL_S,
    MAX_KEY_SUFFIX_LENGTH,
    MAX_SCHEDULE_ID_LENGTH,
    MAX_SCHEDULE_ITEMS,
    MIN_CATCHUP_WINDOW_S,
    PLACEHOLDERS,
    SCHEDULE_ID_PATTERN,
    ItemTemplate,
    Overlap,
)
from fastapi import APIRouter, Body, Depends, Request, Response, status
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from api.deps import resources_of
from api.schemas import SendableJson, problem_responses
from service.schedules import (
    MAX_NOTE_LENGTH,
    NewSchedule,
    ScheduleDetail,
    ScheduleService,
    ScheduleSummary,
)

router = APIRouter(
    prefix="/v1/schedules",
    tags=["schedules"],
    responses=problem_responses(401, 403, 404, 422, 503),
)


async def get_schedule_service(request: Request) -> ScheduleService:
    resources = resources_of(request)
    return ScheduleService(resources.outbox, resources.settings.operations_task_queue)


ScheduleServiceDep = Annotated[ScheduleService, Depends(get_schedule_service)]

_PLACEHOLDER_DOC = "; ".join(f"`{{{{{name}}}}}`: {doc}" for name, doc in PLACEHOLDERS.items())


class ScheduleItem(BaseModel):
    """One item every fire enqueues."""

    model_config = ConfigDict(extra="forbid")

    destination: str = Field(
        min_length=1, max_length=MAX_DESTINATION_LENGTH, examples=["fake-email"]
    )
    payload: SendableJson = Field(
        description=f"What the provider receives; placeholders in its strings: {_PLACEHOLDER_DOC}"
    )
    key_suffix: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_KEY_SUFFIX_LENGTH,
        pattern=KEY_SUFFIX_PATTERN,
        description="Last part of the item's key (default: its index in `items`)",
    )
    ordering_key: Annotated[
        str | None,
        Field(max_length=MAX_KEY_LENGTH),
        AfterValidator(lambda key: None if key is None else check_ordering_key(key)),
    ] = None
    max_attempts: int | None = Field(default=None, ge=1, le=1000, strict=True)

    def template(self) -> ItemTemplate:
        return ItemTemplate(**self.model_dump())


class ScheduleCreate(BaseModel):
    """A scheduled fan-out: when (`cron` or `interval_seconds`), and what (`outbox`, `items`)."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(
        min_length=1,
        max_length=MAX_SCHEDULE_ID_LENGTH,
        pattern=SCHEDULE_ID_PATTERN,
        description="Letters, digits, '.', '_', '-'; the Temporal schedule is `schedule/{id}`",
        examples=["daily-digest"],
    )
    outbox: str = Field(
        min_length=1,
        max_length=MAX_OUTBOX_LENGTH,
        pattern=OUTBOX_NAME_PATTERN,
        examples=["newsletters"],
    )
    items: list[ScheduleItem] = Field(min_length=1, max_length=MAX_SCHEDULE_ITEMS)
    cron: str | None = Field(
        default=None,
        max_length=200,
        description="A cron expression (5-7 fields, or `@daily`, `@every 10m`...)",
        examples=["0 6 * * MON-FRI"],
    )
    interval_seconds: int | None = Field(default=None, ge=1, le=MAX_INTERVAL_S, strict=True)
    timezone: str | None = Field(
        default=None,
        max_length=64,
        description="IANA time zone the cron is read in (default UTC)",
        examples=["Europe/Paris"],
    )
    paused: bool = False
    note: str | None = Field(default=None, max_length=MAX_NOTE_LENGTH)
    overlap: Overlap = Field(
        default=Overlap.SKIP,
        description="While a fire is still enqueueing: `skip` the next one, or `buffer_one`",
    )
    catchup_window_seconds: int = Field(
        default=DEFAULT_CATCHUP_WINDOW_S,
        ge=MIN_CATCHUP_WINDOW_S,
        le=MAX_CATCHUP_WINDOW_S,
        strict=True,
        description="After an outage, fires missed by less than this still happen (one of them)",
    )

    @model_validator(mode="after")
    def _one_spec(self) -> Self:
        if (self.cron is None) == (self.interval_seconds is None):
            raise ValueError("give exactly one of cron and interval_seconds")
        return self

    def new_schedule(self) -> NewSchedule:
        return NewSchedule(
            id=self.id,
            outbox=self.outbox,
            items=[item.template() for item in self.items],
            cron=self.cron,
            interval_seconds=self.interval_seconds,
            timezone=self.timezone,
            paused=self.paused,
            note=self.note,
            overlap=self.overlap,
            catchup_window_seconds=self.catchup_window_seconds,
        )


class NoteRequest(BaseModel):
    """Optional body of pause and unpause: why, shown with the schedule."""

    model_config = ConfigDict(extra="forbid")

    note: str | None = Field(default=None, max_length=MAX_NOTE_LENGTH)


class ScheduleLinks(BaseModel):
    self: str
    pause: str
    unpause: str
    trigger: str


class FireResponse(BaseModel):
    """One recent fire and its workflow (`status` null once Temporal has forgotten it)."""

    scheduled_at: datetime
    started_at: datetime
    workflow_id: str
    status: str | None


class ScheduleSummaryResponse(BaseModel):
    """A scheduled fan-out as listed."""

    id: str
    outbox: str | None
    cron: str | None
    interval_seconds: int | None
    timezone: str | None
    items: int | None = Field(description="How many items each fire enqueues")
    paused: bool
    note: str
    next_fire_times: list[datetime] = Field(description="The next few; empty while paused")
    last_fired_at: datetime | None
    links: ScheduleLinks


class ScheduleResponse(ScheduleSummaryResponse):
    """A scheduled fan-out in full."""

    temporal_schedule_id: str
    template: list[ScheduleItem]
    overlap: Overlap | None
    catchup_window_seconds: float | None
    fires: int = Field(description="Fires so far (scheduled and triggered)")
    missed_catchup_window: int
    skipped_overlap: int
    recent_fires: list[FireResponse] = Field(description="Newest first")
    running: list[str] = Field(description="Workflow ids of fires still enqueueing")
    created_at: datetime
    updated_at: datetime | None


class ScheduleList(BaseModel):
    schedules: list[ScheduleSummaryResponse]


class TriggerResponse(BaseModel):
    """The fire is requested; it shows in `recent_fires` once Temporal has started it."""

    id: str
    triggered: Literal[True] = True


def _links(schedule_id: str) -> ScheduleLinks:
    base = f"/v1/schedules/{quote(schedule_id, safe='')}"
    return ScheduleLinks(
        self=base, pause=f"{base}/pause", unpause=f"{base}/unpause", trigger=f"{base}/trigger"
    )


def _summary_fields(summary: ScheduleSummary) -> dict[str, Any]:
    return {
        name: getattr(summary, name)
        for name in ScheduleSummaryResponse.model_fields
        if name != "links"
    } | {"links": _links(summary.id)}


def _response(detail: ScheduleDetail) -> ScheduleResponse:
    return ScheduleResponse(
        **_summary_fields(detail),
        temporal_schedule_id=detail.temporal_schedule_id,
        template=[
            ScheduleItem.model_validate(item, from_attributes=True) for item in detail.template
        ],
        overlap=detail.overlap,
        catchup_window_seconds=detail.catchup_window_seconds,
        fires=detail.fires,
        missed_catchup_window=detail.missed_catchup_window,
        skipped_overlap=detail.skipped_overlap,
        recent_fires=[
            FireResponse.model_validate(fire, from_attributes=True) for fire in detail.recent_fires
        ],
        running=detail.running,
        created_at=detail.created_at,
        updated_at=detail.updated_at,
    )


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=ScheduleResponse,
    responses=problem_responses(409),
    summary="Create a scheduled fan-out",
)
async def create_schedule(
    body: ScheduleCreate, response: Response, schedules: ScheduleServiceDep
) -> ScheduleResponse:
    """201 and `Location`; 409 if the id exists; 422 naming the field for an unknown
    destination or placeholder, an invalid item, cron expression or time zone."""
    detail = await schedules.create(body.new_schedule())
    response.headers["Location"] = _links(detail.id).self
    return _response(detail)


@router.get("", response_model=ScheduleList, summary="Every scheduled fan-out")
async def list_schedules(schedules: ScheduleServiceDep) -> ScheduleList:
    """By id, from Temporal's schedule list (a schedule created a moment ago may be missing)."""
    return ScheduleList(
        schedules=[
            ScheduleSummaryResponse(**_summary_fields(summary))
            for summary in await schedules.list()
        ]
    )


@router.get("/{schedule_id}", response_model=ScheduleResponse, summary="One scheduled fan-out")
async def get_schedule(schedule_id: str, schedules: ScheduleServiceDep) -> ScheduleResponse:
    """Spec, template, paused and note, next fire times, and recent fires with their status."""
    return _response(await schedules.get(schedule_id))


@router.post("/{schedule_id}/pause", response_model=ScheduleResponse, summary="Pause")
async def pause_schedule(
    schedule_id: str,
    schedules: ScheduleServiceDep,
    body: Annotated[NoteRequest | None, Body()] = None,
) -> ScheduleResponse:
    """No fire until unpaused; a trigger still fires."""
    return _response(await schedules.pause(schedule_id, (body or NoteRequest()).note))


@router.post("/{schedule_id}/unpause", response_model=ScheduleResponse, summary="Unpause")
async def unpause_schedule(
    schedule_id: str,
    schedules: ScheduleServiceDep,
    body: Annotated[NoteRequest | None, Body()] = None,
) -> ScheduleResponse:
    """Fires again from the next fire time."""
    return _response(await schedules.unpause(schedule_id, (body or NoteRequest()).note))


@router.post(
    "/{schedule_id}/trigger",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=TriggerResponse,
    summary="Fire now",
)
async def trigger_schedule(schedule_id: str, schedules: ScheduleServiceDep) -> TriggerResponse:
    """Fires now, even while paused or while a fire is running; its fire time is now, in whole
    seconds (two triggers within one second are one fire)."""
    await schedules.trigger(schedule_id)
    return TriggerResponse(id=schedule_id)


@router.delete(
    "/{schedule_id}", status_code=status.HTTP_204_NO_CONTENT, summary="Delete a scheduled fan-out"
)
async def delete_schedule(schedule_id: str, schedules: ScheduleServiceDep) -> Response:
    """No more fires; items already enqueued stay."""
    await schedules.delete(schedule_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
