"""The aggregate workflow's contract: names, ids, and its typed inputs and outputs.

Commands, events and state travel as JSON objects (`dict`): the generic workflow hosts any
definition, and a Go or TypeScript service sends the same JSON.
"""

# No `from __future__ import annotations`: Temporal's converter reads these hints at run time.
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from durable_outbox_temporal.contract.item import MAX_LENGTH
from durable_outbox_temporal.contract.limits import MAX_KEY_LENGTH

WORKFLOW_TYPE = "Aggregate"
COMMAND_UPDATE = "command"
# Many commands in one update, each with its own outcome: how a client with many callers stays
# within Temporal's 10 updates in flight per workflow (docs/decisions/aggregate-command-batches.md).
COMMANDS_UPDATE = "commands"
# The same commands for services that must not wait: recorded even while no worker runs.
COMMAND_SIGNAL = "send_command"
COMMANDS_SIGNAL = "send_commands"
STATE_QUERY = "state"
REJECTED_QUERY = "rejected_commands"
STORE_ACTIVITY = "store_aggregate_events"
# An idle aggregate's run stores what it carries and ends (passivation); the next command's new
# run loads it first (docs/decisions/aggregate-passivation.md).
PASSIVATE_ACTIVITY = "passivate_aggregate"
RESUME_ACTIVITY = "resume_aggregate"
# The worker's counters of passivation (through the SDK's metric meter: not counted on replay),
# each with the attribute `aggregate_type`; the resumes also with `source`.
RUNS_ENDED_METRIC = (
    "outbox_aggregate_runs_ended",
    "Aggregate runs that ended idle, their carry stored for the next run (passivation).",
)
RUNS_RESUMED_METRIC = (
    "outbox_aggregate_runs_resumed",
    "New aggregate runs that loaded a stored aggregate, by `source`: carry (what its last run"
    " stored as it ended idle), state (the stored state alone: a run that ended otherwise),"
    " erased (its data was erased while it had no run).",
)
# A page of an aggregate's stored events: a run that resumes without a carry refolds its views.
EVENTS_PAGE_ACTIVITY = "read_aggregate_events"
# The effect ledger (the process manager): query it, retry a failed effect, run one effect.
EFFECTS_QUERY = "effects"
RETRY_EFFECT_UPDATE = "retry_effect"
EFFECT_ACTIVITY = "execute_effect"

# How many recent command ids an aggregate remembers to drop a repeat (carried across
# continue-as-new), and how many rejected signalled commands it keeps for inspection.
DEDUPE_WINDOW = 1000
REJECTED_LOG = 100
# Done effects kept in the ledger (pending and failed ones are always kept): enough to inspect
# recent history; the outbox item or target aggregate keeps the rest.
DONE_EFFECTS_KEPT = 200
MAX_AGGREGATE_ID_LENGTH = MAX_KEY_LENGTH
MAX_AGGREGATE_TYPE_LENGTH = 64
MAX_COMMAND_ID_LENGTH = 200
# The most commands one `commands` update or `send_commands` signal carries.
MAX_COMMAND_BATCH = 100


class AggregateErrorType(StrEnum):
    """`ApplicationError.type` of a refused command; the API maps them to 404, 409 and 422."""

    CONFLICT = "Conflict"  # clashes with the current state, or the expected version
    INVALID = "InvalidCommand"  # can never succeed as given
    UNKNOWN_COMMAND = "UnknownCommand"
    UNKNOWN_EFFECT = "UnknownEffect"  # retry_effect for a key the ledger does not hold
    # A command id already used by another command or payload (the API's 409).
    IDEMPOTENCY_CONFLICT = "IdempotencyConflict"


class EffectStatus(StrEnum):
    PENDING = "pending"  # waiting for, or in, its execution
    DONE = "done"
    FAILED = "failed"  # retries spent or refused for good; an operator may retry it


class EffectErrorType(StrEnum):
    """`ApplicationError.type` of an effect execution that must not be retried as it is."""

    REFUSED = "EffectRefused"  # the outbox or the target aggregate refused it


def aggregate_workflow_id(aggregate_type: str, aggregate_id: str) -> str:
    """The one workflow of an aggregate: `agg/{type}/{id}`."""
    return f"agg/{aggregate_type}/{aggregate_id}"


@dataclass
class CommandRequest:
    """One command: update `command`, signal `send_command`, or a timer firing."""

    name: str
    payload: dict[str, Any] = field(default_factory=dict)
    # Repeats of one id change nothing (the first outcome is answered); required on signals.
    command_id: str | None = None
    # Refuse (409) unless the aggregate is at this version: optimistic concurrency.
    expected_version: int | None = None
    # Who sent it, recorded with its events.
    actor: str | None = None
    # Payload fields the sender fills with fresh random values (an effect's generated tokens):
    # a repeat of the command id may differ there and still be the same command.
    generated_fields: list[str] = field(default_factory=list)


@dataclass
class RecordedEvent:
    """One event as the aggregate's history holds it; `seq` is dense per aggregate from 1."""

    seq: int
    type: str = field(metadata={MAX_LENGTH: 200})
    data: dict[str, Any]
    recorded_at: datetime
    actor: str | None = field(default=None, metadata={MAX_LENGTH: 200})
    command_id: str | None = field(default=None, metadata={MAX_LENGTH: MAX_COMMAND_ID_LENGTH})


@dataclass
class CommandResult:
    """A command's outcome: the events it appended (none for a no-op or a repeat) and the
    aggregate's version after it."""

    events: list[RecordedEvent]
    version: int
    duplicate: bool = False


@dataclass
class CommandBatch:
    """Commands run in order, each as if sent alone: its own decide, dedupe and refusal."""

    commands: list[CommandRequest]


@dataclass
class CommandOutcome:
    """One command's outcome in a batch: its result, or why it was refused."""

    result: CommandResult | None = None
    # An `AggregateErrorType` and the refusal's message when the command was refused.
    error_type: str | None = None
    message: str | None = None
    # The domain's own reason (its `DomainError` class, `SeatTaken`), when it gave one.
    reason: str | None = None


@dataclass
class CommandBatchResult:
    """The outcomes of a `CommandBatch`, in its order."""

    outcomes: list[CommandOutcome]


@dataclass
class RejectedCommand:
    """A signalled (or timer) command that `decide` refused: kept, never dropped silently."""

    request: CommandRequest
    error_type: str
    message: str
    at: datetime


@dataclass
class EffectRecord:
    """One entry of an aggregate's effect ledger, keyed by the effect's idempotency key."""

    key: str
    event_seq: int
    name: str = field(metadata={MAX_LENGTH: 100})
    # `enqueue_item`, `issue_command` or `call_provider`; `action` holds its fields as JSON.
    kind: str
    action: dict[str, Any]
    status: str = EffectStatus.PENDING
    # Executions started (an operator's retry starts another); each retries on its own.
    executions: int = 0
    error: str | None = None
    # What the execution produced: the item id, the command's version, the provider's answer.
    result: dict[str, Any] | None = None
    created_at: datetime | None = None
    finished_at: datetime | None = None


@dataclass
class EffectExecution:
    """Input of the effect activity: one effect of one aggregate."""

    aggregate_type: str
    aggregate_id: str
    key: str
    kind: str
    action: dict[str, Any]


@dataclass
class AggregateView:
    """What the state query and the API show: state, version and per-aggregate read models."""

    type: str
    id: str
    version: int
    state: dict[str, Any]
    views: dict[str, Any]
    updated_at: datetime | None = None
    rejected: int = 0
    # The effect ledger's counts by status (the entries: query `effects`).
    effects: dict[str, int] = field(default_factory=dict)


@dataclass
class AggregateCarry:
    """Everything an aggregate carries across continue-as-new."""

    state: dict[str, Any]
    version: int
    views: dict[str, Any]
    # Recent command id -> the version its command left the aggregate at.
    seen_commands: dict[str, int] = field(default_factory=dict)
    # Recent command id -> a hash of its command (name and payload); ids remembered before the
    # hashes were kept have none, and a repeat of those is taken as the same command.
    seen_command_hashes: dict[str, str] = field(default_factory=dict)
    rejected: list[RejectedCommand] = field(default_factory=list)
    updated_at: datetime | None = None
    unstored: list[RecordedEvent] = field(default_factory=list)
    # The effect ledger, oldest first.
    effects: list[EffectRecord] = field(default_factory=list)


@dataclass
class AggregateInput:
    """Start input of the aggregate workflow (and continue-as-new's, with `carry`)."""

    type: str
    id: str
    carry: AggregateCarry | None = None
    # Where the effect activity runs (the operations worker's queue); the default queue if None.
    operations_task_queue: str | None = None
    # Seconds idle (no command, nothing pending) after which the run stores its carry and ends;
    # 0 or None: it never does. Set by whoever starts the run (from the definition), carried.
    passivate_after_s: float | None = None


@dataclass
class StoreEvents:
    """Input of the event-store activity: events to write once each, and the newest state."""

    type: str
    id: str
    events: list[RecordedEvent]
    version: int
    state: dict[str, Any]
    updated_at: datetime


@dataclass
class PassivateAggregate:
    """Input of the passivation activity: what an idle run carries, stored for its next run."""

    type: str
    id: str
    carry: AggregateCarry
    passivated_at: datetime


@dataclass
class ResumedAggregate:
    """What a new run of an aggregate the store holds starts from (the resume activity)."""

    # The carry its last run stored as it ended; None if none (or one older than the store).
    carry: AggregateCarry | None
    # The stored version and state, for a store without a current carry.
    version: int
    state: dict[str, Any]
    updated_at: datetime | None = None
    # The aggregate's data was erased while it had no running workflow: its state is gone.
    erased: bool = False


def effect_counts(effects: list[EffectRecord]) -> dict[str, int]:
    """An effect ledger's counts by status, every status named."""
    counts = {status.value: 0 for status in EffectStatus}
    for record in effects:
        counts[record.status] += 1
    return counts


# What an event's data (and the stored state) reads as once its aggregate's data was erased
# (crypto-shredded: docs/decisions/aggregate-crypto-shredding.md). No event field can be named
# so: a definition's fields are Python identifiers.
SHREDDED_FIELD = "$shredded"
SHREDDED: dict[str, Any] = {SHREDDED_FIELD: True}


def is_shredded(data: dict[str, Any]) -> bool:
    """Whether an event's data (or a stored state) is the marker of erased data."""
    return data.get(SHREDDED_FIELD) is True
