"""A lock with a TTL lease: one holder at a time, until it releases the lock or its lease runs
out on a durable timer, whichever comes first (docs/explanation/seeds.md)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated

from durable_outbox_temporal.aggregate_definition import (
    AggregateDefinition,
    Command,
    Conflict,
    Event,
    Projector,
    Timer,
)
from pydantic import BaseModel, Field, StringConstraints

HolderId = Annotated[str, StringConstraints(min_length=1, max_length=200)]
# A year: a longer lease is a lock nobody meant to hold.
MAX_TTL_S = 365 * 24 * 3600


class LockHeld(Conflict):
    """Another holder has the lock."""


class NotHolder(Conflict):
    """Only the current holder renews or releases."""


class Acquire(Command):
    holder: HolderId
    ttl_s: float = Field(gt=0, le=MAX_TTL_S)


class Renew(Command):
    holder: HolderId
    ttl_s: float = Field(gt=0, le=MAX_TTL_S)


class Release(Command):
    holder: HolderId


class Expire(Command):
    """Sent by the lease's timer; a lease renewed meanwhile is not expired."""

    lease_until: datetime


class LockAcquired(Event):
    holder: str
    until: datetime


class LeaseRenewed(Event):
    holder: str
    until: datetime


class LockReleased(Event):
    holder: str


class LeaseExpired(Event):
    holder: str


class LockState(BaseModel):
    holder: str | None = None
    until: datetime | None = None


def _holders(history: list[str], event: Event) -> list[str]:
    return [*history, event.holder][-100:] if isinstance(event, LockAcquired) else history


class Lock(AggregateDefinition[LockState]):
    type_name = "lock"
    state_model = LockState
    commands = {"acquire": Acquire, "renew": Renew, "release": Release, "expire": Expire}
    events = (LockAcquired, LeaseRenewed, LockReleased, LeaseExpired)
    projectors = {"holders": Projector(initial=list, apply=_holders)}

    def initial_state(self) -> LockState:
        return LockState()

    def decide(self, state: LockState, command: Command, now: datetime) -> list[Event]:
        match command:
            case Acquire(holder=holder, ttl_s=ttl_s):
                if state.holder is not None and state.holder != holder:
                    raise LockHeld(f"held by {state.holder} until {state.until}")
                until = now + timedelta(seconds=ttl_s)
                if state.holder == holder:
                    return [LeaseRenewed(holder=holder, until=until)]
                return [LockAcquired(holder=holder, until=until)]
            case Renew(holder=holder, ttl_s=ttl_s):
                self._check_holder(state, holder)
                return [LeaseRenewed(holder=holder, until=now + timedelta(seconds=ttl_s))]
            case Release(holder=holder):
                self._check_holder(state, holder)
                return [LockReleased(holder=holder)]
            case Expire(lease_until=lease_until):
                if state.holder is None or state.until != lease_until:
                    return []  # released or renewed since the timer was set
                return [LeaseExpired(holder=state.holder)]
        raise Conflict(f"lock does not handle {type(command).__name__}")

    def evolve(self, state: LockState, event: Event) -> LockState:
        match event:
            case (
                LockAcquired(holder=holder, until=until) | LeaseRenewed(holder=holder, until=until)
            ):
                return LockState(holder=holder, until=until)
            case LockReleased() | LeaseExpired():
                return LockState()
        return state

    def timers(self, state: LockState) -> list[Timer]:
        if state.holder is None or state.until is None:
            return []
        return [Timer(at=state.until, command="expire", payload={"lease_until": state.until})]

    @staticmethod
    def _check_holder(state: LockState, holder: str) -> None:
        if state.holder != holder:
            raise NotHolder(f"{holder} does not hold the lock")
