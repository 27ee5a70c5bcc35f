"""The debounce window workflow's contract: its names and its typed inputs and outputs.

One `DebounceWindow` workflow per outbox, destination and debounce key
(`debounce/{outbox}/{destination}/{debounce_key}`) holds the items of the key's open window;
an enqueue joins it by update-with-start (`join`), a cancel takes an item out (`leave`). When
the window closes, the workflow hands its carrier to the item's usual placement and marks the
others superseded. Plain data only.
"""

# No `from __future__ import annotations`: Temporal's converter reads real annotations.
import dataclasses
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from durable_outbox_temporal.contract.item import OutboxItemInput, OutboxItemView

DEBOUNCE_WORKFLOW_TYPE = "DebounceWindow"
JOIN_UPDATE = "join"
LEAVE_UPDATE = "leave"
WINDOW_QUERY = "window"
CLOSE_WINDOW_ACTIVITY = "close_debounce_window"
CANCEL_MEMBER_ACTIVITY = "cancel_debounce_member"
# A collected carrier's payload holds the array under this member alone; the provider posts the
# array (`durable_outbox_temporal.contract.debounce_rules.delivered_body`). An enqueued payload may
# not use it.
COLLECTED_KEY = "$debounce_collected"

# What a window answers for one joining item: a new member; a member already (the same key and
# request: an idempotent repeat); the same key with another request; another mode than the
# window's.
JoinOutcome = Literal["created", "member", "conflict", "mode"]


def debounce_workflow_id(outbox: str, destination: str, debounce_key: str) -> str:
    """The one window workflow of a key: `debounce/{outbox}/{destination}/{debounce_key}`."""
    return f"debounce/{outbox}/{destination}/{debounce_key}"


@dataclass
class DebounceMember:
    """An item in a window, and when it joined (the workflow's clock)."""

    item: OutboxItemInput
    joined_at: datetime


@dataclass
class DebounceInput:
    """The window workflow's start: whose window it is, and the members carried across
    continue-as-new (empty at a first start)."""

    outbox: str
    destination: str
    debounce_key: str
    members: list[DebounceMember] = field(default_factory=list)
    # Windows this workflow closed, in this run and those before.
    closed: int = 0


@dataclass
class DebounceJoin:
    """Input of the `join` update: items of one key, in enqueue order."""

    items: list[OutboxItemInput]


@dataclass
class DebounceJoined:
    """One outcome per joining item, in order."""

    outcomes: list[JoinOutcome]


@dataclass
class DebounceLeave:
    """Input of the `leave` update: cancel the member with this key, if still in the window."""

    key: str
    reason: str = "cancelled by request"


@dataclass
class DebounceLeft:
    """The cancelled member's view; None when it is no member (its window closed)."""

    view: OutboxItemView | None = None


@dataclass
class DebounceWindowView:
    """The `window` query: the open window's members and when it closes (None: no open window,
    a carrier is being handed over)."""

    keys: list[str]
    mode: str | None = None
    opened_at: datetime | None = None
    closes_at: datetime | None = None


@dataclass
class DebounceClose:
    """Input of the closing activity: the carrier to hand over, and the members it carries
    (without their payloads: the read model holds them)."""

    carrier: OutboxItemInput
    superseded: list[OutboxItemInput]


@dataclass
class DebounceCancel:
    """Input of a member's cancel: the member (without its payload) and why."""

    item: OutboxItemInput
    reason: str


def without_payload(item: OutboxItemInput) -> OutboxItemInput:
    """A window's member as its read-model rows need it: the enqueuer's row holds the payload."""
    return dataclasses.replace(item, payload={}, state=None)
