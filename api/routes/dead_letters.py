"""Dead letters: an outbox's permanently failed items. List them (with error and attempts),
discard one (given up, kept for audit), and redrive every one a filter selects as a batch whose
progress lives in Temporal. Redriving one is `POST .../items/{key}/redrive`."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any
from urllib.parse import quote

from durable_outbox_temporal.contract.dead_letters import DeadLetterFilter, RedriveBatchProgress
from durable_outbox_temporal.contract.limits import MAX_DESTINATION_LENGTH
from fastapi import APIRouter, Body, Depends, Path, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field, model_validator

from api.dates import AwareUtcDatetime
from api.deps import resources_of
from api.errors import validation_problem
from api.routes.items import item_links
from api.schemas import problem_responses
from readmodel.dead_letters import DeadLetter
from service.dead_letters import DeadLetterService, RedriveBatch

router = APIRouter(
    prefix="/v1/outboxes/{outbox}",
    tags=["dead letters"],
    responses=problem_responses(401, 403, 404, 422, 503),
)


async def get_dead_letter_service(request: Request) -> DeadLetterService:
    resources = resources_of(request)
    return DeadLetterService(resources.items, resources.settings.operations_task_queue)


DeadLetterServiceDep = Annotated[DeadLetterService, Depends(get_dead_letter_service)]


class DeadLetterResponse(BaseModel):
    """One permanently failed item: why it failed, after how many attempts, and whether an
    operator discarded it."""

    id: str
    outbox: str
    key: str
    destination: str
    ordering_key: str | None
    attempts: int
    max_attempts: int
    last_error: str | None = Field(description="why it failed")
    last_error_code: str | None = Field(description="the provider's own error code, if any")
    created_at: Any
    failed_at: Any
    discarded: bool
    discarded_at: Any = None
    discard_reason: str | None = None
    links: dict[str, str]

    @classmethod
    def of(cls, letter: DeadLetter) -> DeadLetterResponse:
        view = letter.record.view
        links = item_links(view.outbox, view.key)
        return cls(
            id=view.id,
            outbox=view.outbox,
            key=view.key,
            destination=view.destination,
            ordering_key=view.ordering_key,
            attempts=view.attempts,
            max_attempts=view.max_attempts,
            last_error=view.last_error,
            last_error_code=view.last_error_code,
            created_at=view.created_at,
            failed_at=view.finished_at,
            discarded=letter.discard is not None,
            discarded_at=letter.discard.discarded_at if letter.discard else None,
            discard_reason=letter.discard.reason if letter.discard else None,
            links={
                "item": links.self,
                "events": links.events,
                "redrive": links.redrive,
                "discard": f"{_base(view.outbox)}/dead-letters/{quote(view.key, safe='')}/discard",
            },
        )


class DeadLetterPage(BaseModel):
    """Newest failure first; pass `next_cursor` back as `cursor` (null: last page)."""

    dead_letters: list[DeadLetterResponse]
    next_cursor: str | None


class DiscardRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str = Field(default="discarded by operator", min_length=1, max_length=500)


class RedriveBatchRequest(BaseModel):
    """Which dead letters to redrive; every field optional, none selects them all. Only items
    that failed before the request are taken, and never discarded ones."""

    model_config = ConfigDict(extra="forbid")

    destination: str | None = Field(default=None, min_length=1, max_length=MAX_DESTINATION_LENGTH)
    error_code: str | None = Field(
        default=None, min_length=1, max_length=200, description="the provider's error code"
    )
    failed_from: AwareUtcDatetime | None = Field(default=None, description="inclusive")
    failed_to: AwareUtcDatetime | None = Field(default=None, description="exclusive")

    @model_validator(mode="after")
    def _range(self) -> RedriveBatchRequest:
        _check_range(self.failed_from, self.failed_to)
        return self

    def filter(self) -> DeadLetterFilter:
        return DeadLetterFilter(**self.model_dump())


class RedriveBatchResponse(BaseModel):
    """A redrive batch: what it selects, how far it is (`done` at the end), and Temporal's
    word for its workflow (`running`, `completed`, `failed`, `terminated`...)."""

    id: str
    outbox: str
    state: str
    destination: str | None
    error_code: str | None
    failed_from: Any
    failed_to: Any
    failed_before: Any = Field(
        description="it takes items that failed before it began (null until it has)"
    )
    redriven: int
    skipped: int = Field(description="no longer failed when reached (redriven meanwhile...)")
    pages: int
    done: bool
    finished_at: Any
    errors: list[str] = Field(description="the first keys not redriven, and why")
    links: dict[str, str]

    @classmethod
    def of(cls, batch: RedriveBatch) -> RedriveBatchResponse:
        progress: RedriveBatchProgress = batch.progress
        which = progress.filter
        return cls(
            id=batch.id,
            outbox=progress.outbox,
            state=batch.state,
            destination=which.destination,
            error_code=which.error_code,
            failed_from=which.failed_from,
            failed_to=which.failed_to,
            failed_before=progress.failed_before,
            redriven=progress.redriven,
            skipped=progress.skipped,
            pages=progress.pages,
            done=progress.done,
            finished_at=progress.finished_at,
            errors=progress.errors,
            links={"self": f"{_base(progress.outbox)}/redrive-batches/{batch.id}"},
        )


def _base(outbox: str) -> str:
    return f"/v1/outboxes/{quote(outbox, safe='')}"


def _check_range(failed_from: datetime | None, failed_to: datetime | None) -> None:
    if failed_from is not None and failed_to is not None and failed_from >= failed_to:
        raise ValueError("failed_from must be before failed_to")


@router.get("/dead-letters", response_model=DeadLetterPage, summary="The outbox's dead letters")
async def list_dead_letters(
    outbox: str,
    dead_letters: DeadLetterServiceDep,
    destination: Annotated[
        str | None, Query(min_length=1, max_length=MAX_DESTINATION_LENGTH)
    ] = None,
    error_code: Annotated[str | None, Query(min_length=1, max_length=200)] = None,
    failed_from: Annotated[AwareUtcDatetime | None, Query(description="inclusive")] = None,
    failed_to: Annotated[AwareUtcDatetime | None, Query(description="exclusive")] = None,
    include_discarded: bool = False,
    cursor: Annotated[str | None, Query(max_length=500)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> DeadLetterPage:
    """Permanently failed items, newest failure first, from the read model; discarded ones
    only with `include_discarded=true`."""
    try:
        _check_range(failed_from, failed_to)
    except ValueError as err:
        raise validation_problem([{"loc": ("query", "failed_to"), "msg": str(err)}]) from None
    letters, next_cursor = await dead_letters.list(
        outbox,
        DeadLetterFilter(destination, error_code, failed_from, failed_to),
        include_discarded=include_discarded,
        cursor=cursor,
        limit=limit,
    )
    return DeadLetterPage(
        dead_letters=[DeadLetterResponse.of(letter) for letter in letters],
        next_cursor=next_cursor,
    )


@router.post(
    "/dead-letters/{key}/discard",
    response_model=DeadLetterResponse,
    responses=problem_responses(409),
    summary="Discard a dead letter",
)
async def discard_dead_letter(
    outbox: str,
    key: str,
    dead_letters: DeadLetterServiceDep,
    body: Annotated[DiscardRequest | None, Body()] = None,
) -> DeadLetterResponse:
    """Give up on a failed item: it leaves the list and keeps its history for audit. A redrive
    still works, and a new failure after it is a new dead letter. 409 unless it has failed."""
    reason = (body or DiscardRequest()).reason
    return DeadLetterResponse.of(await dead_letters.discard(outbox, key, reason))


@router.post(
    "/dead-letters:redrive",
    response_model=RedriveBatchResponse,
    status_code=202,
    summary="Redrive every dead letter a filter selects, as a batch",
)
async def redrive_dead_letters(
    outbox: str,
    response: Response,
    dead_letters: DeadLetterServiceDep,
    body: Annotated[RedriveBatchRequest | None, Body()] = None,
) -> RedriveBatchResponse:
    """Starts a batch (a `RedriveBatch` workflow) and answers at once; follow it at
    `links.self` (also the `Location` header)."""
    batch = await dead_letters.start_redrive(outbox, (body or RedriveBatchRequest()).filter())
    result = RedriveBatchResponse.of(batch)
    response.headers["Location"] = result.links["self"]
    return result


@router.get(
    "/redrive-batches/{batch_id}",
    response_model=RedriveBatchResponse,
    summary="A dead-letter redrive batch's progress",
)
async def get_redrive_batch(
    outbox: str,
    batch_id: Annotated[str, Path(pattern=r"^[0-9a-f]{32}$")],
    dead_letters: DeadLetterServiceDep,
) -> RedriveBatchResponse:
    """From Temporal, not from the API process: any API instance, restarted or not, answers."""
    return RedriveBatchResponse.of(await dead_letters.batch(outbox, batch_id))
