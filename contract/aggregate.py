"""The aggregate workflow's contract: names, ids, and its typed inputs and outputs.

Commands, events and state travel as JSON objects (`dict`): the generic workflow hosts any
definition, and a Go or TypeScript service sends the same JSON.
"""

# No `from __future__ import annotations`: Temporal's converter reads these hints at run time.
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from contract.item import MAX_LENGTH
from contract.limits import MAX_KEY_LENGTH

WORKFLOW_TYPE = "Aggregate"
COMMAND_UPDATE = "command"
# The same commands for services that must not wait: recorded even while no worker runs.
COMMAND_SIGNAL = "send_command"
STATE_QUERY = "state"
REJECTED_QUERY = "rejected_commands"
STORE_ACTIVITY = "store_aggregate_events"

# How many recent command ids an aggregate remembers to drop a repeat (carried across
# continue-as-new), and how many rejected signalled commands it keeps for inspection.
DEDUPE_WINDOW = 1000
REJECTED_LOG = 100
MAX_AGGREGATE_ID_LENGTH = MAX_KEY_LENGTH
MAX_AGGREGATE_TYPE_LENGTH = 64
MAX_COMMAND_ID_LENGTH = 200


class AggregateErrorType(StrEnum):
    """`ApplicationError.type` of a refused command; the API maps them to 404, 409 and 422."""

    CONFLICT = "Conflict"  # clashes with the current state, or the expected version
    INVALID = "InvalidCommand"  # can never succeed as given
    UNKNOWN_COMMAND = "UnknownCommand"


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
class RejectedCommand:
    """A signalled (or timer) command that `decide` refused: kept, never dropped silently."""

    request: CommandRequest
    error_type: str
    message: str
    at: datetime


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


@dataclass
class AggregateCarry:
    """Everything an aggregate carries across continue-as-new."""

    state: dict[str, Any]
    version: int
    views: dict[str, Any]
    # Recent command id -> the version its command left the aggregate at.
    seen_commands: dict[str, int] = field(default_factory=dict)
    rejected: list[RejectedCommand] = field(default_factory=list)
    updated_at: datetime | None = None
    unstored: list[RecordedEvent] = field(default_factory=list)


@dataclass
class AggregateInput:
    """Start input of the aggregate workflow (and continue-as-new's, with `carry`)."""

    type: str
    id: str
    carry: AggregateCarry | None = None


@dataclass
class StoreEvents:
    """Input of the event-store activity: events to write once each, and the newest state."""

    type: str
    id: str
    events: list[RecordedEvent]
    version: int
    state: dict[str, Any]
    updated_at: datetime
