"""The ordering lane's contract: its names, its signal, update and query payloads, its view.

A lane (`lane/{outbox}/{ordering_key}`) delivers the items of one ordering key strictly one
after another, in the order it received them. Items reach it by signal-with-start; each runs as
a child item workflow under the item's own id, so it keeps its own history. Plain data only, so
the workflow, the client, the API and the read model can all import it.
"""

# No `from __future__ import annotations`: Temporal's converter reads real annotations.
import json
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, ClassVar

from annotated_types import MaxLen

from contract.item import (
    MAX_LENGTH,
    DeliveryPolicy,
    ItemProjection,
    OutboxItemInput,
    OutboxItemView,
)
from contract.limits import MAX_ITEM_ID_LENGTH, MAX_KEY_LENGTH, MAX_OUTBOX_LENGTH

LANE_WORKFLOW_TYPE = "OutboxLane"
# Signal: append one item (the only way items enter a lane; sent with signal-with-start).
APPEND_SIGNAL = "append"
# Signals an operator sends to a halted lane: run the failed head item again, or move past it.
REDRIVE_HEAD_SIGNAL = "redrive_head"
SKIP_HEAD_SIGNAL = "skip_head"
# Update: take waiting items out of the lane (cancel one, or purge), answered with what it took.
REMOVE_UPDATE = "remove"
# Queries: the lane's view, and what became of one append.
LANE_QUERY = "lane"
APPEND_OUTCOME_QUERY = "append_outcome"

PROJECT_LANE_ACTIVITY = "project_lane"

# Waiting items listed in the lane's view and current details (the rest are only counted).
LANE_VIEW_WAITING = 20
# A lane carries its waiting items' keys and payloads across continue-as-new in one Temporal
# payload, which the server caps at 2 MB: past this many bytes waiting, appends are refused
# (429) until the lane drains. The margin covers appends racing the check.
LANE_MAX_WAITING_BYTES = 1_000_000
# Appends and keys a lane remembers, to answer "what became of my append" and spot repeats.
LANE_MEMORY = 1000


class LanePolicy(StrEnum):
    """What a lane does when one of its items fails permanently."""

    # Stop; the operator redrives the head item (the lane runs it again) or skips it.
    HALT = "halt"
    # Record the failure (the item stays in the dead letters) and move on to the next item.
    SKIP = "skip"


class LaneStatus(StrEnum):
    """`LaneState` search attribute and the view's `status`."""

    RUNNING = "running"  # an item is being delivered
    IDLE = "idle"  # nothing waiting; the lane ends after its idle time
    HALTED = "halted"  # the head item failed and the policy is `halt`


class AppendOutcome(StrEnum):
    """What the lane did with one append (the API's 202 / 200 / 409)."""

    QUEUED = "queued"  # new: waiting in the lane, or already running
    DUPLICATE = "duplicate"  # the key was already in the lane with the same request
    CONFLICT = "conflict"  # the key was already in the lane with a different request
    UNKNOWN = "unknown"  # the lane has no record of this append (not received yet)
    # Received and queued, not yet recorded in the read model: until it is, a continue-as-new
    # racing the append could still leave it behind, so the caller asks again.
    PENDING = "pending"


@dataclass
class LaneAppend:
    """Input of the `append` signal: one item for the lane, and the id of this append."""

    item: OutboxItemInput
    # Unique per enqueue request, so the caller can ask what became of its own append.
    append_id: str
    # The outbox's lane policy at enqueue time; the newest append's policy is the one in force.
    policy: LanePolicy = LanePolicy.HALT


@dataclass
class LaneEntry:
    """An item waiting in the lane (or running at its head), kept small: a lane carries every
    waiting item across continue-as-new, and the destination's policy is kept once per lane."""

    key: str
    destination: str
    payload: dict[str, Any]
    enqueued_at: datetime
    # Set when the item lowered its destination's attempt limit.
    max_attempts: int | None = None
    # How many times the item was redriven through the lane (its provider key changes each time).
    generation: int = 0
    # The events the item's read model already holds (a redrive continues the numbering).
    last_event_seq: int = 0
    created_at: datetime | None = None


@dataclass
class RedriveHead:
    """Input of `redrive_head`: the failed head item runs again with this delivery policy."""

    key: str
    # The destination's current policy (a redrive picks up a fixed configuration).
    policy: DeliveryPolicy | None = None
    # The newest event the read model holds for the item: the new run continues after it (a
    # terminated item could not attach its view to its failure).
    last_event_seq: int = 0


@dataclass
class SkipHead:
    """Input of `skip_head`: move past the failed head item; it stays failed."""

    key: str
    reason: Annotated[str, MaxLen(500)] = "skipped by operator"


@dataclass
class RemoveRequest:
    """Input of the `remove` update: cancel waiting items (one key, or all of a destination or
    all); a running or halted head item is never taken, it has its own workflow."""

    __pydantic_config__: ClassVar[dict[str, Any]] = {"extra": "forbid"}

    key: str | None = None
    destination: str | None = None
    reason: Annotated[str, MaxLen(500)] = "cancelled by request"


@dataclass
class RemoveResult:
    """Keys the `remove` update took out of the lane, and their views (each now cancelled)."""

    removed: list[str] = field(default_factory=list)
    views: list[OutboxItemView] = field(default_factory=list)


@dataclass
class LaneView:
    """What the lane query, the API and the read model show of one lane.

    The single definition of a lane's public fields; the `outbox_lanes` table derives from it.
    """

    id: str = field(metadata={MAX_LENGTH: MAX_ITEM_ID_LENGTH})
    outbox: str = field(metadata={MAX_LENGTH: MAX_OUTBOX_LENGTH})
    ordering_key: str = field(metadata={MAX_LENGTH: MAX_KEY_LENGTH})
    status: LaneStatus = field(metadata={MAX_LENGTH: 16})
    policy: LanePolicy = field(metadata={MAX_LENGTH: 16})
    # Items in the lane: the head (running or halted) plus those waiting behind it.
    length: int = 0
    # What the lane carries of its items' keys and payloads (bounded by LANE_MAX_WAITING_BYTES).
    waiting_bytes: int = 0
    # The key of the item at the head: running, or failed and holding a halted lane.
    head_key: str | None = field(default=None, metadata={MAX_LENGTH: MAX_KEY_LENGTH})
    halted_reason: str | None = None
    halted_at: datetime | None = None
    # Items that left the lane, by how: sent, failed (and skipped past), cancelled.
    sent: int = 0
    failed: int = 0
    cancelled: int = 0
    updated_at: datetime | None = None
    # Counts every change; the read model's row only ever moves forward in it.
    version: int = 0


@dataclass
class LaneProjection:
    """Input of the lane's projection activity: its view, and the item transitions it made
    itself (waiting items enqueued or cancelled) not yet in the read model."""

    lane: LaneView
    items: list[ItemProjection] = field(default_factory=list)


@dataclass
class LaneDetail:
    """A lane's live view plus the keys waiting behind its head (the first
    `LANE_VIEW_WAITING`)."""

    view: LaneView
    waiting: list[str] = field(default_factory=list)


def entry_size(key: str, payload: dict[str, Any]) -> int:
    """The bytes a waiting item adds to what its lane carries (its key and JSON payload)."""
    return len(key.encode()) + len(json.dumps(payload, separators=(",", ":")).encode())


@dataclass
class LaneState:
    """Everything a lane carries across continue-as-new."""

    outbox: str
    ordering_key: str
    policy: LanePolicy = LanePolicy.HALT
    # The head (index 0, once started) and the waiting items, in the order they were received.
    entries: list[LaneEntry] = field(default_factory=list)
    head_started: bool = False
    halted_reason: str | None = None
    halted_at: datetime | None = None
    sent: int = 0
    failed: int = 0
    cancelled: int = 0
    version: int = 0
    # The newest delivery policy per destination (an entry refers to its destination's).
    policies: dict[str, DeliveryPolicy] = field(default_factory=dict)
    # Bytes of keys and payloads waiting: a lane carries them, so their total is bounded.
    waiting_bytes: int = 0
    # Seconds the lane stays open with nothing to do before it ends.
    idle_s: float = 300.0
    # The lane continues as new past this many history events (or when Temporal suggests it).
    continue_after_events: int = 10_000
    # Appends seen recently (append id -> outcome), so a caller can learn its own outcome.
    outcomes: dict[str, AppendOutcome] = field(default_factory=dict)
    # Keys recently run by this lane (key -> payload hash), to recognise a repeated append.
    recent_keys: dict[str, str] = field(default_factory=dict)
