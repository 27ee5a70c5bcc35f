"""Why is this item waiting? Gathers what holds a queued item (its destination's state, its
lane) for the rule in `flowcontrol/waiting.py`."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime

from durable_outbox_temporal import OutboxClient, UnknownDestination, is_temporal_unavailable
from durable_outbox_temporal.contract.item import ItemStatus, OutboxItemView
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError
from temporalio.service import RPCError, RPCStatusCode

from flowcontrol.waiting import (
    DestinationHold,
    LanePlace,
    WaitingOn,
    in_debounce_window,
    waiting_on,
)
from readmodel.backlog import queued_ahead
from service.destinations import DestinationControls

log = logging.getLogger("outbox.service")


async def explain(
    view: OutboxItemView,
    controls: DestinationControls,
    client: OutboxClient,
    engine: Engine | None = None,
) -> list[WaitingOn] | None:
    """The reasons a queued item waits; None for any other item, and when Temporal cannot say
    now (a read never fails for the want of its explanation). With the read model's `engine`,
    an item waiting its turn at the rate says about when it comes."""
    if view.status is not ItemStatus.QUEUED:
        return None
    if view.debounce_key is not None:
        window = await _debounce_window(client, view)
        if window is not None:
            return [window]
    try:
        state = await controls.state(view.destination)
        lane = None
        if view.ordering_key is not None:
            lane = await _lane_place(client, view)
    except UnknownDestination:
        return None  # a destination no longer configured: nothing to say of its queue
    except Exception as err:
        # A server without task-queue config (the time-skipping test server) cannot say; nor
        # can Temporal while it is unreachable.
        unimplemented = isinstance(err, RPCError) and err.status == RPCStatusCode.UNIMPLEMENTED
        if not (unimplemented or is_temporal_unavailable(err)):
            raise
        log.warning("why %s waits: Temporal cannot say now (%s)", view.id, err)
        return None
    hold = DestinationHold(
        name=view.destination,
        paused=state.submit.paused,
        pause_reason=state.submit.pause_reason,
        paused_until=state.submit.paused_until,
        submit_rate=state.submit.rate,
        circuit_open_since=state.submit.circuit_open_since,
        disabled_since=state.submit.disabled_since,
        ahead=await _ahead(engine, view),
        held_by=await controls.holding(view.destination),
    )
    return waiting_on(view, datetime.now(UTC), hold, lane)


async def _debounce_window(client: OutboxClient, view: OutboxItemView) -> WaitingOn | None:
    """The open debounce window holding `view`; None when it holds it no more (or Temporal
    cannot say now)."""
    assert view.debounce_key is not None
    try:
        window = await client.debounce_window(view)
    except Exception as err:
        if not is_temporal_unavailable(err) and not isinstance(err, RPCError):
            raise
        log.warning("why %s waits: its debounce window cannot say now (%s)", view.id, err)
        return None
    if window is None or view.key not in window.keys:
        return None
    return in_debounce_window(view.debounce_key, len(window.keys), window.closes_at)


async def _ahead(engine: Engine | None, view: OutboxItemView) -> int | None:
    """Queued items of the destination ahead of `view`; None without the read model, or when
    it cannot say now."""
    if engine is None or view.created_at is None:
        return None
    try:
        return await asyncio.to_thread(_queued_ahead, engine, view.destination, view.created_at)
    except SQLAlchemyError as err:
        log.warning("why %s waits: the read model cannot say now (%s)", view.id, err)
        return None


def _queued_ahead(engine: Engine, destination: str, created_at: datetime) -> int:
    with engine.connect() as connection:
        return queued_ahead(connection, destination, created_at)


async def _lane_place(client: OutboxClient, view: OutboxItemView) -> LanePlace | None:
    assert view.ordering_key is not None
    detail = await client.lane(view.outbox, view.ordering_key, view.destination)
    if detail is None:
        return None
    if detail.view.head_key == view.key:
        return LanePlace(view.ordering_key, 0, detail.view.halted_reason)
    halted = detail.view.halted_reason
    if view.key in detail.waiting:
        ahead = 1 + detail.waiting.index(view.key)  # the head, then those before it
        return LanePlace(view.ordering_key, ahead, halted)
    return LanePlace(view.ordering_key, None, halted)
