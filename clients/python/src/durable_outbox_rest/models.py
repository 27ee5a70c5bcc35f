"""The API's request and response bodies, as typed models.

They mirror the server's OpenAPI schema (a test in the server's repository compares them) and
accept fields they do not know, so a newer server that adds a field breaks no client. Open
vocabularies (an item's status, a lane's policy) are plain strings for the same reason; the
constants below name today's values.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class ApiModel(BaseModel):
    """Base of every model: unknown fields are kept (`model_extra`), never refused."""

    model_config = ConfigDict(extra="allow")


class ItemStatus:
    """An item's status values: queued -> sending -> sent | failed, or cancelled or
    superseded."""

    QUEUED = "queued"
    SENDING = "sending"
    SENT = "sent"
    FAILED = "failed"
    CANCELLED = "cancelled"
    # Carried by a later item of its debounce window (`superseded_by`).
    SUPERSEDED = "superseded"
    FINAL = frozenset({SENT, FAILED, CANCELLED, SUPERSEDED})


class NewItem(BaseModel):
    """One item to enqueue; in a batch its `idempotency_key` travels in the body."""

    model_config = ConfigDict(extra="forbid")

    destination: str
    payload: dict[str, Any]
    idempotency_key: str | None = None
    ordering_key: str | None = None
    not_before: datetime | None = Field(
        default=None, description="Deliver no earlier than this (give it a time zone)"
    )
    delay_seconds: float | None = None
    concurrency_key: str | None = None
    priority: int | None = Field(default=None, description="1 (first) to 5 (last); unset: 3")
    max_attempts: int | None = None
    # One delivery per window of this key (docs/how-to/debounce.md); needs `debounce_s`.
    debounce_key: str | None = None
    debounce_s: float | None = None
    debounce_mode: str | None = Field(default=None, description="`latest` (default) or `collect`")
    max_wait_s: float | None = None
    # Whom the item is about: `items:erase` with this subject erases it (kept as a keyed digest).
    subject: str | None = None


class Problem(ApiModel):
    """An RFC 9457 problem, as a batch result carries it (a failed call raises instead);
    `code` is stable (`idempotency-conflict`), `type` links to its page."""

    type: str
    code: str
    title: str
    status: int
    detail: str
    instance: str | None = None
    errors: list[dict[str, Any]] | None = None


class ItemLinks(ApiModel):
    """Where to read, follow and act on an item (paths on the API)."""

    self: str
    events: str
    cancel: str
    redrive: str


class Enqueued(ApiModel):
    """An enqueued item (`created`), or the key's existing one (`created` false)."""

    id: str
    outbox: str
    key: str
    created: bool
    status: str
    links: ItemLinks


class BatchResult(ApiModel):
    """One batch item's outcome: `status` is the HTTP status it would have had alone."""

    index: int
    status: int
    item: Enqueued | None = None
    problem: Problem | None = None


class BatchEnqueued(ApiModel):
    """Totals, plus one result per item in request order."""

    created: int
    existing: int
    failed: int
    results: list[BatchResult]


class Recipient(ApiModel):
    """One recipient of an item and what the provider last reported about it."""

    address: str
    status: str = "pending"
    detail: str | None = None
    at: datetime | None = None


class WaitingOn(ApiModel):
    """One thing that holds a queued item, and until when if known."""

    reason: str
    detail: str
    until: datetime | None = None


class Item(ApiModel):
    """An item's status, live from its workflow while it runs (`source`), stored after."""

    id: str
    outbox: str
    key: str
    destination: str
    status: str
    attempts: int = 0
    max_attempts: int = 0
    last_error: str | None = None
    last_error_code: str | None = None
    next_attempt_at: datetime | None = None
    operation_url: str | None = None
    poll_count: int = 0
    created_at: datetime | None = None
    updated_at: datetime | None = None
    finished_at: datetime | None = None
    ordering_key: str | None = None
    payload_hash: str | None = None
    provider_message_id: str | None = None
    recipients: list[Recipient] = Field(default_factory=list)
    delivery: str | None = None
    last_event_seq: int = 0
    debounce_key: str | None = None
    superseded_by: str | None = None
    # Bulk mode: the destination's shard count the item was routed by.
    shards: int | None = None
    payload: dict[str, Any] | None = None
    waiting_on: list[WaitingOn] | None = None
    # When its payload was erased (`DELETE .../payload`), if it was.
    erased_at: datetime | None = None
    # When retention pruned its payload and attempt bodies, if it did (`payload` is then null).
    payload_pruned_at: datetime | None = None
    # The key of the item it replays, and the keys of the items replaying it (one item's GET).
    replay_of: str | None = None
    replays: list[str] | None = None
    source: str
    links: ItemLinks


class ItemPage(ApiModel):
    """One page of items; `next_cursor` asks for the next (None: the last page)."""

    items: list[Item]
    next_cursor: str | None


class CancelRequested(ApiModel):
    """No worker answered in time: the cancel is recorded and applies when one runs the item."""

    id: str
    outbox: str
    key: str
    reason: str
    cancel_requested: bool = True
    links: ItemLinks


class ItemEvent(ApiModel):
    """One transition of an item; `id` is the outbox-wide position."""

    seq: int
    type: str
    status: str
    at: datetime
    attempt: int = 0
    detail: str | None = None
    error_code: str | None = None
    id: int
    item_id: str
    outbox: str


class DeadLetter(ApiModel):
    """A permanently failed item: why, after how many attempts, and whether it was discarded."""

    id: str
    outbox: str
    key: str
    destination: str
    ordering_key: str | None
    attempts: int
    max_attempts: int
    last_error: str | None
    last_error_code: str | None
    created_at: datetime | None
    failed_at: datetime | None
    discarded: bool
    discarded_at: datetime | None = None
    discard_reason: str | None = None
    links: dict[str, str]


class DeadLetterPage(ApiModel):
    """Newest failure first; `next_cursor` asks for the next page (None: the last)."""

    dead_letters: list[DeadLetter]
    next_cursor: str | None


class RedriveBatch(ApiModel):
    """A dead-letter redrive batch: what it selects and how far it is (`done` at the end)."""

    id: str
    outbox: str
    state: str
    destination: str | None
    error_code: str | None
    failed_from: datetime | None
    failed_to: datetime | None
    failed_before: datetime | None
    redriven: int
    skipped: int
    pages: int
    done: bool
    finished_at: datetime | None
    errors: list[str]
    links: dict[str, str]


class QueueRate(ApiModel):
    """One task queue's rate in force (0: paused) and who set it (`api` or `worker`)."""

    rate: float
    source: str


class FlowEvent(ApiModel):
    """One transition of a destination's throttle or circuit."""

    at: datetime
    kind: str
    detail: str
    rate: float | None


class RatePoint(ApiModel):
    """One move of an adaptive rate."""

    at: datetime
    rate: float
    reason: str


class Adaptive(ApiModel):
    """An adaptive destination's rate at work: where it is, its bounds, its newest moves."""

    rate: float
    floor: float
    ceiling: float
    latency_target_s: float
    interval_s: float
    # A rate set by hand holds: the adaptive rate waits until it is lifted.
    released: bool
    history: list[RatePoint]


class Flow(ApiModel):
    """A destination's throttle rule, circuit and adaptive rate at work."""

    storms: int
    factor: float
    circuit: str = "closed"
    opened_at: datetime | None = None
    next_probe_at: datetime | None = None
    probes_failed: int = 0
    last_error: str | None = None
    # Failing since then (no submit succeeded); failing for `disable_after_s`, it is disabled.
    failing_since: datetime | None = None
    disabled_at: datetime | None = None
    adaptive: Adaptive | None = None
    events: list[FlowEvent]


class FlowPolicyField(ApiModel):
    """One flow-control field in force: its value and whether the destinations file or the API
    (`PATCH` with `flow`) set it."""

    value: Any
    source: str
    changed_at: datetime | None = None


class Destination(ApiModel):
    """A destination: its configured rates, the rates in force, pause and circuit state."""

    name: str
    provider: str
    configured_submit_rate: float
    configured_poll_rate: float
    poll_in_submit: bool = False
    submit: QueueRate
    poll: QueueRate
    paused: bool
    pause_reason: str | None
    paused_until: datetime | None = None
    circuit: str = "closed"
    # Disabled after failing too long (or by hand): items wait until it is enabled again.
    disabled: bool = False
    disabled_since: datetime | None = None
    flow: Flow | None = None
    resume_submit_rate: float | None
    resume_poll_rate: float | None
    flow_policy: dict[str, FlowPolicyField] | None = None
    # Requests out now under `max_in_flight`, across every worker (one destination's GET).
    in_flight: int | None = None


class Lane(ApiModel):
    """An ordering lane: its items waiting, its head, whether it is halted and why."""

    id: str
    outbox: str
    ordering_key: str
    status: str
    policy: str
    length: int
    head_key: str | None
    halted_reason: str | None
    halted_at: datetime | None
    sent: int
    failed: int
    cancelled: int
    updated_at: datetime | None
    waiting: list[str] | None = None
    source: str
    links: dict[str, str]


class LanePage(ApiModel):
    """One page of lanes by ordering key; `next_cursor` asks for the next."""

    lanes: list[Lane]
    next_cursor: str | None


class RecordedEvent(ApiModel):
    """One event of an aggregate, as the event store holds it."""

    seq: int
    type: str
    data: dict[str, Any]
    recorded_at: datetime
    actor: str | None = None
    command_id: str | None = None


class CommandResult(ApiModel):
    """A command's events and the aggregate's new version (`duplicate`: an id seen before)."""

    events: list[RecordedEvent]
    version: int
    duplicate: bool = False


class AggregateView(ApiModel):
    """An aggregate's state, version and read models, live from its workflow."""

    type: str
    id: str
    version: int
    state: dict[str, Any]
    views: dict[str, Any]
    updated_at: datetime | None = None
    rejected: int = 0
    effects: dict[str, int] = Field(default_factory=dict)
