"""Sealed values: how many stored values each payload key seals (`GET /v1/sealed-values`), and
the reseal batch that seals them all again under the newest key (`sealed-values:reseal`,
followed at `reseal-batches/{id}`), after which an older key can be removed
(docs/how-to/security.md#rotate-the-payload-keys)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from durable_outbox_temporal.contract.reseal import MAX_REPORTED_UNREADABLE
from fastapi import APIRouter, Path, Response, status
from pydantic import BaseModel, Field

from api.deps import ResourcesDep, SealedValueServiceDep
from api.errors import ApiProblem
from api.schemas import problem_responses
from service.sealed_values import (
    KeyUse,
    ResealBatch,
    ResealBatchNotFound,
    ResealNeedsKeys,
)

router = APIRouter(prefix="/v1", tags=["sealed values"], responses=problem_responses(401, 403))


class KeyUseResponse(BaseModel):
    """Stored values by the payload key they are sealed under: an old key with 0 values (and
    `other` 0) can be removed."""

    current_key: str | None = Field(description="the key new values are sealed under")
    keys: dict[str, int] = Field(description="values sealed under each configured key")
    other: int = Field(description="values sealed under a key id not configured (unreadable)")
    plain: int = Field(description="values stored plain (written before payload keys were set)")

    @classmethod
    def of(cls, use: KeyUse) -> KeyUseResponse:
        counts = use.counts
        return cls(
            current_key=use.current, keys=counts.by_key, other=counts.other, plain=counts.plain
        )


class ResealBatchResponse(BaseModel):
    """A reseal batch: the key it seals under, how far it is (`done` at the end), and
    Temporal's word for its workflow (`running`, `completed`, `failed`, `terminated`...)."""

    id: str
    state: str
    key_id: str | None = Field(description="the key values are sealed again under")
    resealed: int = Field(description="values sealed again so far")
    unreadable: int = Field(description="values under a key not configured, left as they are")
    errors: list[str] = Field(description=f"the first {MAX_REPORTED_UNREADABLE} unreadable")
    table: str | None = Field(description="the table the next page reads")
    tables_done: list[str]
    pages: int
    done: bool
    finished_at: datetime | None
    failure: str | None = Field(description="why the batch stopped before its end (failed)")
    links: dict[str, str]

    @classmethod
    def of(cls, batch: ResealBatch) -> ResealBatchResponse:
        progress = batch.progress
        return cls(
            id=batch.id,
            state=batch.state,
            key_id=progress.key_id,
            resealed=progress.resealed,
            unreadable=progress.unreadable,
            errors=progress.errors,
            table=progress.table,
            tables_done=progress.tables_done,
            pages=progress.pages,
            done=progress.done,
            finished_at=progress.finished_at,
            failure=progress.failure,
            links={"self": f"/v1/reseal-batches/{batch.id}"},
        )


@router.get(
    "/sealed-values", response_model=KeyUseResponse, summary="Stored values per payload key"
)
async def key_use(sealed: SealedValueServiceDep) -> KeyUseResponse:
    """Counts every sealed column's values by key id (one scan of each: not for a hot loop)."""
    return KeyUseResponse.of(await sealed.key_use())


@router.post(
    "/sealed-values:reseal",
    response_model=ResealBatchResponse,
    status_code=status.HTTP_202_ACCEPTED,
    summary="Seal every stored value again under the newest key, as a batch",
    responses=problem_responses(409),
)
async def reseal(
    response: Response, sealed: SealedValueServiceDep, resources: ResourcesDep
) -> ResealBatchResponse:
    """Starts a batch (a `ResealBatch` workflow) and answers at once; follow it at
    `links.self` (also the `Location` header). The worker's current key is the one used."""
    try:
        batch = await sealed.start_reseal(resources.settings.operations_task_queue)
    except ResealNeedsKeys as err:
        raise ApiProblem(409, "no-payload-keys", "No payload keys", str(err)) from None
    result = ResealBatchResponse.of(batch)
    response.headers["Location"] = result.links["self"]
    return result


@router.get(
    "/reseal-batches/{batch_id}",
    response_model=ResealBatchResponse,
    summary="A reseal batch's progress",
    responses=problem_responses(404),
)
async def get_reseal_batch(
    batch_id: Annotated[str, Path(pattern=r"^[0-9a-f]{32}$")],
    sealed: SealedValueServiceDep,
) -> ResealBatchResponse:
    """From Temporal, not from the API process: any API instance, restarted or not, answers."""
    try:
        batch = await sealed.reseal_batch(batch_id)
    except ResealBatchNotFound as err:
        raise ApiProblem(
            404, "reseal-batch-not-found", "Reseal batch not found", str(err)
        ) from None
    return ResealBatchResponse.of(batch)
