"""The flight definition as plain functions: decide and evolve, no Temporal."""

from __future__ import annotations

import pytest
from durable_outbox_temporal.aggregate_definition import InvalidCommand

from examples.flight.domainmodel import (
    FlightNotOpen,
    FlightSeating,
    FlightState,
    PassengerNotSeated,
    SeatAssigned,
    SeatReleased,
    SeatTaken,
    UnknownSeat,
)
from examples.testing import decide, run

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
