"""Erasure by filter: `items:erase` starts a batch that erases an outbox's ended items with a key
prefix, or those enqueued for one subject, followed at `erase-batches/{id}`
(`service/erasure.py`). One item: `DELETE .../items/{key}/payload` (`api/routes/attempts.py`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Self
from urllib.parse import quote

from durable_outbox_temporal.contract.erasure import MAX_REPORTED_SKIPS, SkippedItem
from durable_outbox_temporal.contract.limits import (
    MAX_KEY_LENGTH,
    MAX_SUBJECT_LENGTH,
    SUBJECT_PATTERN,
    TEXT_KEY_PATTERN,
)
from fastapi import APIRouter, Path, Response, status
from pydantic import BaseModel, ConfigDict, Field, model_validator

from api.deps import ItemServiceDep, ResourcesDep
from api.errors import ApiProblem
from api.schemas import problem_responses
from service.erasure import EraseBatch, EraseBatchNotFound, erase_batch, start_erase

router = APIRouter(
    prefix="/v1/outboxes/{outbox}",
    tags=["items"],
    responses=problem_responses(401, 403, 404, 415, 422, 503),
)


class EraseRequest(BaseModel):
    """Which items to erase: those whose key starts with `key_prefix`, or those enqueued with
    `subject` (exactly one of the two)."""

    model_config = ConfigDict(extra="forbid")

    key_prefix: str | None = Field(
        default=None, min_length=1, max_length=MAX_KEY_LENGTH, pattern=TEXT_KEY_PATTERN
    )
    subject: str | None = Field(
        default=None, max_length=MAX_SUBJECT_LENGTH, pattern=SUBJECT_PATTERN
    )

    @model_validator(mode="after")
    def _one_filter(self) -> Self:
        if (self.key_prefix is None) == (self.subject is None):
            raise ValueError("give key_prefix or subject, exactly one")
        return self


class EraseBatchResponse(BaseModel):
    """An erase batch: how far it is (`done` at the end), and Temporal's word for its workflow
    (`running`, `completed`, `failed`, `terminated`...). A subject batch shows no subject: the
    batch knows only its keyed digest."""

    id: str
    outbox: str
    state: str
    key_prefix: str | None
    by_subject: bool
    erased: int = Field(description="items erased so far")
    skipped: int = Field(description="items under way when reached, left as they were")
    skips: list[SkippedItem] = Field(
        description=f"the first {MAX_REPORTED_SKIPS} items skipped, with why"
    )
    pages: int
    done: bool
    finished_at: datetime | None
    failure: str | None = Field(description="why the batch stopped before its end (failed)")
    links: dict[str, str]

    @classmethod
    def of(cls, batch: EraseBatch) -> EraseBatchResponse:
        progress = batch.progress
        outbox = quote(progress.outbox, safe="")
        return cls(
            id=batch.id,
            outbox=progress.outbox,
            state=batch.state,
            key_prefix=progress.key_prefix,
            by_subject=progress.subject_digest is not None,
            erased=progress.erased,
            skipped=progress.skipped,
            skips=progress.skips,
            pages=progress.pages,
            done=progress.done,
            finished_at=progress.finished_at,
            failure=progress.failure,
            links={"self": f"/v1/outboxes/{outbox}/erase-batches/{batch.id}"},
        )


@router.post(
    "/items:erase",
    response_model=EraseBatchResponse,
    status_code=status.HTTP_202_ACCEPTED,
    summary="Erase the personal data of every ended item a filter selects, as a batch",
)
async def erase(
    outbox: str,
    body: EraseRequest,
    response: Response,
    items: ItemServiceDep,
    resources: ResourcesDep,
) -> EraseBatchResponse:
    """Starts a batch (an `EraseBatch` workflow) that erases each selected item as `DELETE
    .../items/{key}/payload` does, and answers at once; follow it at `links.self` (also the
    `Location` header). Items still under way are skipped and counted, with why: run another
    batch once they have ended."""
    batch = await start_erase(
        items,
        resources.settings.operations_task_queue,
        outbox,
        key_prefix=body.key_prefix,
        subject=body.subject,
    )
    result = EraseBatchResponse.of(batch)
    response.headers["Location"] = result.links["self"]
    return result


@router.get(
    "/erase-batches/{batch_id}",
    response_model=EraseBatchResponse,
    summary="An erase batch's progress",
)
async def get_erase_batch(
    outbox: str,
    batch_id: Annotated[str, Path(pattern=r"^[0-9a-f]{32}$")],
    items: ItemServiceDep,
) -> EraseBatchResponse:
    """From Temporal, not from the API process: any API instance, restarted or not, answers."""
    try:
        batch = await erase_batch(items, outbox, batch_id)
    except EraseBatchNotFound as err:
        raise ApiProblem(404, "erase-batch-not-found", "Erase batch not found", str(err)) from None
    return EraseBatchResponse.of(batch)
