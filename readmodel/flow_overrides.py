"""Flow-control rules changed at run time (`PATCH /v1/destinations/{name}` with `flow`), kept in
the read model's database so that every worker process applies them and they outlive restarts.

A row per destination and field of its `FlowPolicy`
(`durable_outbox_temporal.contract.flow_policy.RUN_TIME_FIELDS`); a field without a row is the
destinations file's. Each worker process reads them again at most every `REFRESH_S`
(`FlowPolicies`), so a change is in force everywhere within a few seconds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from durable_outbox_temporal.contract.flow_policy import FlowPolicy
from pydantic import ValidationError
from sqlalchemy import Engine, delete, insert, select
from sqlalchemy.exc import SQLAlchemyError

from readmodel.models import FLOW_OVERRIDES

log = logging.getLogger("outbox.flow")

# How stale a worker's view of the overrides may be, in seconds.
REFRESH_S = 2.0


@dataclass(frozen=True)
class FieldOverride:
    """A field's value set at run time, and when."""

    value: Any
    changed_at: datetime


Overrides = dict[str, dict[str, FieldOverride]]


def read_overrides(engine: Engine, destination: str | None = None) -> Overrides:
    """Destination -> field -> its override (one destination's only, when given)."""
    query = select(FLOW_OVERRIDES)
    if destination is not None:
        query = query.where(FLOW_OVERRIDES.c.destination == destination)
    found: Overrides = {}
    with engine.connect() as connection:
        for row in connection.execute(query).mappings():
            found.setdefault(row["destination"], {})[row["field"]] = FieldOverride(
                row["value"], row["changed_at"]
            )
    return found


def write_overrides(
    engine: Engine, destination: str, changes: Mapping[str, Any], now: datetime
) -> None:
    """Set each field of `changes` for `destination`, in one transaction; a None value removes
    its override (the file's value is in force again)."""
    with engine.begin() as connection:
        for field, value in changes.items():
            connection.execute(
                delete(FLOW_OVERRIDES).where(
                    FLOW_OVERRIDES.c.destination == destination, FLOW_OVERRIDES.c.field == field
                )
            )
            if value is not None:
                connection.execute(
                    insert(FLOW_OVERRIDES).values(
                        destination=destination, field=field, value=value, changed_at=now
                    )
                )


def in_force(configured: FlowPolicy, overrides: Mapping[str, FieldOverride]) -> FlowPolicy:
    """`configured` with the overrides that are still valid in place (a stored value a newer
    release no longer accepts is logged and left out, not a reason to stop delivering)."""
    values = {field: found.value for field, found in overrides.items()}
    try:
        return configured.overridden(values)
    except ValidationError:
        policy = configured
        for field, value in values.items():
            try:
                policy = policy.overridden({field: value})
            except ValidationError as err:
                log.warning("flow override %s=%r left out: %s", field, value, err)
        return policy


class FlowPolicies:
    """One per worker process: each destination's flow policy in force (its configured one with
    the run-time overrides), read again at most every `refresh_s`. While the database cannot be
    read, the last policy known stays in force."""

    def __init__(
        self,
        engine: Engine,
        configured: Mapping[str, FlowPolicy],
        refresh_s: float = REFRESH_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._engine = engine
        self._configured = dict(configured)
        self._policies = dict(configured)
        self._refresh_s = refresh_s
        self._clock = clock
        self._read_at: float | None = None
        self._reading: asyncio.Task[None] | None = None
        self._failing = False

    def current(self, destination: str) -> FlowPolicy | None:
        """The policy last read (None: not a destination of this process); a stale one starts
        a read in the background, so the next caller sees it."""
        if self._stale():
            self._start_reading()
        return self._policies.get(destination)

    async def fresh(self, destination: str) -> FlowPolicy | None:
        """The policy in force, read again first if the last read is stale. Once the last read
        is half that old, the next one starts in the background: while requests keep coming,
        none waits for a read. Why: docs/decisions/flow-policies-read-ahead.md"""
        if self._stale():
            reading = self._start_reading()
            if reading is not None:
                await asyncio.shield(reading)
        elif self._stale(self._refresh_s / 2):
            self._start_reading()
        return self._policies.get(destination)

    def _stale(self, after_s: float | None = None) -> bool:
        age = None if self._read_at is None else self._clock() - self._read_at
        return age is None or age >= (self._refresh_s if after_s is None else after_s)

    def _start_reading(self) -> asyncio.Task[None] | None:
        if self._reading is None or self._reading.done():
            try:
                self._reading = asyncio.get_running_loop().create_task(self._read())
            except RuntimeError:
                return None  # no event loop (a synchronous caller): the last policy stands
        return self._reading

    async def _read(self) -> None:
        try:
            overrides = await asyncio.to_thread(read_overrides, self._engine)
        except SQLAlchemyError as err:
            if not self._failing:
                log.warning("flow overrides unreadable, the last known stay in force: %s", err)
            self._failing = True
            self._read_at = self._clock()  # ask again after `refresh_s`, not on every request
            return
        if self._failing:
            log.info("flow overrides readable again")
        self._failing = False
        self._policies = {
            name: in_force(policy, overrides.get(name, {}))
            for name, policy in self._configured.items()
        }
        self._read_at = self._clock()
