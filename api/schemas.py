"""Request and response bodies of the REST API (pydantic; OpenAPI is generated from them)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, WithJsonSchema

from common.ids import MAX_KEY_LENGTH

MAX_BATCH = 100


class EnqueueRequest(BaseModel):
    """One item to deliver."""

    model_config = ConfigDict(extra="forbid")

    destination: str = Field(min_length=1, max_length=63, examples=["fake-email"])
    payload: dict[str, Any] = Field(
        description="What the provider receives (ACS body, webhook JSON)"
    )
    ordering_key: str | None = Field(
        default=None, min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f]+$"
    )
    not_before: AwareDatetime | None = Field(
        default=None, description="Deliver no earlier than this (RFC 3339 with a time zone)"
    )
    max_attempts: int | None = Field(
        default=None,
        ge=1,
        le=1000,
        strict=True,
        description="Lower the destination's attempt limit for this item",
    )


class BatchEnqueueItem(EnqueueRequest):
    """One item of a batch; its key goes in the body since headers are per request."""

    idempotency_key: str | None = Field(default=None, min_length=1, max_length=MAX_KEY_LENGTH)


class BatchEnqueueRequest(BaseModel):
    """Up to 100 items; each is validated on its own, so one bad item fails only itself."""

    model_config = ConfigDict(extra="forbid")

    items: Annotated[
        list[Any],
        Field(min_length=1, max_length=MAX_BATCH),
        WithJsonSchema(
            {
                "type": "array",
                "items": BatchEnqueueItem.model_json_schema(),
                "minItems": 1,
                "maxItems": MAX_BATCH,
            }
        ),
    ]


class Problem(BaseModel):
    """An RFC 9457 problem; validation problems add `errors`, one per invalid field."""

    model_config = ConfigDict(extra="allow")

    type: str = Field(examples=["/problems/idempotency-conflict"])
    title: str
    status: int
    detail: str
    instance: str | None = None
    errors: list[dict[str, Any]] | None = None


class ItemLinks(BaseModel):
    """Where to read, follow and act on an item."""

    self: str
    events: str
    cancel: str
    redrive: str


class EnqueueResponse(BaseModel):
    """The enqueued (or already existing) item."""

    id: str
    outbox: str
    key: str
    created: bool
    status: str
    links: ItemLinks


class BatchResult(BaseModel):
    """One batch item's outcome: `status` is the HTTP status it would have had alone."""

    index: int
    status: int
    item: EnqueueResponse | None = None
    problem: Problem | None = None


class BatchEnqueueResponse(BaseModel):
    """Totals plus one result per item, in request order."""

    created: int
    existing: int
    failed: int
    results: list[BatchResult]


class ItemResponse(BaseModel):
    """An item's status: live from its workflow while it runs, from the read model after."""

    id: str
    outbox: str
    key: str
    destination: str
    status: str
    attempts: int
    max_attempts: int
    last_error: str | None
    next_attempt_at: datetime | None
    operation_url: str | None
    poll_count: int
    created_at: datetime | None
    updated_at: datetime | None
    finished_at: datetime | None
    ordering_key: str | None = None
    provider_message_id: str | None = None
    payload: dict[str, Any] | None = None
    source: str = Field(description="'workflow' (live) or 'read-model'")
    links: ItemLinks


class ItemPage(BaseModel):
    """One page of a list; pass `next_cursor` back as `cursor` (null: last page)."""

    items: list[ItemResponse]
    next_cursor: str | None


class EventResponse(BaseModel):
    """One transition; `id` is the outbox-wide cursor for `live?since=`."""

    id: int
    item_id: str
    outbox: str
    seq: int
    type: str
    status: str
    at: datetime
    attempt: int
    detail: str | None


class CancelRequest(BaseModel):
    """Optional body of a cancel; the reason is recorded in the item's history."""

    model_config = ConfigDict(extra="forbid")

    reason: str = Field(default="cancelled by request", max_length=500)


class RedriveFailedRequest(BaseModel):
    """Optional body of redrive-failed: restrict it to one destination."""

    model_config = ConfigDict(extra="forbid")

    destination: str | None = None


class RedriveFailedResponse(BaseModel):
    """How many failed items were started again (`keys`) and how many were not (`skipped`)."""

    redriven: int
    skipped: int
    keys: list[str]


class DestinationInfo(BaseModel):
    """A destination and the rates its task queues are limited to (per second)."""

    name: str
    provider: str
    submit_rate: float
    poll_rate: float
    max_attempts: int


class OutboxStats(BaseModel):
    """An outbox's item counts by status, and the destinations items can go to."""

    outbox: str
    counts: dict[str, int]
    total: int
    destinations: list[DestinationInfo]


class OutboxSummary(BaseModel):
    """An outbox with its item counts by status."""

    outbox: str
    counts: dict[str, int]
    total: int


def problem_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` declaring these statuses as problem+json."""
    schema = Problem.model_json_schema()
    return {
        status: {"content": {"application/problem+json": {"schema": schema}}} for status in statuses
    }
