"""Flight seating: one aggregate per flight; a seat has one passenger at most.

The Durable Object example's point (docs/explanation/seeds.md) survives the move to Temporal:
`decide` reads the seat and the workflow appends the assignment with no `await` in between, so
two passengers can never be given one seat.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from durable_outbox_temporal.aggregate_definition import (
    AggregateDefinition,
    Command,
    Conflict,
    Event,
    InvalidCommand,
    Projector,
)
from pydantic import BaseModel, Field, StringConstraints

SeatId = Annotated[str, StringConstraints(min_length=1, max_length=8, pattern=r"^[0-9A-Za-z]+$")]
PassengerId = Annotated[str, StringConstraints(min_length=1, max_length=100)]


class UnknownSeat(InvalidCommand):
    """The flight has no such seat."""


class SeatTaken(Conflict):
    """Another passenger already holds the seat."""


class FlightNotOpen(Conflict):
    """Seats are assigned only once the flight is open."""


class FlightAlreadyOpen(Conflict):
    """A flight opens once."""


class PassengerNotSeated(Conflict):
    """The passenger has no seat to move from."""


# Commands: verbs, as the API names them.


class OpenFlight(Command):
    seats: list[SeatId] = Field(min_length=1, max_length=1000)


class AssignSeat(Command):
    seat: SeatId
    passenger_id: PassengerId


class MoveSeat(Command):
    passenger_id: PassengerId
    to: SeatId


class ReleaseSeat(Command):
    seat: SeatId


# Events: facts, in the past tense.


class FlightOpened(Event):
    seats: list[str]


class SeatAssigned(Event):
    seat: str
    passenger_id: str


class SeatReleased(Event):
    seat: str
    passenger_id: str


class FlightState(BaseModel):
    opened: bool = False
    # Seat -> passenger (None: free), in the order the flight was opened with.
    seats: dict[str, str | None] = Field(default_factory=dict)


def _count_assignments(count: int, event: Event) -> int:
    return count + 1 if isinstance(event, SeatAssigned) else count


class FlightSeating(AggregateDefinition[FlightState]):
    type_name = "flight"
    state_model = FlightState
    commands = {
        "open": OpenFlight,
        "assign_seat": AssignSeat,
        "move_seat": MoveSeat,
        "release_seat": ReleaseSeat,
    }
    events = (FlightOpened, SeatAssigned, SeatReleased)
    projectors = {"assignments": Projector(initial=lambda: 0, apply=_count_assignments)}

    def initial_state(self) -> FlightState:
        return FlightState()

    def decide(self, state: FlightState, command: Command, now: datetime) -> list[Event]:
        match command:
            case OpenFlight(seats=seats):
                if state.opened:
                    raise FlightAlreadyOpen("the flight is already open")
                if len(set(seats)) != len(seats):
                    raise InvalidCommand("seats: each seat once")
                return [FlightOpened(seats=seats)]
            case AssignSeat(seat=seat, passenger_id=passenger):
                self._check_free(state, seat, passenger)
                if state.seats[seat] == passenger:
                    return []  # already there: nothing happens
                # A passenger seated elsewhere is moved, not seated twice.
                return [
                    *self._unseat(state, passenger),
                    SeatAssigned(seat=seat, passenger_id=passenger),
                ]
            case MoveSeat(passenger_id=passenger, to=seat):
                if passenger not in state.seats.values():
                    raise PassengerNotSeated(f"passenger {passenger} has no seat")
                self._check_free(state, seat, passenger)
                if state.seats[seat] == passenger:
                    return []
                return [
                    *self._unseat(state, passenger),
                    SeatAssigned(seat=seat, passenger_id=passenger),
                ]
            case ReleaseSeat(seat=seat):
                self._check_open(state, seat)
                holder = state.seats[seat]
                return [] if holder is None else [SeatReleased(seat=seat, passenger_id=holder)]
        raise InvalidCommand(f"flight does not handle {type(command).__name__}")

    def evolve(self, state: FlightState, event: Event) -> FlightState:
        match event:
            case FlightOpened(seats=seats):
                return FlightState(opened=True, seats=dict.fromkeys(seats))
            case SeatAssigned(seat=seat, passenger_id=passenger):
                return state.model_copy(update={"seats": {**state.seats, seat: passenger}})
            case SeatReleased(seat=seat):
                return state.model_copy(update={"seats": {**state.seats, seat: None}})
        return state

    @staticmethod
    def _check_open(state: FlightState, seat: str) -> None:
        if not state.opened:
            raise FlightNotOpen("the flight is not open yet")
        if seat not in state.seats:
            raise UnknownSeat(f"no such seat: {seat}")

    def _check_free(self, state: FlightState, seat: str, passenger: str) -> None:
        self._check_open(state, seat)
        holder = state.seats[seat]
        if holder is not None and holder != passenger:
            raise SeatTaken(f"seat {seat} is taken")

    @staticmethod
    def _unseat(state: FlightState, passenger: str) -> list[Event]:
        return [
            SeatReleased(seat=seat, passenger_id=passenger)
            for seat, holder in state.seats.items()
            if holder == passenger
        ]
