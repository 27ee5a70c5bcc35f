"""Rule: say why a queued item has not gone yet, and when it will where that can be known.

Pure: the caller gathers what holds the item (its own timers, its destination's pause, throttle
or open circuit, its lane) and this orders the answer, the item's own reasons first. An item
with none of them is waiting for its turn at the destination's rate.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal

from durable_outbox_temporal.contract.item import ItemStatus, OutboxItemView

Reason = Literal[
    "debounce",
    "not_before",
    "backoff",
    "held",
    "throttled",
    "circuit_open",
    "destination_disabled",
    "destination_paused",
    "lane",
    "rate",
]
# The caps and quotas a `held` reason names at most.
_HELD_SHOWN = 3


@dataclass
class WaitingOn:
    """One thing that holds a queued item, and until when if known."""

    reason: Reason
    detail: str
    until: datetime | None = None


@dataclass
class DestinationHold:
    """What the destination's submit queue holds its items to now."""

    name: str
    paused: bool
    pause_reason: str | None
    # A throttle's pause: it ends by itself then.
    paused_until: datetime | None
    submit_rate: float
    # An open circuit's pause (`flowcontrol.breaker`): it ends when probes succeed.
    circuit_open_since: datetime | None = None
    # Disabled after failing too long (`flowcontrol.disable`): until an operator re-enables it.
    disabled_since: datetime | None = None
    # Queued items of the destination ahead of this one (None: not known), for an estimate.
    ahead: int | None = None
    # Its caps and quotas full now, in words (`flowcontrol/caps.py`): what holds a held item.
    held_by: list[str] = field(default_factory=list)


@dataclass
class LanePlace:
    """Where the item stands in its ordering lane: `ahead` items go before it (None: more than
    the lane shows)."""

    ordering_key: str
    ahead: int | None
    halted: str | None = None


def in_debounce_window(debounce_key: str, members: int, closes_at: datetime | None) -> WaitingOn:
    """A member of an open debounce window (`durable_outbox_temporal/contract/debounce_rules.py`):
    nothing else holds it
    until the window closes and its carrier goes (then the carrier's own reasons apply)."""
    return WaitingOn(
        "debounce", f"debounce window {debounce_key} ({members} items): it closes at", closes_at
    )


def waiting_on(
    view: OutboxItemView, now: datetime, destination: DestinationHold, lane: LanePlace | None
) -> list[WaitingOn]:
    """Why `view` (a queued item) has not gone yet; empty for any other status."""
    if view.status is not ItemStatus.QUEUED:
        return []
    found: list[WaitingOn] = []
    if view.next_attempt_at is not None and view.next_attempt_at > now:
        if destination.held_by and view.last_error is None:
            # A held wait records no error (a backoff always has one): a full cap or quota.
            found.append(_held(destination.held_by, view.next_attempt_at))
        elif view.attempts == 0:
            found.append(WaitingOn("not_before", "delivered no earlier than", view.next_attempt_at))
        else:
            error = f" after: {view.last_error}" if view.last_error else ""
            found.append(WaitingOn("backoff", f"retrying{error}", view.next_attempt_at))
    if lane is not None and lane.halted is not None:
        found.append(WaitingOn("lane", f"lane {lane.ordering_key} is halted: {lane.halted}"))
    elif lane is not None and lane.ahead != 0:
        ahead = "more items than the lane shows" if lane.ahead is None else f"{lane.ahead} items"
        found.append(WaitingOn("lane", f"behind {ahead} in lane {lane.ordering_key}"))
    if destination.paused_until is not None:
        found.append(
            WaitingOn(
                "throttled",
                f"destination {destination.name} is throttled by its provider",
                destination.paused_until,
            )
        )
    elif destination.circuit_open_since is not None:
        since = destination.circuit_open_since.isoformat()
        found.append(
            WaitingOn(
                "circuit_open",
                f"destination {destination.name}'s circuit is open since {since}: its submits"
                " kept failing; it closes when a probe succeeds",
            )
        )
    elif destination.disabled_since is not None:
        since = destination.disabled_since.isoformat()
        found.append(
            WaitingOn(
                "destination_disabled",
                f"destination {destination.name} is disabled since {since}: it failed too long;"
                ' an operator re-enables it (PATCH {"enabled": true})',
            )
        )
    elif destination.paused:
        reason = destination.pause_reason or "paused"
        found.append(
            WaitingOn("destination_paused", f"destination {destination.name} is paused: {reason}")
        )
    if not found:
        if destination.held_by:
            # Its submit may be waiting for room within its activity, before any hold.
            found.append(_held(destination.held_by, None))
        found.append(_its_turn(destination, now))
    return found


def _held(held_by: list[str], until: datetime | None) -> WaitingOn:
    """Held by full caps or quotas: until its next ask (`until`), or, on no timer, full now
    while its submit waits for room."""
    shown = " and ".join(held_by[:_HELD_SHOWN])
    if len(held_by) > _HELD_SHOWN:
        shown += f" (and {len(held_by) - _HELD_SHOWN} more)"
    if until is None:
        return WaitingOn(
            "held", f"{shown} full now: its submit waits for room if it counts in them"
        )
    return WaitingOn(
        "held", f"held by {shown}: it asks again with backoff, spending no attempt", until
    )


def _its_turn(destination: DestinationHold, now: datetime) -> WaitingOn:
    """Waiting for its turn at the rate: with the queue ahead known, about when it comes (the
    items ahead at the rate in force; fairness between outboxes and priorities move it)."""
    rate = f"{destination.name}'s rate ({destination.submit_rate:g} submits/s)"
    if destination.ahead is None or destination.submit_rate <= 0:
        return WaitingOn("rate", f"its turn at {rate}")
    seconds = destination.ahead / destination.submit_rate
    return WaitingOn(
        "rate",
        f"its turn at {rate}: {destination.ahead} items ahead, about {seconds:.0f} s",
        now + timedelta(seconds=seconds),
    )
