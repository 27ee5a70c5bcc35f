"""Request and response bodies of the REST API (pydantic; OpenAPI is generated from them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Annotated, Any, Literal, Self

from durable_outbox_temporal.contract.debounce_rules import (
    DEFAULT_MAX_WAIT_WINDOWS,
    MAX_DEBOUNCE_S,
    MAX_WAIT_LIMIT_S,
    check_debounce_key,
)
from durable_outbox_temporal.contract.item import NewItem, OutboxItemView
from durable_outbox_temporal.contract.limits import (
    MAX_DESTINATION_LENGTH,
    MAX_KEY_LENGTH,
    MAX_START_DELAY,
    MAX_SUBJECT_LENGTH,
    SUBJECT_PATTERN,
    TEXT_KEY_PATTERN,
    check_concurrency_key,
    check_idempotency_key,
    check_ordering_key,
)
from durable_outbox_temporal.contract.priority import HIGHEST_PRIORITY, LOWEST_PRIORITY
from durable_outbox_temporal.errors import InvalidRequest
from durable_outbox_temporal.validation import unsendable_json_value, validate_json_values
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    WithJsonSchema,
    model_validator,
)

from api.dates import AwareUtcDatetime
from flowcontrol.waiting import WaitingOn
from readmodel.models import EventRecord

MAX_BATCH = 100
# The largest integer a SQL BIGINT (and SQLite's INTEGER) holds: the bound of any sequence number
# or id a query parameter is compared with.
MAX_SQL_INTEGER = 2**63 - 1


def _sendable(document: dict[str, Any]) -> dict[str, Any]:
    """`document` if a provider can be sent it as JSON; ValueError naming the value otherwise."""
    try:
        validate_json_values(document)
    except InvalidRequest as err:
        raise ValueError(str(err)) from None
    return document


def _text(value: str) -> str:
    """`value` if it has a UTF-8 form (no lone surrogate); ValueError otherwise."""
    unsendable = unsendable_json_value(value)
    if unsendable is not None:
        raise ValueError(unsendable[1])
    return value


# A JSON object that goes to a provider: refused (per field, so per batch item) when it holds a
# lone surrogate or a number that is not finite, which no JSON body can carry.
SendableJson = Annotated[dict[str, Any], AfterValidator(_sendable)]


class EnqueueRequest(BaseModel):
    """One item to deliver."""

    model_config = ConfigDict(extra="forbid")

    destination: Annotated[
        str,
        Field(min_length=1, max_length=MAX_DESTINATION_LENGTH, examples=["fake-email"]),
        AfterValidator(_text),
    ]
    payload: SendableJson = Field(
        description="What the provider receives (ACS body, webhook JSON); refused when it holds"
        " a lone surrogate or a number that is not finite (NaN, Infinity, 1e400)"
    )
    ordering_key: Annotated[
        str | None,
        Field(max_length=MAX_KEY_LENGTH, pattern=TEXT_KEY_PATTERN),
        AfterValidator(lambda key: None if key is None else check_ordering_key(key)),
    ] = None
    not_before: AwareUtcDatetime | None = Field(
        default=None, description="Deliver no earlier than this (RFC 3339 with a time zone)"
    )
    delay_seconds: float | None = Field(
        default=None,
        ge=0,
        le=MAX_START_DELAY.total_seconds(),
        description="Deliver no earlier than this many seconds from now (or `not_before`)",
    )
    concurrency_key: Annotated[
        str | None,
        Field(
            max_length=MAX_KEY_LENGTH,
            pattern=TEXT_KEY_PATTERN,
            description="Whose share of the destination's caps and quotas the item counts in"
            " (a tenant, a customer): `key_max_in_flight`, `key_quotas`",
        ),
        AfterValidator(lambda key: None if key is None else check_concurrency_key(key)),
    ] = None
    priority: int | None = Field(
        default=None,
        ge=HIGHEST_PRIORITY,
        le=LOWEST_PRIORITY,
        strict=True,
        description="1 (first) to 5 (last): under a backlog, lower numbers are delivered"
        " first without starving the others; unset: 3",
    )
    max_attempts: int | None = Field(
        default=None,
        ge=1,
        le=1000,
        strict=True,
        description="Lower the destination's attempt limit for this item",
    )
    debounce_key: Annotated[
        str | None,
        Field(
            max_length=MAX_KEY_LENGTH,
            pattern=TEXT_KEY_PATTERN,
            description="Coalesce with the destination's other items of this key: they wait in"
            " the key's window and one delivery carries them all; the others end `superseded`"
            " (needs `debounce_s`; not with `ordering_key` or a due time)",
        ),
        AfterValidator(lambda key: None if key is None else check_debounce_key(key)),
    ] = None
    debounce_s: float | None = Field(
        default=None,
        gt=0,
        le=MAX_DEBOUNCE_S,
        description="The debounce window: it closes this many seconds after its last item",
    )
    debounce_mode: Literal["latest", "collect"] | None = Field(
        default=None,
        description="`latest` (default): the window's last payload goes; `collect` (webhook"
        " destinations): one delivery whose body is the JSON array of every payload in"
        " enqueue order",
    )
    max_wait_s: float | None = Field(
        default=None,
        gt=0,
        le=MAX_WAIT_LIMIT_S,
        description="The window closes at the latest this many seconds after its first item"
        f" (at least `debounce_s`; default {DEFAULT_MAX_WAIT_WINDOWS} times `debounce_s`)",
    )

    subject: str | None = Field(
        default=None,
        max_length=MAX_SUBJECT_LENGTH,
        pattern=SUBJECT_PATTERN,
        description="Whom the item is about (an email address, a customer id), so that"
        " `items:erase` with this `subject` erases it with the rest of theirs; stored only as a"
        " keyed digest",
    )

    @model_validator(mode="after")
    def _one_due_time(self) -> Self:
        if self.not_before is not None and self.delay_seconds is not None:
            raise ValueError("give not_before or delay_seconds, not both")
        return self

    def due_time(self, now: datetime) -> datetime | None:
        """When the item is due: `not_before`, or `delay_seconds` from `now`."""
        if self.delay_seconds is not None:
            return now + timedelta(seconds=self.delay_seconds)
        return self.not_before

    def new_item(self, key: str, now: datetime) -> NewItem:
        """The item this body asks for, under `key`; a delay counts from `now`."""
        return NewItem(
            destination=self.destination,
            payload=self.payload,
            key=key,
            ordering_key=self.ordering_key,
            not_before=self.due_time(now),
            max_attempts=self.max_attempts,
            priority=self.priority,
            concurrency_key=self.concurrency_key,
            debounce_key=self.debounce_key,
            debounce_s=self.debounce_s,
            debounce_mode=self.debounce_mode,
            max_wait_s=self.max_wait_s,
            subject=self.subject,
        )


class BatchEnqueueItem(EnqueueRequest):
    """One item of a batch; its key goes in the body since headers are per request."""

    idempotency_key: Annotated[
        str | None,
        Field(max_length=MAX_KEY_LENGTH, pattern=TEXT_KEY_PATTERN),
        AfterValidator(lambda key: None if key is None else check_idempotency_key(key)),
    ] = None


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
    """An RFC 9457 problem; validation problems add `errors`, one per invalid field. `code` is
    stable (docs/reference/problems.md); `type` links to its page."""

    model_config = ConfigDict(extra="allow")

    type: str = Field(examples=["/problems/idempotency-conflict"])
    code: str = Field(examples=["idempotency-conflict"])
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


@dataclass
class ItemResponse(OutboxItemView):
    """An item's status: every field of `OutboxItemView`, plus its payload, where the view came
    from and its links. Live from its workflow while it runs, from the read model after."""

    payload: dict[str, Any] | None = field(default=None, kw_only=True)
    waiting_on: list[WaitingOn] | None = field(
        default=None,
        kw_only=True,
        metadata={
            "description": "While queued (one item's GET): what holds it and until when where"
            " known: debounce (its window, until it closes), not_before, backoff, throttled,"
            " circuit_open, destination_disabled, destination_paused, lane, or its turn at the"
            " destination's rate"
        },
    )
    source: Literal["workflow", "read-model"] = field(
        kw_only=True, metadata={"description": "'workflow' (live) or 'read-model'"}
    )
    links: ItemLinks = field(kw_only=True)
    erased_at: datetime | None = field(
        default=None,
        kw_only=True,
        metadata={
            "description": "When its payload and attempt bodies were erased"
            " (`DELETE .../items/{key}/payload`), if they were"
        },
    )
    payload_pruned_at: datetime | None = field(
        default=None,
        kw_only=True,
        metadata={
            "description": "When retention removed its payload and attempt bodies (its"
            " destination's `payload_retention_s` after it ended), if it did: `payload` is"
            " then null and a redrive is refused"
        },
    )
    replay_of: str | None = field(
        default=None,
        kw_only=True,
        metadata={"description": "The key of the item this one replays (one item's GET)"},
    )
    replays: list[str] | None = field(
        default=None,
        kw_only=True,
        metadata={"description": "The keys of the items replaying this one (one item's GET)"},
    )


class CancelRequestedResponse(BaseModel):
    """No worker answered in time: the cancel is recorded (a `request_cancel` signal) and takes
    effect, if the item is still queued then, when a worker runs it again."""

    id: str
    outbox: str
    key: str
    reason: str
    cancel_requested: Literal[True] = True
    links: ItemLinks


class ItemPage(BaseModel):
    """One page of a list; pass `next_cursor` back as `cursor` (null: last page)."""

    items: list[ItemResponse]
    next_cursor: str | None


# One transition; `id` is the outbox-wide cursor for `live?since=`.
EventResponse = EventRecord


class RedriveFailedRequest(BaseModel):
    """Optional body of redrive-failed: restrict it to one destination."""

    model_config = ConfigDict(extra="forbid")

    destination: str | None = None


class PurgeRequest(BaseModel):
    """Optional body of a purge: one destination only, and the reason recorded on each item."""

    model_config = ConfigDict(extra="forbid")

    destination: str | None = Field(default=None, max_length=MAX_DESTINATION_LENGTH)
    reason: str = Field(default="purged", max_length=500)


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
    # What the server enforces now (`PATCH /v1/destinations/{name}`); null if Temporal is down.
    paused: bool | None = None
    submit_rate_in_force: float | None = None
    poll_rate_in_force: float | None = None


class RelayBacklog(BaseModel):
    """The outbox's rows in the transactional outbox not yet relayed."""

    pending: int
    refused: int
    # Seconds since the oldest pending row was committed (0: none pending).
    lag_s: float


class OutboxStats(BaseModel):
    """An outbox's item counts by status, and the destinations items can go to."""

    outbox: str
    counts: dict[str, int]
    total: int
    destinations: list[DestinationInfo]
    relay: RelayBacklog | None = None


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
