"""Outbox items: enqueue (one or a batch), inspect, list, history, cancel, redrive."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from datetime import datetime
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, Body, Header, Query, Request, Response, status

from api.deps import EngineDep, OutboxClientDep, ResourcesDep
from api.errors import outbox_error_problem
from api.schemas import (
    BatchEnqueueRequest,
    BatchEnqueueResponse,
    BatchResult,
    CancelRequest,
    EnqueueRequest,
    EnqueueResponse,
    EventResponse,
    ItemLinks,
    ItemPage,
    ItemResponse,
    RedriveFailedRequest,
    RedriveFailedResponse,
)
from common.client import (
    EnqueueResult,
    ItemNotFound,
    OutboxClient,
    OutboxError,
    validate_key,
    validate_outbox,
)
from common.models import ItemStatus, OutboxItemView
from readmodel import store
from readmodel.models import OutboxItem

router = APIRouter(prefix="/v1/outboxes/{outbox}", tags=["items"])

# Concurrent workflow starts per batch: enough to hide RPC latency, few enough to be polite.
_BATCH_CONCURRENCY = 10


def item_links(outbox: str, key: str) -> ItemLinks:
    base = f"/v1/outboxes/{quote(outbox, safe='')}/items/{quote(key, safe='')}"
    return ItemLinks(
        self=base, events=f"{base}/events", cancel=f"{base}/cancel", redrive=f"{base}/redrive"
    )


def _enqueue_response(result: EnqueueResult, status_value: str) -> EnqueueResponse:
    return EnqueueResponse(
        id=result.item_id,
        outbox=result.outbox,
        key=result.key,
        created=result.created,
        status=status_value,
        links=item_links(result.outbox, result.key),
    )


async def _enqueue_one(
    client: OutboxClient, outbox: str, key: str, body: EnqueueRequest
) -> EnqueueResponse:
    result = await client.enqueue(
        outbox,
        body.destination,
        body.payload,
        key=key,
        ordering_key=body.ordering_key,
        not_before=body.not_before,
        max_attempts=body.max_attempts,
    )
    if result.created:
        return _enqueue_response(result, ItemStatus.QUEUED.value)
    view = await client.status(outbox, key)
    return _enqueue_response(result, view.status.value)


@router.post(
    "/items",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=EnqueueResponse,
    responses={200: {"description": "An item with this Idempotency-Key already exists"}},
    summary="Enqueue one item",
)
async def enqueue_item(
    outbox: str,
    body: EnqueueRequest,
    request: Request,
    response: Response,
    client: OutboxClientDep,
    idempotency_key: Annotated[str | None, Header(max_length=1000)] = None,
) -> EnqueueResponse:
    """202 for a new item; 200 with the existing item when the key was seen with this payload."""
    key = idempotency_key if idempotency_key is not None else str(uuid.uuid4())
    metrics = request.app.state.metrics
    try:
        result = await _enqueue_one(client, outbox, key, body)
    except OutboxError:
        metrics.enqueued.labels(outbox, body.destination, "rejected").inc()
        raise
    metrics.enqueued.labels(
        outbox, body.destination, "created" if result.created else "existing"
    ).inc()
    if result.created:
        response.headers["Location"] = result.links.self
    else:
        response.status_code = status.HTTP_200_OK
    return result


@router.post("/items:batch", response_model=BatchEnqueueResponse, summary="Enqueue up to 100 items")
async def enqueue_batch(
    outbox: str, body: BatchEnqueueRequest, request: Request, client: OutboxClientDep
) -> BatchEnqueueResponse:
    """Each item succeeds or fails on its own; `results[i].status` is its own HTTP status."""
    validate_outbox(outbox)
    limit = asyncio.Semaphore(_BATCH_CONCURRENCY)
    metrics = request.app.state.metrics

    async def one(index: int, item: Any) -> BatchResult:
        key = item.idempotency_key or str(uuid.uuid4())
        async with limit:
            try:
                result = await _enqueue_one(client, outbox, key, item)
            except OutboxError as err:
                metrics.enqueued.labels(outbox, item.destination, "rejected").inc()
                code, problem = outbox_error_problem(None, err)
                return BatchResult(index=index, status=code, problem=problem)
        metrics.enqueued.labels(
            outbox, item.destination, "created" if result.created else "existing"
        ).inc()
        return BatchResult(index=index, status=202 if result.created else 200, item=result)

    results = await asyncio.gather(*(one(i, item) for i, item in enumerate(body.items)))
    return BatchEnqueueResponse(
        created=sum(1 for r in results if r.status == 202),
        existing=sum(1 for r in results if r.status == 200),
        failed=sum(1 for r in results if r.status >= 400),
        results=list(results),
    )


@router.get("/items", response_model=ItemPage, summary="List items (newest first)")
async def list_items(
    outbox: str,
    engine: EngineDep,
    status_filter: Annotated[ItemStatus | None, Query(alias="status")] = None,
    destination: Annotated[str | None, Query(max_length=63)] = None,
    created_from: datetime | None = None,
    created_to: datetime | None = None,
    cursor: Annotated[str | None, Query(max_length=1000)] = None,
    limit: Annotated[int, Query(ge=1, le=store.MAX_PAGE)] = 50,
) -> ItemPage:
    """From the read model; pass `next_cursor` back as `cursor` for the next page."""
    validate_outbox(outbox)
    rows, next_cursor = await asyncio.to_thread(
        store.list_items,
        engine,
        outbox,
        status=status_filter.value if status_filter else None,
        destination=destination,
        created_from=created_from,
        created_to=created_to,
        cursor=cursor,
        limit=limit,
    )
    return ItemPage(items=[_from_row(row) for row in rows], next_cursor=next_cursor)


@router.post(
    "/items:redrive-failed",
    response_model=RedriveFailedResponse,
    summary="Redrive every failed item of the outbox",
)
async def redrive_failed(
    outbox: str,
    engine: EngineDep,
    client: OutboxClientDep,
    body: Annotated[RedriveFailedRequest | None, Body()] = None,
) -> RedriveFailedResponse:
    """Restart each failed item (optionally of one destination) under its own id."""
    validate_outbox(outbox)
    destination = body.destination if body else None
    keys = await asyncio.to_thread(store.list_failed, engine, outbox, destination)
    redriven: list[str] = []
    for key in keys:
        try:
            await client.redrive(outbox, key)
        except OutboxError:
            continue  # already redriven by someone else, or no longer failed
        redriven.append(key)
    return RedriveFailedResponse(
        redriven=len(redriven), skipped=len(keys) - len(redriven), keys=redriven
    )


@router.get("/items/{key}", response_model=ItemResponse, summary="One item's status")
async def get_item(
    outbox: str, key: str, engine: EngineDep, client: OutboxClientDep
) -> ItemResponse:
    """Live from the workflow while it runs; from the read model once it has ended."""
    validate_outbox(outbox)
    validate_key(key)
    row = await asyncio.to_thread(store.get_item, engine, f"outbox/{outbox}/{key}")
    if row is not None and ItemStatus(row.status).is_final:
        return _from_row(row)
    try:
        view = await client.status(outbox, key)
    except ItemNotFound:
        if row is None:
            raise
        return _from_row(row)
    return _from_view(view, row.payload if row else None)


@router.get("/items/{key}/events", response_model=list[EventResponse], summary="One item's history")
async def get_item_events(outbox: str, key: str, engine: EngineDep) -> list[EventResponse]:
    validate_outbox(outbox)
    validate_key(key)
    item_id = f"outbox/{outbox}/{key}"
    events = await asyncio.to_thread(store.item_events, engine, item_id)
    if not events and await asyncio.to_thread(store.get_item, engine, item_id) is None:
        raise ItemNotFound(f"no item {item_id!r}")
    return [EventResponse.model_validate(event, from_attributes=True) for event in events]


@router.post("/items/{key}/cancel", response_model=ItemResponse, summary="Cancel a queued item")
async def cancel_item(
    outbox: str,
    key: str,
    client: OutboxClientDep,
    body: Annotated[CancelRequest | None, Body()] = None,
) -> ItemResponse:
    """409 once the provider has accepted the item: it cannot be recalled."""
    view = await client.cancel(outbox, key, (body or CancelRequest()).reason)
    return _from_view(view, None)


@router.post(
    "/items/{key}/redrive",
    response_model=EnqueueResponse,
    status_code=status.HTTP_202_ACCEPTED,
    summary="Run a failed item again",
)
async def redrive_item(outbox: str, key: str, resources: ResourcesDep) -> EnqueueResponse:
    """Fresh attempts under the same id, with the destination's current policy."""
    result = await resources.outbox.redrive(outbox, key)
    return _enqueue_response(result, ItemStatus.QUEUED.value)


def _from_view(view: OutboxItemView, payload: dict[str, Any] | None) -> ItemResponse:
    return ItemResponse.model_validate(
        {
            **dataclasses.asdict(view),
            "payload": payload,
            "source": "workflow",
            "links": item_links(view.outbox, view.key),
        }
    )


def _from_row(row: OutboxItem) -> ItemResponse:
    return ItemResponse.model_validate(
        {
            **row.model_dump(exclude={"version", "payload_hash"}),
            "source": "read-model",
            "links": item_links(row.outbox, row.key),
        }
    )
