"""Why a queued item waits (flowcontrol/waiting.py): its own timers first, then its lane and its
destination, else its turn at the rate."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

from durable_outbox_temporal.contract.item import ItemStatus, OutboxItemView

from flowcontrol.waiting import DestinationHold, LanePlace, waiting_on

NOW = datetime(2026, 11, 26, 20, 0, tzinfo=UTC)
OPEN = DestinationHold("hook", paused=False, pause_reason=None, paused_until=None, submit_rate=5)


def view(**changes: Any) -> OutboxItemView:
    base = OutboxItemView(
        id="outbox/o/k",
        outbox="o",
        key="k",
        destination="hook",
        status=ItemStatus.QUEUED,
    )
    return dataclasses.replace(base, **changes)


def reasons(
    item: OutboxItemView, hold: DestinationHold = OPEN, lane: LanePlace | None = None
) -> list[tuple[str, datetime | None]]:
    return [(w.reason, w.until) for w in waiting_on(item, NOW, hold, lane)]


def test_an_item_with_nothing_holding_it_waits_for_its_turn_at_the_rate() -> None:
    [only] = waiting_on(view(), NOW, OPEN, None)
    assert only.reason == "rate" and "5 submits/s" in only.detail
    assert only.until is None  # the queue ahead not known


def test_the_queue_ahead_gives_an_estimate_at_the_rate() -> None:
    [only] = waiting_on(view(), NOW, dataclasses.replace(OPEN, ahead=40), None)
    assert only.reason == "rate" and only.until == NOW + timedelta(seconds=8)
    assert "40 items ahead, about 8 s" in only.detail
    # Paused by hand: no estimate (the rate in force is 0).
    [held] = waiting_on(view(), NOW, dataclasses.replace(OPEN, ahead=40, submit_rate=0), None)
    assert held.until is None


def test_its_own_timers_come_first_with_their_end() -> None:
    later = NOW + timedelta(minutes=5)
    assert reasons(view(next_attempt_at=later)) == [("not_before", later)]
    assert reasons(view(next_attempt_at=later, attempts=2, last_error="HTTP 503")) == [
        ("backoff", later)
    ]
    assert reasons(view(next_attempt_at=NOW - timedelta(seconds=1))) == [("rate", None)]


def test_a_paused_or_throttled_destination_and_a_lane_say_so() -> None:
    until = NOW + timedelta(seconds=4)
    throttled = dataclasses.replace(OPEN, paused=True, pause_reason="throttled", paused_until=until)
    paused = dataclasses.replace(OPEN, paused=True, pause_reason="receiver migrating")
    assert reasons(view(), throttled) == [("throttled", until)]
    [held] = waiting_on(view(), NOW, paused, None)
    assert held.reason == "destination_paused" and "receiver migrating" in held.detail
    [behind] = waiting_on(view(ordering_key="c7"), NOW, OPEN, LanePlace("c7", 3))
    assert behind.reason == "lane" and "behind 3 items in lane c7" in behind.detail
    [halted] = waiting_on(view(ordering_key="c7"), NOW, OPEN, LanePlace("c7", 0, "HTTP 400"))
    assert "halted: HTTP 400" in halted.detail
    assert reasons(view(ordering_key="c7"), OPEN, LanePlace("c7", 0)) == [("rate", None)]


def test_an_open_circuit_says_so_and_since_when() -> None:
    since = NOW - timedelta(seconds=20)
    circuit = dataclasses.replace(
        OPEN, paused=True, pause_reason="circuit open since ...", circuit_open_since=since
    )
    [held] = waiting_on(view(), NOW, circuit, None)
    assert held.reason == "circuit_open" and held.until is None
    assert since.isoformat() in held.detail and "closes when a probe succeeds" in held.detail


def test_only_a_queued_item_waits() -> None:
    assert waiting_on(view(status=ItemStatus.SENDING), NOW, OPEN, None) == []


def test_a_held_item_names_the_cap_or_quota_that_holds_it() -> None:
    caps = [f"the concurrency cap of key {k!r} (1 out at once)" for k in "abcd"]
    hold = dataclasses.replace(OPEN, held_by=caps)
    retry = NOW + timedelta(seconds=0.5)
    [held] = waiting_on(view(attempts=1, next_attempt_at=retry), NOW, hold, None)
    assert held.reason == "held" and held.until == retry
    assert "key 'a'" in held.detail and "key 'c'" in held.detail and "1 more" in held.detail
    assert "asks again with backoff" in held.detail
    # A retry after an error is its backoff, whatever caps are full.
    assert reasons(view(attempts=1, next_attempt_at=retry, last_error="HTTP 500"), hold) == [
        ("backoff", retry)
    ]
    # On no timer: its submit may be waiting for room, then its turn at the rate.
    assert reasons(view(), hold) == [("held", None), ("rate", None)]
    assert reasons(view()) == [("rate", None)]
