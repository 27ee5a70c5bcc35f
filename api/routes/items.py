"""Outbox items: enqueue (one or a batch), inspect, list, history, cancel, redrive.

URL scheme: a key is exactly one path segment (percent-encode it; keys may hold any printable
character but `/`, and `.`/`..` are refused since clients drop them as dot segments). Actions on
the whole collection are custom methods after a colon (`items:batch`, `items:redrive-failed`);
actions on one item are sub-resources (`items/{key}/cancel`, `items/{key}/redrive`), so a key
that itself contains `:` never collides with an action.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import uuid
from datetime import datetime
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, Body, Header, Query, Response, status
from pydantic import ValidationError

from api.deps import EngineDep, MetricsDep, OutboxClientDep
from api.errors import ApiProblem, known_problem, validation_problem
from api.schemas import (
    BatchEnqueueItem,
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
    Problem,
    RedriveFailedRequest,
    RedriveFailedResponse,
    problem_responses,
)
from common.client import (
    EnqueueResult,
    InvalidRequest,
    ItemFailedUseRedrive,
    ItemNotFound,
    OutboxClient,
    OutboxError,
    validate_key,
    validate_outbox,
)
from common.ids import item_workflow_id
from common.models import ItemStatus, OutboxItemView
from readmodel import store
from readmodel.models import OutboxItem

log = logging.getLogger("outbox.api")

router = APIRouter(
    prefix="/v1/outboxes/{outbox}",
    tags=["items"],
    responses=problem_responses(401, 403, 404, 409, 413, 415, 422, 503),
)

# Concurrent workflow starts per batch: enough to hide RPC latency, few enough to be polite.
_BATCH_CONCURRENCY = 10
# Only a failed item can run again (redrive), so only a failed row can be behind its workflow.
_SETTLED = frozenset({ItemStatus.SENT.value, ItemStatus.CANCELLED.value})


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
    client: OutboxClientDep,
    metrics: MetricsDep,
    idempotency_key: Annotated[
        str | None,
        Header(max_length=1000, description="Repeat it to retry safely; generated when absent"),
    ] = None,
) -> EnqueueResponse:
    """202 and `Location` for a new item; 200 with the existing item for a repeated key."""
    key = _header_text(idempotency_key) if idempotency_key is not None else str(uuid.uuid4())
    try:
        result = await _enqueue_one(client, outbox, key, body)
    except OutboxError as err:
        metrics.count_enqueue(*_bounded_labels(client, outbox, body.destination), "rejected")
        raise _item_problem(err, outbox, key) from err
    except Exception:
        metrics.count_enqueue(*_bounded_labels(client, outbox, body.destination), "error")
        raise
    metrics.count_enqueue(outbox, body.destination, "created" if result.created else "existing")
    if result.created:
        response.headers["Location"] = result.links.self
    else:
        response.status_code = status.HTTP_200_OK
    return result


@router.post("/items:batch", response_model=BatchEnqueueResponse, summary="Enqueue up to 100 items")
async def enqueue_batch(
    outbox: str, body: BatchEnqueueRequest, client: OutboxClientDep, metrics: MetricsDep
) -> BatchEnqueueResponse:
    """Always 200 when the batch is well-formed; each result has its own status and problem."""
    validate_outbox(outbox)
    limit = asyncio.Semaphore(_BATCH_CONCURRENCY)

    async def one(index: int, raw: Any) -> BatchResult:
        try:
            item = BatchEnqueueItem.model_validate(raw)
        except ValidationError as err:
            invalid = validation_problem(err.errors(), ("body", "items", index))
            return BatchResult(index=index, status=422, problem=Problem(**invalid.body(None)))
        key = item.idempotency_key or str(uuid.uuid4())
        try:
            async with limit:
                result = await _enqueue_one(client, outbox, key, item)
        except Exception as err:
            problem = (
                _item_problem(err, outbox, key)
                if isinstance(err, OutboxError)
                else known_problem(err)
            )
            if problem is None:
                raise  # a bug: the whole request is a 500
            outcome = "rejected" if problem.status < 500 else "error"
            metrics.count_enqueue(*_bounded_labels(client, outbox, item.destination), outcome)
            return BatchResult(
                index=index, status=problem.status, problem=Problem(**problem.body(None))
            )
        outcome = "created" if result.created else "existing"
        metrics.count_enqueue(outbox, item.destination, outcome)
        return BatchResult(index=index, status=202 if result.created else 200, item=result)

    results = await asyncio.gather(*(one(i, raw) for i, raw in enumerate(body.items)))
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
    created_from: Annotated[
        datetime | None, Query(description="Inclusive; a time without offset is UTC")
    ] = None,
    created_to: Annotated[
        datetime | None, Query(description="Exclusive; a time without offset is UTC")
    ] = None,
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
    limit = asyncio.Semaphore(_BATCH_CONCURRENCY)

    async def redrive(key: str) -> bool:
        async with limit:
            try:
                await client.redrive(outbox, key)
            except OutboxError:
                return False  # redriven meanwhile by someone else, or no longer failed
        return True

    redriven = await asyncio.gather(*(redrive(key) for key in keys))
    started = [key for key, ok in zip(keys, redriven, strict=True) if ok]
    return RedriveFailedResponse(
        redriven=len(started), skipped=len(keys) - len(started), keys=started
    )


@router.get("/items/{key}", response_model=ItemResponse, summary="One item's status")
async def get_item(
    outbox: str, key: str, engine: EngineDep, client: OutboxClientDep
) -> ItemResponse:
    """Live from the workflow while it runs; from the read model once it has ended."""
    validate_outbox(outbox)
    validate_key(key)
    row = await asyncio.to_thread(store.get_item, engine, item_workflow_id(outbox, key))
    if row is not None and row.status in _SETTLED:
        return _from_row(row)
    try:
        view = await client.status(outbox, key)
    except ItemNotFound:
        # Temporal has deleted the history (retention), the read model still remembers.
        if row is None:
            raise
        return _from_row(row)
    except Exception as err:
        # With Temporal unreachable, the last projected state beats a 503 for a read.
        problem = known_problem(err)
        if row is None or problem is None or problem.status != status.HTTP_503_SERVICE_UNAVAILABLE:
            raise
        log.warning("serving %s from the read model: %s", row.id, problem.detail)
        return _from_row(row)
    if row is not None and view.status.is_final and row.status == view.status.value:
        return _from_row(row)
    return _from_view(view, row.payload if row else None)


@router.get("/items/{key}/events", response_model=list[EventResponse], summary="One item's history")
async def get_item_events(
    outbox: str, key: str, engine: EngineDep, client: OutboxClientDep
) -> list[EventResponse]:
    """Transitions oldest first, from the read model (empty until the first one is projected)."""
    validate_outbox(outbox)
    validate_key(key)
    item_id = item_workflow_id(outbox, key)
    events = await asyncio.to_thread(store.item_events, engine, item_id)
    if not events and await asyncio.to_thread(store.get_item, engine, item_id) is None:
        await client.status(outbox, key)  # raises ItemNotFound (404) for an unknown item
    return [EventResponse.model_validate(event, from_attributes=True) for event in events]


@router.post("/items/{key}/cancel", response_model=ItemResponse, summary="Cancel a queued item")
async def cancel_item(
    outbox: str,
    key: str,
    client: OutboxClientDep,
    body: Annotated[CancelRequest | None, Body()] = None,
) -> ItemResponse:
    """409 once the provider has accepted the item (it cannot be recalled) or it has ended."""
    view = await client.cancel(outbox, key, (body or CancelRequest()).reason)
    return _from_view(view, None)


@router.post(
    "/items/{key}/redrive",
    response_model=EnqueueResponse,
    status_code=status.HTTP_202_ACCEPTED,
    summary="Run a failed item again",
)
async def redrive_item(outbox: str, key: str, client: OutboxClientDep) -> EnqueueResponse:
    """Fresh attempts under the same id, with the destination's current policy."""
    result = await client.redrive(outbox, key)
    return _enqueue_response(result, ItemStatus.QUEUED.value)


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


def _enqueue_response(result: EnqueueResult, status_value: str) -> EnqueueResponse:
    return EnqueueResponse(
        id=result.item_id,
        outbox=result.outbox,
        key=result.key,
        created=result.created,
        status=status_value,
        links=item_links(result.outbox, result.key),
    )


def _item_problem(err: OutboxError, outbox: str, key: str) -> ApiProblem:
    """The error's problem; for a permanently failed item it carries the link that redrives it."""
    if isinstance(err, ItemFailedUseRedrive):
        return ApiProblem.from_outbox_error(err, redrive=item_links(outbox, key).redrive)
    return ApiProblem.from_outbox_error(err)


def _bounded_labels(client: OutboxClient, outbox: str, destination: str) -> tuple[str, str]:
    """Labels for a failed enqueue: names nobody configured collapse into one value each."""
    try:
        validate_outbox(outbox)
    except InvalidRequest:
        outbox = "invalid"
    return outbox, destination if destination in client.destinations else "unknown"


def _header_text(value: str) -> str:
    """Starlette decodes headers as Latin-1, but clients such as curl send UTF-8 bytes."""
    try:
        return value.encode("latin-1").decode("utf-8")
    except UnicodeError:
        return value


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
