"""Outbox items: enqueue (one or a batch), inspect, list, history, cancel, redrive.

URL scheme: a key is exactly one path segment (percent-encode it; keys may hold any printable
character but `/`, and `.`/`..` are refused since clients drop them as dot segments). Actions on
the whole collection are custom methods after a colon (`items:batch`, `items:redrive-failed`,
`items:purge`, which starts a batch followed at `purge-batches/{id}`);
actions on one item are sub-resources (`items/{key}/cancel`, `items/{key}/redrive`), so a key
that itself contains `:` never collides with an action.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from datetime import UTC, datetime
from typing import Annotated
from urllib.parse import quote

from durable_outbox_temporal import (
    CancelRequested,
    EnqueueResult,
    InvalidRequest,
    ItemFailedUseRedrive,
    validate_outbox,
)
from durable_outbox_temporal.contract.item import (
    CancelRequest,
    DeliveryOutcome,
    ItemStatus,
    NewItem,
)
from durable_outbox_temporal.contract.limits import MAX_DESTINATION_LENGTH, MAX_KEY_LENGTH
from durable_outbox_temporal.contract.purge import MAX_REPORTED_KEYS
from fastapi import APIRouter, Body, Header, Path, Query, Response, status
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field, ValidationError

from api.dates import UtcDatetime
from api.deps import (
    DestinationControlsDep,
    ItemServiceDep,
    MetricsDep,
    OutboxClientDep,
    ResourcesDep,
)
from api.errors import ApiProblem, internal_error, known_problem, validation_problem
from api.metrics import ApiMetrics
from api.schemas import (
    BatchEnqueueItem,
    BatchEnqueueRequest,
    BatchEnqueueResponse,
    BatchResult,
    CancelRequestedResponse,
    EnqueueRequest,
    EnqueueResponse,
    EventResponse,
    ItemLinks,
    ItemPage,
    ItemResponse,
    Problem,
    PurgeRequest,
    RedriveFailedRequest,
    RedriveFailedResponse,
    problem_responses,
)
from readmodel import store
from readmodel.attempts import erased_at
from readmodel.replays import replay_links
from service.items import (
    Enqueued,
    ItemService,
    ItemSnapshot,
    PurgeBatch,
    PurgeBatchNotFound,
)
from service.waiting import explain

log = logging.getLogger("outbox.api")

router = APIRouter(
    prefix="/v1/outboxes/{outbox}",
    tags=["items"],
    responses=problem_responses(401, 403, 404, 409, 413, 415, 422, 503),
)


def item_links(outbox: str, key: str) -> ItemLinks:
    """The item's URLs, its key percent-encoded as one path segment."""
    base = f"/v1/outboxes/{quote(outbox, safe='')}/items/{quote(key, safe='')}"
    return ItemLinks(
        self=base, events=f"{base}/events", cancel=f"{base}/cancel", redrive=f"{base}/redrive"
    )


@router.post(
    "/items",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=EnqueueResponse,
    responses={200: {"model": EnqueueResponse, "description": "The key's existing item"}},
    summary="Enqueue one item",
)
async def enqueue_item(
    outbox: str,
    body: EnqueueRequest,
    response: Response,
    items: ItemServiceDep,
    metrics: MetricsDep,
    idempotency_key: Annotated[
        str | None,
        Header(max_length=1000, description="Repeat it to retry safely; generated when absent"),
    ] = None,
) -> EnqueueResponse:
    """202 and `Location` for a new item; 200 with the existing item for a repeated key."""
    key = _header_text(idempotency_key) if idempotency_key is not None else str(uuid.uuid4())
    try:
        enqueued = await items.enqueue(outbox, body.new_item(key, datetime.now(UTC)))
    except Exception as err:
        problem = _enqueue_problem(err, outbox, key)
        _count_failed_enqueue(metrics, items, outbox, body.destination, problem)
        if problem is None:
            raise
        raise problem from err
    metrics.count_enqueue(outbox, body.destination, _outcome(enqueued))
    if enqueued.result.created:
        response.headers["Location"] = item_links(outbox, key).self
    else:
        response.status_code = status.HTTP_200_OK
    return _enqueue_response(enqueued.result, enqueued.status)


@router.post("/items:batch", response_model=BatchEnqueueResponse, summary="Enqueue up to 100 items")
async def enqueue_batch(
    outbox: str, body: BatchEnqueueRequest, items: ItemServiceDep, metrics: MetricsDep
) -> BatchEnqueueResponse:
    """Always 200 when the batch is well-formed; each result has its own status and problem."""
    results: list[BatchResult | None] = [None] * len(body.items)
    valid: list[tuple[int, BatchEnqueueItem, NewItem]] = []
    for index, raw in enumerate(body.items):
        try:
            item = BatchEnqueueItem.model_validate(raw)
        except ValidationError as err:
            invalid = validation_problem(err.errors(), ("body", "items", index))
            results[index] = BatchResult(index=index, status=422, problem=_problem(invalid))
            continue
        key = item.idempotency_key or str(uuid.uuid4())
        valid.append((index, item, item.new_item(key, datetime.now(UTC))))
    outcomes = await items.enqueue_many(outbox, [new for _, _, new in valid])
    for (index, item, new), outcome in zip(valid, outcomes, strict=True):
        if isinstance(outcome, Exception):
            problem = _enqueue_problem(outcome, outbox, new.key)
            _count_failed_enqueue(metrics, items, outbox, item.destination, problem)
            if problem is None:
                # A bug, but only this item's: the others may be handed over already, and a
                # whole-answer 500 would hide that from a client that then retries them all.
                log.error("unexpected error enqueuing %s", new.key, exc_info=outcome)
                problem = internal_error()
            results[index] = BatchResult(
                index=index, status=problem.status, problem=_problem(problem)
            )
            continue
        metrics.count_enqueue(outbox, item.destination, _outcome(outcome))
        results[index] = BatchResult(
            index=index,
            status=202 if outcome.result.created else 200,
            item=_enqueue_response(outcome.result, outcome.status),
        )
    answered = [result for result in results if result is not None]
    return BatchEnqueueResponse(
        created=sum(1 for r in answered if r.status == 202),
        existing=sum(1 for r in answered if r.status == 200),
        failed=sum(1 for r in answered if r.status >= 400),
        results=answered,
    )


@router.get("/items", response_model=ItemPage, summary="List items (newest first)")
async def list_items(
    outbox: str,
    items: ItemServiceDep,
    status_filter: Annotated[ItemStatus | None, Query(alias="status")] = None,
    destination: Annotated[str | None, Query(max_length=MAX_DESTINATION_LENGTH)] = None,
    key_prefix: Annotated[
        str | None,
        Query(max_length=MAX_KEY_LENGTH, description="Only items whose key starts with this"),
    ] = None,
    error_code: Annotated[
        str | None,
        Query(max_length=200, description="Only items that failed with this provider code"),
    ] = None,
    delivery: Annotated[
        DeliveryOutcome | None,
        Query(
            description="Only items whose recipients' delivery reports say so: `bounced` (any"
            " recipient not reached), `delivered` (all reached) or `pending` (awaiting reports)"
        ),
    ] = None,
    created_from: Annotated[
        UtcDatetime | None, Query(description="Inclusive; a time without offset is UTC")
    ] = None,
    created_to: Annotated[
        UtcDatetime | None, Query(description="Exclusive; a time without offset is UTC")
    ] = None,
    cursor: Annotated[str | None, Query(max_length=1000)] = None,
    limit: Annotated[int, Query(ge=1, le=store.MAX_PAGE)] = 50,
) -> ItemPage:
    """From the read model; pass `next_cursor` back as `cursor` for the next page."""
    snapshots, next_cursor = await items.list(
        outbox,
        status=status_filter,
        destination=destination,
        key_prefix=key_prefix,
        error_code=error_code,
        delivery=delivery,
        created_from=created_from,
        created_to=created_to,
        cursor=cursor,
        limit=limit,
    )
    return ItemPage(items=[_item_response(s) for s in snapshots], next_cursor=next_cursor)


class PurgeBatchResponse(BaseModel):
    """A purge batch: what it cancels, how far it is (`done` at the end), and Temporal's word
    for its workflow (`running`, `completed`, `failed`, `terminated`...)."""

    id: str
    outbox: str
    state: str
    destination: str | None
    reason: str
    cancelled: int = Field(description="items cancelled so far (or whose cancel is recorded)")
    skipped: int = Field(description="handed to the provider, or ended, when reached")
    keys: list[str] = Field(description=f"the first {MAX_REPORTED_KEYS} keys cancelled")
    pages: int
    done: bool
    finished_at: datetime | None
    failure: str | None = Field(description="why the batch stopped before its end (failed)")
    links: dict[str, str]

    @classmethod
    def of(cls, batch: PurgeBatch) -> PurgeBatchResponse:
        progress = batch.progress
        return cls(
            id=batch.id,
            outbox=progress.outbox,
            state=batch.state,
            destination=progress.destination,
            reason=progress.reason,
            cancelled=progress.cancelled,
            skipped=progress.skipped,
            keys=progress.keys,
            pages=progress.pages,
            done=progress.done,
            finished_at=progress.finished_at,
            failure=progress.failure,
            links={
                "self": f"/v1/outboxes/{quote(progress.outbox, safe='')}/purge-batches/{batch.id}"
            },
        )


@router.post(
    "/items:purge",
    response_model=PurgeBatchResponse,
    status_code=status.HTTP_202_ACCEPTED,
    summary="Cancel every item not yet submitted, as a batch",
)
async def purge(
    outbox: str,
    response: Response,
    items: ItemServiceDep,
    resources: ResourcesDep,
    body: Annotated[PurgeRequest | None, Body()] = None,
) -> PurgeBatchResponse:
    """Starts a batch (a `PurgeBatch` workflow) that cancels queued, delayed and backing-off
    items (optionally of one destination) and answers at once; follow it at `links.self` (also
    the `Location` header). Items the provider already has are left alone; items enqueued
    during the purge may escape it."""
    request = body or PurgeRequest()
    batch = await items.start_purge(
        outbox, resources.settings.operations_task_queue, request.destination, request.reason
    )
    result = PurgeBatchResponse.of(batch)
    response.headers["Location"] = result.links["self"]
    return result


@router.get(
    "/purge-batches/{batch_id}",
    response_model=PurgeBatchResponse,
    summary="A purge batch's progress",
)
async def get_purge_batch(
    outbox: str,
    batch_id: Annotated[str, Path(pattern=r"^[0-9a-f]{32}$")],
    items: ItemServiceDep,
) -> PurgeBatchResponse:
    """From Temporal, not from the API process: any API instance, restarted or not, answers."""
    try:
        batch = await items.purge_batch(outbox, batch_id)
    except PurgeBatchNotFound as err:
        raise ApiProblem(404, "purge-batch-not-found", "Purge batch not found", str(err)) from None
    return PurgeBatchResponse.of(batch)


@router.post(
    "/items:redrive-failed",
    response_model=RedriveFailedResponse,
    summary="Redrive every failed item of the outbox",
)
async def redrive_failed(
    outbox: str,
    items: ItemServiceDep,
    body: Annotated[RedriveFailedRequest | None, Body()] = None,
) -> RedriveFailedResponse:
    """Restart each failed item (optionally of one destination) under its own id."""
    sweep = await items.redrive_failed(outbox, body.destination if body else None)
    return RedriveFailedResponse(
        redriven=len(sweep.redriven), skipped=sweep.skipped, keys=sweep.redriven
    )


@router.get(
    "/items/{key}",
    response_model=ItemResponse,
    summary="One item's status",
    responses=problem_responses(410),
)
async def get_item(
    outbox: str,
    key: str,
    items: ItemServiceDep,
    controls: DestinationControlsDep,
    client: OutboxClientDep,
) -> ItemResponse:
    """Live from the workflow while it runs; from the read model once it has ended. A queued
    item says why it has not gone yet (`waiting_on`). One retention deleted: 410, saying how it
    ended."""
    snapshot = await items.get(outbox, key)
    response = _item_response(snapshot)
    response.waiting_on = await explain(snapshot.view, controls, client, items.engine)
    if snapshot.view.status.is_final:
        response.erased_at = await asyncio.to_thread(erased_at, items.engine, snapshot.view.id)
    original, replayed = await asyncio.to_thread(replay_links, items.engine, snapshot.view.id)
    response.replay_of = original.original_key if original is not None else None
    response.replays = [link.replay_key for link in replayed]
    return response


@router.get(
    "/items/{key}/events",
    response_model=list[EventResponse],
    summary="One item's history",
    responses=problem_responses(410),
)
async def get_item_events(outbox: str, key: str, items: ItemServiceDep) -> list[EventResponse]:
    """Transitions oldest first, from the read model (empty until the first one is projected)."""
    return await items.events(outbox, key)


@router.post(
    "/items/{key}/cancel",
    response_model=ItemResponse,
    responses={202: {"model": CancelRequestedResponse, "description": "No worker answered"}},
    summary="Cancel a queued item",
)
async def cancel_item(
    outbox: str,
    key: str,
    items: ItemServiceDep,
    body: Annotated[CancelRequest | None, Body()] = None,
) -> ItemResponse | JSONResponse:
    """200 with the cancelled item; 202 when no worker answered in time (the cancel is recorded
    and applies when one returns); 409 once the provider has accepted the item or it has ended."""
    outcome = await items.cancel(outbox, key, (body or CancelRequest()).reason)
    if isinstance(outcome, CancelRequested):
        requested = CancelRequestedResponse(
            id=outcome.item_id,
            outbox=outcome.outbox,
            key=outcome.key,
            reason=outcome.reason,
            links=item_links(outcome.outbox, outcome.key),
        )
        return JSONResponse(requested.model_dump(mode="json"), status.HTTP_202_ACCEPTED)
    return _item_response(outcome)


@router.post(
    "/items/{key}/redrive",
    response_model=EnqueueResponse,
    status_code=status.HTTP_202_ACCEPTED,
    summary="Run a failed item again",
)
async def redrive_item(outbox: str, key: str, items: ItemServiceDep) -> EnqueueResponse:
    """Fresh attempts under the same id, with the destination's current policy."""
    return _enqueue_response(await items.redrive(outbox, key), ItemStatus.QUEUED)


def _item_response(snapshot: ItemSnapshot) -> ItemResponse:
    view = snapshot.view
    return ItemResponse(
        **vars(view),
        payload=snapshot.payload,
        source=snapshot.source,
        links=item_links(view.outbox, view.key),
        payload_pruned_at=snapshot.payload_pruned_at,
    )


def _enqueue_response(result: EnqueueResult, item_status: ItemStatus) -> EnqueueResponse:
    return EnqueueResponse(
        id=result.item_id,
        outbox=result.outbox,
        key=result.key,
        created=result.created,
        status=item_status.value,
        links=item_links(result.outbox, result.key),
    )


def _enqueue_problem(err: Exception, outbox: str, key: str) -> ApiProblem | None:
    """The error's problem; for a permanently failed item it carries the link that redrives it."""
    if isinstance(err, ItemFailedUseRedrive):
        return ApiProblem.from_outbox_error(err, redrive=item_links(outbox, key).redrive)
    return known_problem(err)


def _outcome(enqueued: Enqueued) -> str:
    return "created" if enqueued.result.created else "existing"


def _count_failed_enqueue(
    metrics: ApiMetrics,
    items: ItemService,
    outbox: str,
    destination: str,
    problem: ApiProblem | None,
) -> None:
    """Count a failed enqueue; names nobody configured collapse into one label value each."""
    try:
        validate_outbox(outbox)
    except InvalidRequest:
        outbox = "invalid"
    if destination not in items.client.destinations:
        destination = "unknown"
    outcome = "rejected" if problem is not None and problem.status < 500 else "error"
    metrics.count_enqueue(outbox, destination, outcome)


def _problem(problem: ApiProblem) -> Problem:
    return Problem(**problem.body(None))


def _header_text(value: str) -> str:
    """Starlette decodes headers as Latin-1, but clients such as curl send UTF-8 bytes."""
    try:
        return value.encode("latin-1").decode("utf-8")
    except UnicodeError:
        return value
