"""The shipped definitions as plain functions: decide and evolve, no Temporal."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from aggregates import REGISTRY
from aggregates.definition import AggregateDefinition, Event, InvalidCommand
from aggregates.flight import (
    FlightNotOpen,
    FlightSeating,
    FlightState,
    PassengerNotSeated,
    SeatAssigned,
    SeatReleased,
    SeatTaken,
    UnknownSeat,
)
from aggregates.lock import LeaseExpired, Lock, LockHeld, LockState, NotHolder

NOW = datetime(2026, 11, 23, 12, tzinfo=UTC)


def run(definition: AggregateDefinition[Any], commands: list[tuple[str, dict[str, Any]]]) -> Any:
    """Fold the commands through decide and evolve, as the workflow does."""
    state = definition.initial_state()
    for name, payload in commands:
        for event in definition.decide(state, definition.parse_command(name, payload), NOW):
            state = definition.evolve(state, event)
    return state


def decide(
    definition: AggregateDefinition[Any], state: Any, name: str, payload: dict[str, Any]
) -> list[Event]:
    return definition.decide(state, definition.parse_command(name, payload), NOW)


FLIGHT = FlightSeating()
OPEN = ("open", {"seats": ["1A", "1B"]})


def test_a_seat_goes_to_one_passenger() -> None:
    state = run(FLIGHT, [OPEN, ("assign_seat", {"seat": "1A", "passenger_id": "p1"})])

    assert state == FlightState(opened=True, seats={"1A": "p1", "1B": None})
    with pytest.raises(SeatTaken):
        decide(FLIGHT, state, "assign_seat", {"seat": "1A", "passenger_id": "p2"})


def test_a_seated_passenger_assigned_elsewhere_is_moved() -> None:
    state = run(FLIGHT, [OPEN, ("assign_seat", {"seat": "1A", "passenger_id": "p1"})])

    events = decide(FLIGHT, state, "assign_seat", {"seat": "1B", "passenger_id": "p1"})

    assert events == [
        SeatReleased(seat="1A", passenger_id="p1"),
        SeatAssigned(seat="1B", passenger_id="p1"),
    ]


def test_refusals_are_named() -> None:
    closed = FLIGHT.initial_state()
    with pytest.raises(FlightNotOpen):
        decide(FLIGHT, closed, "assign_seat", {"seat": "1A", "passenger_id": "p1"})
    state = run(FLIGHT, [OPEN])
    with pytest.raises(UnknownSeat):
        decide(FLIGHT, state, "release_seat", {"seat": "7F"})
    with pytest.raises(PassengerNotSeated):
        decide(FLIGHT, state, "move_seat", {"passenger_id": "p9", "to": "1A"})
    with pytest.raises(InvalidCommand):
        decide(FLIGHT, closed, "open", {"seats": ["1A", "1A"]})


def test_repeats_change_nothing() -> None:
    state = run(FLIGHT, [OPEN, ("assign_seat", {"seat": "1A", "passenger_id": "p1"})])

    assert decide(FLIGHT, state, "assign_seat", {"seat": "1A", "passenger_id": "p1"}) == []
    assert decide(FLIGHT, state, "release_seat", {"seat": "1B"}) == []


LOCK = Lock()


def test_lock_is_held_until_released_or_expired() -> None:
    state = run(LOCK, [("acquire", {"holder": "h1", "ttl_s": 30})])

    assert state == LockState(holder="h1", until=NOW + timedelta(seconds=30))
    with pytest.raises(LockHeld):
        decide(LOCK, state, "acquire", {"holder": "h2", "ttl_s": 30})
    with pytest.raises(NotHolder):
        decide(LOCK, state, "release", {"holder": "h2"})
    [timer] = LOCK.timers(state)
    assert timer.at == NOW + timedelta(seconds=30) and timer.command == "expire"
    assert decide(LOCK, state, "expire", dict(timer.payload)) == [LeaseExpired(holder="h1")]


def test_an_expiry_for_a_renewed_lease_changes_nothing() -> None:
    state = run(LOCK, [("acquire", {"holder": "h1", "ttl_s": 30})])
    [old_timer] = LOCK.timers(state)
    later = LOCK.evolve(state, decide(LOCK, state, "renew", {"holder": "h1", "ttl_s": 60})[0])

    assert decide(LOCK, later, "expire", dict(old_timer.payload)) == []


def test_registry_holds_the_examples_by_type_name() -> None:
    assert set(REGISTRY) == {"flight", "labour", "lock"}
    for name, definition in REGISTRY.items():
        assert definition.type_name == name
        assert all(event.__name__[0].isupper() for event in definition.events)
