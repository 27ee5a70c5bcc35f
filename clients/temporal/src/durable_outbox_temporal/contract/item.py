"""The outbox item workflow's contract: its names, its typed inputs and outputs, its errors.

Workflows, activities, the public client, the API and the read model all import this module and
it imports nothing of ours. Plain data only, so the workflow can import it through the sandbox
and the API can serialise it. `OutboxItemView` is the one definition of an item's public fields:
the read-model table and the API's item response are derived from it.
"""

# No `from __future__ import annotations` here: Temporal's converter calls get_type_hints on
# every dataclass it decodes, and real annotations spare it evaluating strings each time.
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal

from annotated_types import Ge, Gt, Le, MaxLen
from temporalio.converter import PayloadConverter

from durable_outbox_temporal.contract.limits import (
    MAX_DESTINATION_LENGTH,
    MAX_ITEM_ID_LENGTH,
    MAX_KEY_LENGTH,
    MAX_OUTBOX_LENGTH,
)

WORKFLOW_TYPE = "OutboxItem"
STATUS_QUERY = "status"
CANCEL_UPDATE = "cancel"
# The same cancel as a signal: recorded by the server even while no worker runs, acted on (with
# the same rule: only a queued item is cancelled) when the workflow next runs.
REQUEST_CANCEL_SIGNAL = "request_cancel"
# A provider's report on one recipient of a sent item (an ACS email delivery report).
DELIVERY_REPORT_SIGNAL = "delivery_report"

SUBMIT_ACTIVITY = "submit_item"
POLL_ACTIVITY = "poll_operation"
# Several items' polls in one activity (bulk mode's `poll_batch`).
POLL_BATCH_ACTIVITY = "poll_operations"
# Several items' submits in one activity (bulk mode's `submit_batch`).
SUBMIT_BATCH_ACTIVITY = "submit_items"
PROJECT_ACTIVITY = "project_item"


class ItemErrorType(StrEnum):
    """`ApplicationError.type` values of the item path; the workflow and client match on them."""

    # A provider failure the next attempt may fix; details are a `DeliveryErrorDetails`.
    TRANSIENT = "TransientDeliveryError"
    # A provider failure retrying cannot fix (4xx other than 408/429, a rejected payload).
    PERMANENT = "PermanentDeliveryError"
    # The item gave up: attempts exhausted, the operation failed or timed out at the provider.
    DELIVERY_FAILED = "DeliveryFailed"
    # The `cancel` update's validator refused: the item is no longer queued.
    CANNOT_CANCEL = "CannotCancel"
    # The endpoint answered 410 Gone: the submit paused the destination (Standard Webhooks'
    # "disable the endpoint"); the item waits for a resume rather than failing or using attempts.
    DESTINATION_GONE = "DestinationGone"
    # The request found its destination's or its key's cap or quota full for longer than its
    # activity could wait (`flowcontrol/caps.py`): the item asks again after the details'
    # `retry_after_s`, without spending an attempt.
    HELD = "FlowHeld"


# A year: reports come within days; a longer window only keeps workflows open for nothing.
MAX_REPORT_WINDOW_S = 365 * 24 * 3600.0

# Field metadata: the longest text a field holds (the read model sizes its column by it).
MAX_LENGTH = "max_length"
# Field metadata: what a field means, for the reference pages (pydantic reads this key too).
DESCRIPTION = "description"


class ItemStatus(StrEnum):
    """Lifecycle of an outbox item: queued -> sending -> sent | failed, or cancelled."""

    QUEUED = "queued"
    SENDING = "sending"
    SENT = "sent"
    FAILED = "failed"
    CANCELLED = "cancelled"
    # Replaced by a later item of its debounce window, which carried it (`superseded_by`).
    SUPERSEDED = "superseded"

    @property
    def is_final(self) -> bool:
        return self in (
            ItemStatus.SENT,
            ItemStatus.FAILED,
            ItemStatus.CANCELLED,
            ItemStatus.SUPERSEDED,
        )


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
    # A provider reported on a recipient; hyphenated because clients script against this name.
    DELIVERY_REPORT = "delivery-report"
    # The endpoint answered 410 Gone and the destination was paused; the item stays queued.
    DESTINATION_GONE = "destination_gone"
    # Its debounce window closed and another item carried it
    # (`durable_outbox_temporal/contract/debounce_rules.py`).
    SUPERSEDED = "superseded"


class OperationStatus(StrEnum):
    """Status of a provider's long-running operation (ACS vocabulary, lower-cased)."""

    NOT_STARTED = "notstarted"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELED = "canceled"


class RecipientStatus(StrEnum):
    """One recipient's fate as the provider reported it (ACS report statuses, snake_case)."""

    PENDING = "pending"  # no report yet
    DELIVERED = "delivered"
    EXPANDED = "expanded"  # a distribution list, expanded to its members
    BOUNCED = "bounced"
    SUPPRESSED = "suppressed"
    FILTERED_SPAM = "filtered_spam"
    QUARANTINED = "quarantined"
    FAILED = "failed"

    @property
    def reached(self) -> bool:
        """The message reached the recipient (or the list that expanded to them)."""
        return self in (RecipientStatus.DELIVERED, RecipientStatus.EXPANDED)

    @property
    def settled(self) -> bool:
        """No later report is expected: a quarantined message may still be released, and an
        expanded list's members may still be reported on."""
        return self not in (
            RecipientStatus.PENDING,
            RecipientStatus.EXPANDED,
            RecipientStatus.QUARANTINED,
        )


class DeliveryOutcome(StrEnum):
    """An item's delivery across its recipients (the lists' `delivery` filter)."""

    PENDING = "pending"  # some recipient has no report yet, none failed
    DELIVERED = "delivered"  # every recipient was reached
    BOUNCED = "bounced"  # some recipient was not: bounced, suppressed, spam, quarantined, failed


@dataclass
class Recipient:
    """One recipient of an item and what the provider last reported about it."""

    address: str
    status: RecipientStatus = RecipientStatus.PENDING
    detail: str | None = None
    # When the provider attempted delivery (the report's own time, not when it arrived).
    at: datetime | None = None


@dataclass
class DeliveryReport:
    """Input of the `delivery_report` signal: the provider's report on one recipient."""

    # The provider's id of the sent message (ACS: the operation id); a report for another
    # message (an earlier generation's) changes nothing.
    message_id: str
    recipient: str
    status: RecipientStatus
    at: datetime
    detail: str | None = None
    # The event's own id at the provider, for logs.
    report_id: str | None = None


def apply_delivery_report(recipients: list[Recipient], report: DeliveryReport) -> Recipient | None:
    """Apply `report` to its recipient (added if unknown); the recipient if it changed, else None.

    The newest report by its own time wins, ties broken by status then detail: a total order,
    so the same reports in any order, any number of times, end in the same state.
    """
    address = report.recipient.casefold()
    recipient = next((r for r in recipients if r.address.casefold() == address), None)
    if recipient is None:
        recipient = Recipient(address=report.recipient)
        recipients.append(recipient)
    elif recipient.at is not None and _report_order(
        report.at, report.status, report.detail
    ) <= _report_order(recipient.at, recipient.status, recipient.detail):
        return None
    recipient.status, recipient.detail, recipient.at = report.status, report.detail, report.at
    return recipient


def report_event_detail(recipient: Recipient) -> str:
    """The detail of the `delivery-report` event a report that changed `recipient` records."""
    detail = f"{recipient.address}: {recipient.status.value}"
    if recipient.detail:
        detail += f" ({recipient.detail})"
    return detail


_STATUS_ORDER = {status: rank for rank, status in enumerate(RecipientStatus)}


def _report_order(
    at: datetime, status: RecipientStatus, detail: str | None
) -> tuple[datetime, int, str]:
    return at, _STATUS_ORDER[status], detail or ""


def delivery_outcome(recipients: Sequence[Recipient]) -> DeliveryOutcome | None:
    """The item's delivery summary; None when nothing reports on its recipients."""
    if not recipients:
        return None
    statuses = {recipient.status for recipient in recipients}
    if any(not status.reached and status is not RecipientStatus.PENDING for status in statuses):
        return DeliveryOutcome.BOUNCED
    if RecipientStatus.PENDING in statuses:
        return DeliveryOutcome.PENDING
    return DeliveryOutcome.DELIVERED


# The longest `poll_interval_s` a `poll_in_submit` destination may have: the submit activity
# waits that long before its poll, holding a worker's activity slot (and a worker killed meanwhile
# delays the item by the activity's timeout).
POLL_IN_SUBMIT_MAX_INTERVAL_S = 1.0


@dataclass
class DeliveryPolicy:
    """A destination's delivery settings, snapshotted into the workflow input at enqueue time.

    The one place the policy's defaults and bounds live: the destinations file is validated
    against them. The workflow only ever reads the snapshot, so a config change never makes a
    running workflow non-deterministic; new items pick up new values.
    """

    destination: str
    submit_task_queue: str
    poll_task_queue: str
    max_attempts: Annotated[int, Ge(1), Le(1000)] = field(
        default=8,
        metadata={
            DESCRIPTION: "Submit attempts before the item fails; an enqueue may lower it for its"
            " item."
        },
    )
    backoff_initial_s: Annotated[float, Gt(0)] = field(
        default=1.0,
        metadata={
            DESCRIPTION: "Delay before the first retry, in seconds (a provider's `Retry-After`"
            " overrides the backoff)."
        },
    )
    backoff_multiplier: Annotated[float, Ge(1)] = field(
        default=2.0,
        metadata={DESCRIPTION: "Each retry's delay is the previous one's times this."},
    )
    backoff_max_s: Annotated[float, Gt(0)] = field(
        default=300.0, metadata={DESCRIPTION: "Longest delay between retries, in seconds."}
    )
    backoff_jitter: Annotated[float, Ge(0), Le(1)] = field(
        default=0.2,
        metadata={
            DESCRIPTION: "Fraction of the backoff added at random, so retries of many items do"
            " not stampede together."
        },
    )
    poll_interval_s: Annotated[float, Gt(0)] = field(
        default=2.0,
        metadata={DESCRIPTION: "Delay before an operation's first poll, in seconds."},
    )
    poll_backoff_multiplier: Annotated[float, Ge(1)] = field(
        default=1.5,
        metadata={DESCRIPTION: "Each poll's delay is the previous one's times this."},
    )
    poll_interval_max_s: Annotated[float, Gt(0)] = field(
        default=60.0, metadata={DESCRIPTION: "Longest delay between polls, in seconds."}
    )
    poll_deadline_s: Annotated[float, Gt(0)] = field(
        default=3600.0,
        metadata={
            DESCRIPTION: "An operation still running this long after it started fails the item."
        },
    )
    submit_timeout_s: Annotated[float, Gt(0)] = field(
        default=30.0,
        metadata={DESCRIPTION: "Longest one submit activity may run, in seconds."},
    )
    poll_timeout_s: Annotated[float, Gt(0)] = field(
        default=30.0,
        metadata={DESCRIPTION: "Longest one poll activity may run, in seconds."},
    )
    report_window_s: Annotated[float, Ge(0), Le(MAX_REPORT_WINDOW_S)] = field(
        default=72 * 3600.0,
        metadata={
            DESCRIPTION: "How long a sent item keeps listening for its recipients' delivery"
            " reports, in seconds (0: not at all); a report after it is recorded in the item's"
            " read-model row. Unset on a destination without `events_secret` (it takes no"
            " reports): 0; on one in bulk mode: 60."
        },
    )
    # What `halt` means with `submit`: docs/explanation/ordering-lanes.md.
    order: Literal["end", "submit"] = field(
        default="end",
        metadata={
            DESCRIPTION: "Ordering lanes: `end` submits the next item of a key once the one"
            " before has ended (sent or failed); `submit` once the one before was accepted by"
            " the provider, its polls running alongside (an operation that then fails fails"
            " that item only: the lane has gone on)."
        },
    )
    # When to choose `poll_in_submit`: docs/how-to/configure.md. The first polls then come out of
    # the submit queue's rate, and the poll queue runs `poll_rate - submit_rate`
    # (`durable_outbox_temporal.destinations`).
    poll_in_submit: bool = field(
        default=False,
        metadata={
            DESCRIPTION: "The submit activity makes the operation's first poll itself,"
            " `poll_interval_s` after the submit: one activity per item instead of two where"
            " operations finish fast. Needs item mode, `poll_rate` above `submit_rate` and"
            f" `poll_interval_s` of at most {POLL_IN_SUBMIT_MAX_INTERVAL_S:g} s."
        },
    )

    def longest_delivery_s(self, max_retry_after_s: float = 0.0) -> float:
        """The longest an item may take from its first submit until its workflow has ended:
        every attempt's submit at its timeout, every wait before a retry at the longer of the
        retry schedule's (jitter at its top) and the provider's longest `Retry-After`, the
        operation's poll deadline and last poll, then the report window (a `sent` item still
        records its recipients' reports until it closes). Retention is refused shorter than
        this (docs/how-to/retention.md)."""
        waits = sum(
            max(self.backoff_s(n) * (1 + self.backoff_jitter), max_retry_after_s)
            for n in range(1, self.max_attempts)
        )
        return (
            self.max_attempts * self.submit_timeout_s
            + waits
            + self.poll_deadline_s
            + self.poll_timeout_s
            + self.report_window_s
        )

    def backoff_s(self, attempts: int) -> float:
        """The wait after the `attempts`-th failed submit (1: the first) before the next, before
        its jitter (up to `backoff_jitter` more): the retry schedule
        (docs/reference/retry-schedule.md)."""
        return min(
            self.backoff_initial_s * self.backoff_multiplier ** (attempts - 1), self.backoff_max_s
        )


# The policy fields a destination configures (the rest name the destination and its queues).
POLICY_SETTINGS = tuple(
    f.name
    for f in dataclasses.fields(DeliveryPolicy)
    if f.name not in ("destination", "submit_task_queue", "poll_task_queue")
)


@dataclass
class DebounceSpec:
    """How an item coalesces with the others of its debounce key at its destination
    (`durable_outbox_temporal/contract/debounce_rules.py`): its window, its mode and its cap from
    the window's opening."""

    key: str
    window_s: float
    max_wait_s: float
    # `latest`: the last item's payload goes; `collect`: a JSON array of every payload.
    mode: Literal["latest", "collect"] = "latest"


@dataclass
class ItemEvent:
    """One entry of an item's append-only history; `seq` is dense per item, starting at 1."""

    seq: int
    type: ItemEventType = field(metadata={MAX_LENGTH: 32})
    status: ItemStatus = field(metadata={MAX_LENGTH: 16})
    at: datetime = field()
    attempt: int = 0
    detail: str | None = None
    # The provider's own code for a failure (ACS `error.code`), to filter and alert on by cause.
    error_code: str | None = None


@dataclass
class OutboxItemState:
    """The item's whole mutable state; carried verbatim across continue-as-new.

    Fields that share a name with `OutboxItemView` are what the view shows of the state.
    """

    started: bool = False
    status: ItemStatus = ItemStatus.QUEUED
    attempts: int = 0
    last_error: str | None = None
    last_error_code: str | None = None
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
    recipients: list[Recipient] = field(default_factory=list)
    # The item that carried this one out of its debounce window (status `superseded`).
    superseded_by: str | None = None
    # Sequence of the newest event; a redriven item continues its predecessor's numbering.
    last_event_seq: int = 0
    # Events not yet written to the read model (cleared by each successful projection).
    events: list[ItemEvent] = field(default_factory=list)
    # When this generation's first submit attempt was made (`SubmitRequest.first_submitted_at`).
    first_submitted_at: datetime | None = None
    # The read model may hold events past `last_event_seq`, written by an activity whose outcome
    # the workflow never took (a submit the workflow tries again in a new activity, a poll taken
    # back while its server retry waited out its backoff): the next activity numbers its events
    # after them whatever its attempt (`activities.delivery_projection`). Cleared once a poll's
    # transition is taken.
    rows_may_lead: bool = False


@dataclass
class NewItem:
    """One item to enqueue as its caller describes it (the REST body, `OutboxClient.enqueue`'s
    arguments); `OutboxClient.new_item` checks it and builds its `OutboxItemInput`."""

    destination: str
    payload: dict[str, Any]
    # The idempotency key: a repeat is the same item.
    key: str
    # Deliver strictly after the outbox's earlier items with this key (its ordering lane).
    ordering_key: str | None = None
    not_before: datetime | None = None
    # Lowers the destination's attempt limit for this item.
    max_attempts: int | None = None
    # 1 (first) to 5 (last) under a backlog; None: 3.
    priority: int | None = None
    # Whose share of the destination's caps and quotas it counts in (`flowcontrol/caps.py`).
    concurrency_key: str | None = None
    # Its debounce window (`durable_outbox_temporal/contract/debounce_rules.py`): key, quiet
    # seconds, mode, cap.
    debounce_key: str | None = None
    debounce_s: float | None = None
    debounce_mode: str | None = None
    max_wait_s: float | None = None
    # Whom the item is about, so everything about them can be erased at once (`EraseBatch`);
    # the enqueuer with the read model keeps its keyed digest, never the subject itself.
    subject: str | None = None


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
    # How many times the item was redriven; each generation has its own provider key.
    generation: int = 0
    # Whether the workflow upserts `OutboxStatus = 'sending'` (one more billable action and
    # visibility write per item). Items started by this version say no: `OutboxStatus` is set at
    # start and upserted once more at the end. The default is what items started before it did,
    # so their recorded histories replay unchanged.
    upsert_sending: bool = True
    # Whether the submit and poll activities write the transitions they cause to the read model
    # (in the step that already does I/O) instead of a local activity per transition each. The
    # default is what items started before it did. An activity with no read model (an
    # activities-only worker) leaves its transition to the workflow's local activity.
    activities_project: bool = False
    # Whether the enqueuer wrote the `queued` row itself (`transitions.enqueued`): the workflow
    # then records the event at `enqueued_at` and leaves it to the first submit's projection.
    enqueue_projected: bool = False
    # 1 (first) to 5 (last) under a backlog (`durable_outbox_temporal/contract/priority.py`); None:
    # the default, 3.
    priority: int | None = None
    # Whose share of the destination's caps and quotas the item counts in: a tenant, a
    # customer (`flowcontrol/caps.py`); None: only the destination's own.
    concurrency_key: str | None = None
    # Coalesce with the destination's other items of this debounce key
    # (`durable_outbox_temporal/contract/debounce_rules.py`): the item waits in its key's window
    # instead of going at once.
    debounce: DebounceSpec | None = None
    # Bulk mode: the destination's shard count the item was routed by (`shards.Shards`, set at
    # its hand-over). Cancels and reports go by it, so they reach the shard that holds the item
    # whatever count is configured when they come; None: item mode, or an item handed over
    # before it was recorded (routed by the count configured then).
    shards: int | None = None

    def summary(self) -> str:
        """The workflow's static summary in the Web UI: where it goes, to whom, its key."""
        recipient = ""
        recipients = self.payload.get("recipients")
        if isinstance(recipients, dict) and recipients.get("to"):
            first = recipients["to"][0]
            if isinstance(first, dict) and "address" in first:
                recipient = f" to {first['address']}"
        lane = f", lane {self.ordering_key}" if self.ordering_key is not None else ""
        return (
            f"Outbox {self.outbox}: deliver{recipient} via {self.destination}"
            f" (key {self.key}{lane})"
        )


@dataclass
class OutboxItemView:
    """What the status query, the API and the read model show of one item.

    The single definition of an item's public fields: add a field here (and, when the workflow
    changes it, to `OutboxItemState` under the same name) and the read-model table (after a
    migration) and the API response follow.
    """

    id: str = field(metadata={MAX_LENGTH: MAX_ITEM_ID_LENGTH})
    outbox: str = field(metadata={MAX_LENGTH: MAX_OUTBOX_LENGTH})
    key: str = field(metadata={MAX_LENGTH: MAX_KEY_LENGTH})
    destination: str = field(metadata={MAX_LENGTH: MAX_DESTINATION_LENGTH})
    status: ItemStatus = field(metadata={MAX_LENGTH: 16})
    attempts: int = 0
    max_attempts: int = 0
    last_error: str | None = None
    # The provider's code for the failure that ended the item (ACS `error.code`), if it gave one.
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
    # Each recipient's fate, from the provider's delivery reports (empty for webhooks).
    recipients: list[Recipient] = field(default_factory=list)
    # The summary lists filter on: pending, delivered or bounced; None without recipients.
    delivery: DeliveryOutcome | None = field(default=None, metadata={MAX_LENGTH: 16})
    # The newest event's seq: the read model's row only ever moves forward in it.
    last_event_seq: int = 0
    # The debounce key of the window the item waits in or ended in (None: it goes on its own, as
    # a window's carrier does once handed over).
    debounce_key: str | None = field(default=None, metadata={MAX_LENGTH: MAX_KEY_LENGTH})
    # The item that carried this one (status `superseded`): its debounce window's delivery.
    superseded_by: str | None = field(default=None, metadata={MAX_LENGTH: MAX_ITEM_ID_LENGTH})
    # Bulk mode: the shard count the item was routed by (`OutboxItemInput.shards`).
    shards: int | None = None

    @classmethod
    def of(cls, item_id: str, item: OutboxItemInput, state: OutboxItemState) -> "OutboxItemView":
        """The view of an item: its identity from the input, its progress from the state."""
        progress = {name: getattr(state, name) for name in _STATE_FIELDS_IN_VIEW}
        # Copies: a view handed to an activity or a query must not change with the state.
        progress["recipients"] = [dataclasses.replace(r) for r in state.recipients]
        return cls(
            id=item_id,
            outbox=item.outbox,
            key=item.key,
            destination=item.destination,
            max_attempts=item.policy.max_attempts,
            ordering_key=item.ordering_key,
            payload_hash=item.payload_hash,
            delivery=delivery_outcome(state.recipients),
            debounce_key=item.debounce.key if item.debounce is not None else None,
            shards=item.shards,
            **progress,
        )


_STATE_FIELDS_IN_VIEW = tuple(
    f.name
    for f in dataclasses.fields(OutboxItemView)
    if f.name in {state_field.name for state_field in dataclasses.fields(OutboxItemState)}
)


@dataclass
class ProjectionContext:
    """The item as the workflow had it when it scheduled a submit or a poll: the activity applies
    the outcome's transition to it (`durable_outbox_temporal.contract.transitions`) and writes the
    projection itself."""

    # The input without its payload (the submit request carries it once).
    item: OutboxItemInput
    state: OutboxItemState


@dataclass
class PollResult:
    """One observation of a long-running operation."""

    status: OperationStatus
    retry_after_s: float | None = None
    error: str | None = None
    error_code: str | None = None
    # As `SubmitResult.projected_at` and `SubmitResult.projected_seq`.
    projected_at: datetime | None = None
    projected_seq: int | None = None


@dataclass
class SubmitRequest:
    """Input of the submit activity."""

    destination: str
    item_id: str
    idempotency_key: str
    payload: dict[str, Any]
    attempt: int
    # Set when the activity projects the transition it causes (`activities_project`).
    projection: ProjectionContext | None = None
    # When set, an accepted operation is polled once by this activity after this many seconds
    # (`SubmitResult.first_poll`) rather than by a poll activity, unless the provider's
    # Retry-After asks for longer.
    first_poll_after_s: float | None = None
    # A lane's run of items in one batch: the activity submits them one after another, each only
    # once the one before went through (was delivered; or was accepted, with `accepted_goes_on`),
    # and leaves the rest untried after one that did not.
    sequence: str | None = None
    accepted_goes_on: bool = False
    # The item's `concurrency_key`: its share of the caps and quotas (`flowcontrol/caps.py`).
    concurrency_key: str | None = None
    # When this generation's first submit attempt was made, on the workflow's clock: the same on
    # every retry, so a provider's dedupe window (ACS email's `Repeatability-First-Sent`, ACS SMS's
    # `repeatabilityFirstSent`) is reckoned
    # from the first send, not from the retry. None: unknown (a caller that does not track it).
    first_submitted_at: datetime | None = None


@dataclass
class SubmitResult:
    """The provider either delivered synchronously or accepted a long-running operation."""

    delivered: bool
    operation_url: str | None = None
    retry_after_s: float | None = None
    provider_message_id: str | None = None
    # Who the provider will report on (ACS: the to, cc and bcc addresses); empty if nobody.
    recipients: list[str] = field(default_factory=list)
    # Recipients whose fate the submit's answer already tells (ACS SMS: a number it refused).
    recipient_results: list[Recipient] = field(default_factory=list)
    # The time the activity applied the transition at, when it wrote its projection (None: it
    # did not, and the workflow projects it).
    projected_at: datetime | None = None
    # The seq of this outcome's last event when an earlier attempt of the activity had written
    # its own outcome's events first: the retry numbers its events after those, and so does the
    # workflow. None when the events take the numbers the workflow would give them.
    projected_seq: int | None = None
    # The operation's first poll, made by the submit activity (`SubmitRequest.first_poll_after_s`).
    first_poll: PollResult | None = None
    # The operation was not sent by this attempt but found by looking it up: an earlier
    # attempt's send whose answer was lost, past the provider's dedupe window (the reconcile
    # step, docs/explanation/provider-dedupe.md).
    found_by_lookup: bool = False


@dataclass
class PollRequest:
    """Input of the poll activity."""

    destination: str
    item_id: str
    operation_url: str
    # Set when the activity projects the transition it causes (`activities_project`).
    projection: ProjectionContext | None = None
    # The item's `concurrency_key`: its share of the caps (`flowcontrol/caps.py`).
    concurrency_key: str | None = None


@dataclass
class DeliveryErrorDetails:
    """The details of a submit or poll failure (the first detail of its `ApplicationError`)."""

    # The provider's own `Retry-After`: the next attempt never comes earlier.
    retry_after_s: float | None = None
    status_code: int | None = None
    # The provider's own error code from the response body (ACS `error.code`), if any.
    error_code: str | None = None

    @classmethod
    def from_details(cls, details: Sequence[Any]) -> "DeliveryErrorDetails":
        """Read the details back from a failure (decoded as plain JSON values); tolerant of none."""
        raw = details[0] if details and isinstance(details[0], dict) else {}
        retry_after_s = raw.get("retry_after_s")
        status_code = raw.get("status_code")
        error_code = raw.get("error_code")
        return cls(
            retry_after_s=float(retry_after_s) if retry_after_s is not None else None,
            status_code=int(status_code) if status_code is not None else None,
            error_code=str(error_code) if error_code is not None else None,
        )


@dataclass
class PollOutcome:
    """One poll of a batch: its result, or the error a single poll activity would have failed
    with (its `ApplicationError` type, message and details)."""

    result: PollResult | None = None
    error_type: str | None = None
    message: str | None = None
    details: DeliveryErrorDetails | None = None


@dataclass
class SubmitOutcome:
    """One submit of a batch, as `PollOutcome` is one poll's."""

    result: SubmitResult | None = None
    error_type: str | None = None
    message: str | None = None
    details: DeliveryErrorDetails | None = None
    # Not sent: an earlier item of its sequence was not delivered (the provider never saw it).
    not_attempted: bool = False


@dataclass
class BatchProgress:
    """The outcomes a batch of submits had when it last heartbeated, by request index: what
    runs it again (the server's next attempt, a worker killed mid-batch, or its workflow's new
    activity once the batch timed out) returns them as they were rather than send those
    requests again. What went after that heartbeat goes again, under the same idempotency keys,
    as any retried submit."""

    outcomes: dict[str, SubmitOutcome] = field(default_factory=dict)

    @staticmethod
    def read(
        details: Sequence[Any], count: int, converter: PayloadConverter
    ) -> dict[int, SubmitOutcome]:
        """The outcomes heartbeat details recorded for a batch of `count` requests, by index;
        none from details of another shape (a request is then sent again)."""
        if not details:
            return {}
        try:
            progress = converter.from_payload(converter.to_payload(details[0]), BatchProgress)
            if not isinstance(progress, BatchProgress):
                return {}
            recorded = {int(index): outcome for index, outcome in progress.outcomes.items()}
        except (TypeError, ValueError, KeyError, AttributeError):
            return {}
        return {index: outcome for index, outcome in recorded.items() if 0 <= index < count}


@dataclass
class CancelRequest:
    """Input of the `cancel` update (and body of the API's cancel); the reason is recorded in the
    item's history."""

    # The API refuses unknown members rather than ignoring them.
    __pydantic_config__: ClassVar[dict[str, Any]] = {"extra": "forbid"}

    reason: Annotated[str, MaxLen(500)] = "cancelled by request"


@dataclass
class ItemProjection:
    """Input of the projection activity: the item's latest view plus events not yet projected."""

    view: OutboxItemView
    events: list[ItemEvent]
    enqueued_at: datetime | None = None
    payload: dict[str, Any] | None = None
