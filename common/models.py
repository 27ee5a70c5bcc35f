"""Dataclasses that cross the workflow / activity / API boundary.

Plain data only (no I/O, no Temporal imports), so workflows can import it
through the sandbox pass-through and the API can serialise it.
"""

# No `from __future__ import annotations` here: Temporal's converter calls get_type_hints on
# every dataclass it decodes, and real annotations spare it evaluating strings each time.
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any


class ItemStatus(StrEnum):
    """Lifecycle of an outbox item: queued -> sending -> sent | failed, or cancelled."""

    QUEUED = "queued"
    SENDING = "sending"
    SENT = "sent"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def is_final(self) -> bool:
        return self in (ItemStatus.SENT, ItemStatus.FAILED, ItemStatus.CANCELLED)


class ItemEventType(StrEnum):
    """One transition or notable step of an item, as recorded in its event history."""

    ENQUEUED = "enqueued"
    REDRIVEN = "redriven"
    SUBMIT_FAILED = "submit_failed"
    ACCEPTED = "accepted"
    POLLED = "polled"
    SENT = "sent"
    FAILED = "failed"
    CANCELLED = "cancelled"


class OperationStatus(StrEnum):
    """Status of a provider's long-running operation (ACS vocabulary, lower-cased)."""

    NOT_STARTED = "notstarted"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELED = "canceled"


@dataclass
class DeliveryPolicy:
    """A destination's delivery settings, snapshotted into the workflow input at enqueue time.

    The workflow only ever reads this snapshot, so a config change never makes a running
    workflow non-deterministic; new items pick up new values.
    """

    destination: str
    submit_task_queue: str
    poll_task_queue: str
    max_attempts: int = 8
    backoff_initial_s: float = 1.0
    backoff_multiplier: float = 2.0
    backoff_max_s: float = 300.0
    # Fraction of the backoff added at random, so retries of many items do not stampede together.
    backoff_jitter: float = 0.2
    poll_interval_s: float = 2.0
    poll_backoff_multiplier: float = 1.5
    poll_interval_max_s: float = 60.0
    poll_deadline_s: float = 3600.0
    submit_timeout_s: float = 30.0
    poll_timeout_s: float = 30.0


@dataclass
class ItemEvent:
    """One entry of an item's append-only history; `seq` is dense per item, starting at 1."""

    seq: int
    type: ItemEventType
    status: ItemStatus
    at: datetime
    attempt: int = 0
    detail: str | None = None


@dataclass
class OutboxItemState:
    """The item's whole mutable state; carried verbatim across continue-as-new."""

    started: bool = False
    status: ItemStatus = ItemStatus.QUEUED
    attempts: int = 0
    last_error: str | None = None
    last_error_type: str | None = None
    next_attempt_at: datetime | None = None
    operation_url: str | None = None
    operation_started_at: datetime | None = None
    poll_count: int = 0
    created_at: datetime | None = None
    updated_at: datetime | None = None
    finished_at: datetime | None = None
    provider_message_id: str | None = None
    cancel_requested: bool = False
    cancel_reason: str | None = None
    # Sequence of the newest event; a redriven item continues its predecessor's numbering.
    last_event_seq: int = 0
    # Events not yet written to the read model (cleared by each successful projection).
    events: list[ItemEvent] = field(default_factory=list)


@dataclass
class OutboxItemInput:
    """Everything needed to deliver one item; also the continue-as-new carrier (`state`)."""

    outbox: str
    key: str
    destination: str
    payload: dict[str, Any]
    payload_hash: str
    policy: DeliveryPolicy
    ordering_key: str | None = None
    enqueued_at: datetime | None = None
    not_before: datetime | None = None
    state: OutboxItemState | None = None


@dataclass
class OutboxItemView:
    """What the status query, the API and the read model show of one item."""

    id: str
    outbox: str
    key: str
    destination: str
    status: ItemStatus
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
    payload_hash: str | None = None
    provider_message_id: str | None = None
    last_event_seq: int = 0


@dataclass
class SubmitRequest:
    """Input of the submit activity."""

    destination: str
    item_id: str
    idempotency_key: str
    payload: dict[str, Any]
    attempt: int


@dataclass
class SubmitResult:
    """The provider either delivered synchronously or accepted a long-running operation."""

    delivered: bool
    operation_url: str | None = None
    retry_after_s: float | None = None
    provider_message_id: str | None = None


@dataclass
class PollRequest:
    """Input of the poll activity."""

    destination: str
    item_id: str
    operation_url: str


@dataclass
class PollResult:
    """One observation of a long-running operation."""

    status: OperationStatus
    retry_after_s: float | None = None
    error: str | None = None


@dataclass
class CancelRequest:
    """Input of the `cancel` update."""

    reason: str = "cancelled by request"


@dataclass
class CancelResult:
    """Output of the `cancel` update: the view after the cancel took effect."""

    view: OutboxItemView


@dataclass
class ItemProjection:
    """Input of the projection activity: the item's latest view plus events not yet projected."""

    view: OutboxItemView
    events: list[ItemEvent]
    enqueued_at: datetime | None = None
    payload: dict[str, Any] | None = None
