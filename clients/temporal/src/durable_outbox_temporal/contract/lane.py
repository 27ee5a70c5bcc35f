"""The ordering lane's contract: its names, its signal, update and query payloads, its view.

A lane delivers the items of one ordering key strictly one after another, in the order it
received them. In item mode a lane has a workflow of its own (`lane/{outbox}/{ordering_key}`);
in bulk mode it lives in the shard of its destination that owns the key
(`durable_outbox_temporal.contract.bulk`). Either way its host runs each item's delivery state
machine itself, and each item's story is in the read model. Plain data only, so the workflows, the
client, the API and the read model can all import it.
"""

# No `from __future__ import annotations`: Temporal's converter reads real annotations.
import json
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, ClassVar

from annotated_types import MaxLen

from durable_outbox_temporal.contract.item import (
    MAX_LENGTH,
    DeliveryPolicy,
    ItemProjection,
    OutboxItemInput,
    OutboxItemState,
    OutboxItemView,
)
from durable_outbox_temporal.contract.limits import (
    MAX_DESTINATION_LENGTH,
    MAX_ITEM_ID_LENGTH,
    MAX_KEY_LENGTH,
    MAX_OUTBOX_LENGTH,
)

LANE_WORKFLOW_TYPE = "OutboxLane"
# Update: append a batch of items, answered with what became of each (sent with
# update-with-start, so the first append starts the lane).
APPEND_UPDATE = "append_items"
# The same batch as a signal, for when no worker answers the update in time: the server records
# it, and the lane takes it when a worker returns.
APPEND_SIGNAL = "append_items_unconfirmed"
# Signals an operator sends to a halted lane: run the failed head item again, or move past it.
REDRIVE_HEAD_SIGNAL = "redrive_head"
SKIP_HEAD_SIGNAL = "skip_head"
# Update: take waiting items out of the lane (cancel one, or purge), answered with what it took.
REMOVE_UPDATE = "remove"
# Query: a lane's view (the argument names the lane; empty: the workflow's only lane).
LANE_QUERY = "lane"

PROJECT_LANES_ACTIVITY = "project_lanes"

# Waiting items listed in the lane's view and current details (the rest are only counted).
LANE_VIEW_WAITING = 20
# A lane carries its waiting items across continue-as-new in one Temporal payload, which the
# server caps at 2 MB, and its next run reads them all in its first workflow task: past this
# many bytes waiting (keys, payloads and `LANE_ENTRY_BYTES` for each item), appends are refused
# (429) until the lane drains. The margin covers appends racing the check.
LANE_MAX_WAITING_BYTES = 1_000_000
# What a waiting item carries besides its key and payload: its entry's other fields as JSON
# (220 to 250 bytes with a destination name of 20 characters). Counted, so that a lane of many
# tiny items is bounded too: with keys and payloads alone counted, a lane of 50,000 items of 20
# bytes each was within the cap and carried 12 MB.
LANE_ENTRY_BYTES = 250
# Items one append update carries at most (a client's batch is cut to this).
MAX_APPEND_BATCH = 100


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
    """What the lane did with one append (the API's 202 / 200 / 409 / 429)."""

    QUEUED = "queued"  # new: waiting in the lane, or already running
    DUPLICATE = "duplicate"  # the key was already in the lane (or just left it) with this request
    CONFLICT = "conflict"  # the key is in the lane with a different request
    FULL = "full"  # the lane carries `LANE_MAX_WAITING_BYTES` already: try again once it drains
    # Recorded by the server (the unconfirmed signal), not yet seen by a worker: no worker
    # answered in time. The lane takes it (or finds it a duplicate) when one returns.
    UNKNOWN = "unknown"


@dataclass
class LaneAppends:
    """Input of `append_items`: items for one lane, in order (each lands behind the ones before
    it), and the outbox's lane policy at enqueue time (the newest append's is the one in force)."""

    items: list[OutboxItemInput]
    policy: LanePolicy = LanePolicy.HALT
    # Each of the items' destinations' `lane_run` as configured now (a destination not named
    # keeps the one the lane has: 1 unless an earlier append said otherwise).
    lane_runs: dict[str, int] = field(default_factory=dict)


@dataclass
class LaneAppendsResult:
    """What became of each item of an `append_items` batch, in the batch's order."""

    outcomes: list[AppendOutcome]


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
    # Whoever enqueued it wrote its `queued` row (the service does): the lane need not.
    enqueue_projected: bool = False
    # The head's delivery state once it has begun, carried across continue-as-new.
    state: OutboxItemState | None = None


@dataclass
class RedriveHead:
    """Input of `redrive_head`: the failed head item runs again with this delivery policy."""

    key: str
    # The lane's ordering key (a shard holds many lanes; a lane's own workflow ignores it).
    ordering_key: str | None = None
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
    # The lane's ordering key (a shard holds many lanes; a lane's own workflow ignores it).
    ordering_key: str | None = None


@dataclass
class RemoveRequest:
    """Input of the `remove` update: cancel waiting items (one key, or all of a destination or
    all). A head item is cancelled only when named by `key` and not yet handed to the provider
    (it may be backing off); a purge never takes a head, the item cancel does."""

    __pydantic_config__: ClassVar[dict[str, Any]] = {"extra": "forbid"}

    key: str | None = None
    destination: str | None = None
    reason: Annotated[str, MaxLen(500)] = "cancelled by request"
    # The lane's outbox and ordering key, in a shard (which holds many lanes); None: all of the
    # workflow's lanes (a lane's own workflow has one).
    outbox: str | None = None
    ordering_key: str | None = None


@dataclass
class RemoveResult:
    """Keys the `remove` update took out of the lane, and their views (each now cancelled);
    `head`: the view of the item named by `key` when it is at the head and the provider has it
    (too late to cancel)."""

    removed: list[str] = field(default_factory=list)
    views: list[OutboxItemView] = field(default_factory=list)
    head: OutboxItemView | None = None


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
    # The bulk-mode destination whose shard holds the lane; None for a lane of its own (item
    # mode), whose items may go to several destinations.
    destination: str | None = field(default=None, metadata={MAX_LENGTH: MAX_DESTINATION_LENGTH})
    halted_reason: str | None = None
    halted_at: datetime | None = None
    # Items that left the lane, by how: sent, failed (and skipped past), cancelled.
    sent: int = 0
    failed: int = 0
    cancelled: int = 0
    updated_at: datetime | None = None
    # Counts every change, from the microseconds since the epoch when the lane (re)started: the
    # read model's row only ever moves forward in it, across a lane's ends and new starts.
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
    """The bytes of a waiting item's key and JSON payload (a lane's `waiting_bytes` adds them)."""
    return len(key.encode()) + len(json.dumps(payload, separators=(",", ":")).encode())


def over_capacity(waiting_bytes: int, waiting: int, size: int) -> bool:
    """Whether one more item of `size` (`entry_size`) takes a lane holding `waiting` items of
    `waiting_bytes` past what it may carry."""
    carried = waiting_bytes + size + (waiting + 1) * LANE_ENTRY_BYTES
    return carried > LANE_MAX_WAITING_BYTES


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
    # The bulk-mode destination whose shard holds the lane (None: the lane's own workflow).
    destination: str | None = None
