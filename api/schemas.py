"""Request and response bodies of the REST API (pydantic; OpenAPI is generated from them)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from common.ids import MAX_KEY_LENGTH

MAX_BATCH = 100


class EnqueueRequest(BaseModel):
    """One item to deliver."""

    model_config = ConfigDict(extra="forbid")

    destination: str = Field(min_length=1, max_length=63, examples=["fake-email"])
    payload: dict[str, Any] = Field(
        description="What the provider receives (ACS body, webhook JSON)"
    )
    ordering_key: str | None = Field(default=None, min_length=1, max_length=200)
    not_before: AwareDatetime | None = Field(
        default=None, description="Deliver no earlier than this (RFC 3339 with a time zone)"
    )
    max_attempts: int | None = Field(
        default=None, ge=1, le=1000, description="Lower the destination's attempt limit"
    )


class BatchEnqueueItem(EnqueueRequest):
    """One item of a batch; its key goes in the body since headers are per request."""

    idempotency_key: str | None = Field(default=None, min_length=1, max_length=MAX_KEY_LENGTH)


class BatchEnqueueRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    items: list[BatchEnqueueItem] = Field(min_length=1, max_length=MAX_BATCH)


class ItemLinks(BaseModel):
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
    problem: dict[str, Any] | None = None


class BatchEnqueueResponse(BaseModel):
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
    model_config = ConfigDict(extra="forbid")

    reason: str = Field(default="cancelled by request", max_length=500)


class RedriveFailedRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    destination: str | None = None


class RedriveFailedResponse(BaseModel):
    redriven: int
    skipped: int
    keys: list[str]


class DestinationInfo(BaseModel):
    name: str
    provider: str
    submit_rate: float
    poll_rate: float
    max_attempts: int


class OutboxStats(BaseModel):
    outbox: str
    counts: dict[str, int]
    total: int
    destinations: list[DestinationInfo]


class OutboxSummary(BaseModel):
    outbox: str
    counts: dict[str, int]
    total: int
