"""An item's attempt log (each request its activities made to the provider,
`readmodel/attempts.py`) and erasing an ended item's personal data (`readmodel/erasure.py`)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

from durable_outbox_temporal.contract.ids import item_workflow_id
from durable_outbox_temporal.errors import ItemNotFound, NotErasable
from fastapi import APIRouter
from pydantic import BaseModel, Field

from api.deps import ItemServiceDep
from api.errors import ApiProblem
from api.schemas import problem_responses
from readmodel import attempts as attempt_log
from readmodel import erasure

router = APIRouter(
    prefix="/v1/outboxes/{outbox}",
    tags=["items"],
    responses=problem_responses(401, 403, 404, 503),
)


class AttemptRequest(BaseModel):
    method: str
    host: str
    path: str = Field(description="without the query")
    headers: dict[str, str] = Field(description="without credentials and signatures")


class AttemptResponse(BaseModel):
    status: int | None = Field(description="HTTP status; null when no answer came (`error`)")
    headers: dict[str, str] = Field(
        description="`retry-after`, `operation-location` and `location`, when sent"
    )
    body: str | None = Field(description="the body's first 2 KiB, as text")
    body_truncated: bool


class Attempt(BaseModel):
    """One request to the provider and what came of it."""

    n: int = Field(description="the item's attempt number, from 1")
    kind: str = Field(description="`submit` or `poll`")
    started_at: datetime
    latency_ms: int
    request: AttemptRequest
    response: AttemptResponse
    error: str | None = Field(description="the error class when no answer came (timeout, …)")


class AttemptsResponse(BaseModel):
    attempts: list[Attempt] = Field(description="newest last; the newest 50 are kept")
    erased_at: datetime | None = Field(
        default=None, description="when the item's payload and attempt bodies were erased"
    )


class ErasedResponse(BaseModel):
    erased_at: datetime


@router.get(
    "/items/{key}/attempts",
    response_model=AttemptsResponse,
    summary="One item's attempt log",
    responses=problem_responses(410),
)
async def get_attempts(outbox: str, key: str, items: ItemServiceDep) -> dict[str, Any]:
    """Each request made to the provider for the item (submits and polls), newest last: the
    request without secrets, the status or error, the timing headers, the body's start."""
    snapshot = await items.get(outbox, key)
    found = await asyncio.to_thread(attempt_log.read_attempts, items.engine, snapshot.view.id)
    erased = await asyncio.to_thread(attempt_log.erased_at, items.engine, snapshot.view.id)
    return {"attempts": found, "erased_at": erased}


@router.delete(
    "/items/{key}/payload",
    response_model=ErasedResponse,
    summary="Erase an ended item's payload",
    responses=problem_responses(409),
)
async def erase_payload(outbox: str, key: str, items: ItemServiceDep) -> ErasedResponse:
    """Remove the item's personal data from the read model, leaving no copy: its payload and its
    digest, its recipients' addresses and the event details that name them, its attempts'
    headers and bodies, its claim-check blob, the relay's copy and its debounce carrier's copy.
    Its statuses, times and attempt numbers stay. Only once it has ended and no longer takes
    delivery reports. An item whose row retention pruned: the digest of its request that its
    key's memory kept, and its subject link. A key with no item: the relay's rows of it that the
    outbox refused for good."""
    # Asked first: Temporal may still hold a workflow whose row retention pruned.
    pruned = await asyncio.to_thread(
        erasure.erase_remembered_key, items.engine, item_workflow_id(outbox, key)
    )
    if pruned is not None:
        return ErasedResponse(erased_at=pruned)
    try:
        view = (await items.get(outbox, key)).view
    except ItemNotFound:
        # No item: what the relay kept of rows the outbox refused for good, if any.
        if await asyncio.to_thread(erasure.erase_refused_relay_rows, items.engine, outbox, key):
            return ErasedResponse(erased_at=datetime.now(UTC))
        raise
    destination = items.client.destinations.get(view.destination)
    window_s = destination.delivery.report_window_s if destination is not None else 0
    refused = erasure.refusal(view, window_s, datetime.now(UTC))
    if refused is not None:
        raise _not_erasable(refused)
    try:
        at = await asyncio.to_thread(
            erasure.erase_item, items.engine, view.id, [str(s) for s in erasure.ERASABLE]
        )
    except erasure.CarrierUnderWay as err:
        raise _not_erasable(f"item {key!r}: {err}") from err
    if at is None:  # a redrive took it meanwhile: it is running again
        raise _not_erasable(f"item {key!r} is queued again (redriven): it has not ended")
    return ErasedResponse(erased_at=at)


def _not_erasable(detail: str) -> ApiProblem:
    return ApiProblem.from_outbox_error(NotErasable(detail))
